"""Fake cloud metadata servers on 127.0.0.1, speaking each cloud's documented protocol.

- AWS IMDSv2: `PUT /latest/api/token` (needs `X-aws-ec2-metadata-token-ttl-seconds`), then GETs with
  `X-aws-ec2-metadata-token`; 401 without a valid token; `spot/instance-action` and
  `events/recommendations/rebalance` answer 404 until a notice is posted.
- GCP: `computeMetadata/v1/instance/preempted` needs `Metadata-Flavor: Google`, answers with that header
  and an ETag; `?wait_for_change=true&last_etag=E` holds the request until the value changes (or timeout_sec).
- Azure: `/metadata/scheduledevents?api-version=2020-07-01` needs `Metadata: true`; a POST of
  `{"StartRequests": [{"EventId": ...}]}` acknowledges an event; `/metadata/instance/compute/name` names the VM.

Never a real cloud address: tests point every watcher at these, or switch it off.
"""

from __future__ import annotations

import json
import secrets
import socket
import threading
import time
from email.utils import formatdate
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

WATCHER_ENV_OFF = {
    "SPOTWARP_AWS_METADATA_URL": "off",
    "SPOTWARP_GCP_METADATA_URL": "off",
    "SPOTWARP_AZURE_METADATA_URL": "off",
}


class FakeMetadata:
    """A threaded HTTP server on 127.0.0.1 that records every request it gets."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, str, dict[str, str]]] = []  # method, path, headers (lower-case names)
        self.changed = threading.Condition()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def _handle(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                outer.requests.append((self.command, self.path, {k.lower(): v for k, v in self.headers.items()}))
                code, headers, payload = outer.answer(self.command, self.path, self.headers, body)
                data = payload if isinstance(payload, bytes) else payload.encode()
                self.send_response(code)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_PUT = do_POST = _handle

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def answer(self, method: str, path: str, headers: Any, body: bytes) -> tuple[int, dict[str, str], str | bytes]:
        raise NotImplementedError

    def notify(self) -> None:
        with self.changed:
            self.changed.notify_all()

    def close(self) -> None:
        self.notify()
        self.server.shutdown()
        self.server.server_close()


class FakeAws(FakeMetadata):
    """EC2 instance metadata, IMDSv2 only."""

    def __init__(self) -> None:
        self.tokens: set[str] = set()
        self.instance_action: dict[str, str] | None = None
        self.rebalance: dict[str, str] | None = None
        super().__init__()

    def interrupt(self, seconds: float = 120, action: str = "terminate") -> None:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + seconds))
        self.instance_action = {"action": action, "time": stamp}

    def recommend_rebalance(self) -> None:
        self.rebalance = {"noticeTime": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}

    def expire_tokens(self) -> None:
        self.tokens.clear()

    def answer(self, method, path, headers, body):
        if path == "/latest/api/token":
            if method != "PUT" or not headers.get("X-aws-ec2-metadata-token-ttl-seconds"):
                return 400, {}, "Bad Request"
            token = secrets.token_urlsafe(24)
            self.tokens.add(token)
            return 200, {"Content-Type": "text/plain"}, token
        if headers.get("X-aws-ec2-metadata-token") not in self.tokens:
            return 401, {}, "Unauthorized"
        if path == "/latest/meta-data/spot/instance-action" and self.instance_action:
            return 200, {"Content-Type": "text/plain"}, json.dumps(self.instance_action)
        if path == "/latest/meta-data/events/recommendations/rebalance" and self.rebalance:
            return 200, {"Content-Type": "text/plain"}, json.dumps(self.rebalance)
        return 404, {"Content-Type": "text/html"}, "<html>404 - Not Found</html>"


class FakeGcp(FakeMetadata):
    """The GCE metadata server's `instance/preempted`, with ETags and `wait_for_change` long polls."""

    PATH = "/computeMetadata/v1/instance/preempted"

    def __init__(self) -> None:
        self.value = "FALSE"
        self.etag = secrets.token_hex(8)
        self.long_polls = 0
        super().__init__()

    def preempt(self) -> None:
        with self.changed:
            self.value, self.etag = "TRUE", secrets.token_hex(8)
            self.changed.notify_all()

    def answer(self, method, path, headers, body):
        parts = urlsplit(path)
        if headers.get("Metadata-Flavor") != "Google":
            return 403, {}, "Missing Metadata-Flavor:Google header."
        if parts.path != self.PATH:
            return 404, {"Metadata-Flavor": "Google"}, "not found"
        query = parse_qs(parts.query)
        if query.get("wait_for_change") == ["true"]:
            self.long_polls += 1
            last = (query.get("last_etag") or [None])[0]
            timeout = float((query.get("timeout_sec") or ["60"])[0])
            deadline = time.monotonic() + timeout
            with self.changed:
                while self.etag == last and time.monotonic() < deadline:
                    self.changed.wait(min(0.5, max(0.0, deadline - time.monotonic())))
        return 200, {"Metadata-Flavor": "Google", "ETag": self.etag, "Content-Type": "application/text"}, self.value


class FakeAzure(FakeMetadata):
    """Azure IMDS Scheduled Events, and the VM's name."""

    PATH = "/metadata/scheduledevents"

    def __init__(self, vm_name: str = "spot-vm-1") -> None:
        self.vm_name = vm_name
        self.incarnation = 1
        self.events: list[dict[str, Any]] = []
        self.acknowledged: list[str] = []
        super().__init__()

    def schedule(self, event_type: str = "Preempt", seconds: float = 30, resources: list[str] | None = None) -> str:
        event_id = f"{secrets.token_hex(4).upper()}-{secrets.token_hex(2).upper()}"
        self.events.append({
            "EventId": event_id, "EventStatus": "Scheduled", "EventType": event_type, "ResourceType": "VirtualMachine",
            "Resources": resources if resources is not None else [self.vm_name],
            "NotBefore": formatdate(time.time() + seconds, usegmt=True), "Description": "", "EventSource": "Platform",
            "DurationInSeconds": -1,
        })
        self.incarnation += 1
        return event_id

    def answer(self, method, path, headers, body):
        parts = urlsplit(path)
        if headers.get("Metadata") != "true":
            return 400, {"Content-Type": "application/json"}, json.dumps({"error": "Bad request. Required metadata header not specified"})
        query = parse_qs(parts.query)
        if parts.path == "/metadata/instance/compute/name" and query.get("format") == ["text"]:
            return 200, {"Content-Type": "text/plain"}, self.vm_name
        if parts.path != self.PATH or query.get("api-version") != ["2020-07-01"]:
            return 404, {}, "Not found"
        if method == "POST":
            requests = json.loads(body or b"{}").get("StartRequests") or []
            for item in requests:
                self.acknowledged.append(item["EventId"])
                for event in self.events:
                    if event["EventId"] == item["EventId"]:
                        event["EventStatus"] = "Started"
            self.incarnation += 1
            return 200, {}, ""
        return 200, {"Content-Type": "application/json"}, json.dumps(
            {"DocumentIncarnation": self.incarnation, "Events": self.events})


def dead_url() -> str:
    """A 127.0.0.1 address where nothing listens (connection refused at once)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"
