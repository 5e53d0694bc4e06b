"""Cloud metadata watchers: AWS IMDSv2, GCP `instance/preempted`, Azure Scheduled Events.

Each speaks its cloud's documented protocol against a configurable endpoint (the link-local metadata
address by default). On another cloud or off-cloud the endpoint does not answer, or answers something
else: the watcher backs off quietly and asks again later.
"""

from __future__ import annotations

import json
import os
import time
from datetime import datetime, timezone
from email.utils import parsedate_to_datetime
from typing import Any

from .base import Notice, NotThisCloud, Watcher

DEFAULT_METADATA_URL = "http://169.254.169.254"
_DMI = "/sys/class/dmi/id"
_VENDORS = {"aws": ("amazon ec2", "amazon"), "gcp": ("google",), "azure": ("microsoft corporation",)}
_AZURE_ASSET_TAG = "7783-7084-3265-9085-8269-3286-77"


def host_cloud(dmi: str = _DMI) -> str | None:
    """Which cloud the firmware names (aws, gcp, azure, or "other"); None when it cannot be read.

    A local file read, so the watchers of other clouds need not probe the network to learn they do not apply.
    """
    facts = []
    for name in ("sys_vendor", "board_vendor", "bios_vendor", "product_name", "chassis_asset_tag"):
        try:
            with open(os.path.join(dmi, name), encoding="utf-8", errors="replace") as f:
                facts.append(f.read().strip().lower())
        except OSError:
            continue
    if not facts:
        return None
    if _AZURE_ASSET_TAG in facts:
        return "azure"
    for cloud, vendors in _VENDORS.items():
        if any(fact.startswith(vendor) for fact in facts for vendor in vendors):
            return cloud
    return "other"


def _iso_time(text: str | None) -> float | None:
    if not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).astimezone(timezone.utc).timestamp()
    except ValueError:
        return None


def _deadline(stated: float | None, window: float, now: float) -> float:
    """The time the cloud stated (at most `window` away; a few seconds if already past), else now + window."""
    if stated is None:
        return now + window
    return min(max(stated, now + 5.0), now + window)


class AwsWatcher(Watcher):
    """EC2 spot interruption notices and rebalance recommendations through IMDSv2 (a session token)."""

    name = "aws"
    TOKEN_TTL = 21600

    def __init__(self, *args: Any, window: float = 120.0, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.window = window
        self._token: str | None = None
        self._token_until = 0.0

    async def _get_token(self) -> str:
        if self._token and time.time() < self._token_until:
            return self._token
        r = await self.fetch("/latest/api/token", "PUT", {"X-aws-ec2-metadata-token-ttl-seconds": str(self.TOKEN_TTL)},
                             body="")
        if r.code != 200 or not r.body:
            raise NotThisCloud(f"token request answered {r.code}")
        self._token = r.body.decode().strip()
        self._token_until = time.time() + self.TOKEN_TTL - 60
        return self._token

    async def _get(self, path: str) -> Any:
        for _attempt in range(2):
            token = await self._get_token()
            r = await self.fetch(path, headers={"X-aws-ec2-metadata-token": token})
            if r.code == 401:  # the token expired or the service restarted: ask for a new one
                self._token = None
                continue
            if r.code == 404:
                return None
            if r.code != 200:
                raise NotThisCloud(f"{path} answered {r.code}")
            try:
                return json.loads(r.body)
            except ValueError:
                raise NotThisCloud(f"{path} answered something that is not JSON") from None
        raise NotThisCloud(f"{path} refused a fresh token")

    async def poll(self) -> list[Notice]:
        now = time.time()
        notices = []
        action = await self._get("/latest/meta-data/spot/instance-action")
        if isinstance(action, dict) and action.get("action"):
            stated = _iso_time(action.get("time"))
            notices.append(Notice(self.name, "spot-interruption", _deadline(stated, self.window, now), True,
                                  key=f"action:{action.get('action')}:{action.get('time')}", details=action))
        rebalance = await self._get("/latest/meta-data/events/recommendations/rebalance")
        if isinstance(rebalance, dict) and rebalance.get("noticeTime"):
            notices.append(Notice(self.name, "rebalance-recommendation", now + self.window, False,
                                  key=f"rebalance:{rebalance['noticeTime']}", details=rebalance))
        return notices


class GcpWatcher(Watcher):
    """`computeMetadata/v1/instance/preempted`, long-polled with `wait_for_change` (returns at once on change)."""

    name = "gcp"
    PATH = "/computeMetadata/v1/instance/preempted"

    def __init__(self, *args: Any, window: float = 30.0, long_poll_s: int = 60, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.window = window
        self.long_poll_s = long_poll_s
        self.poll_interval = 0.1  # the long poll itself paces the loop
        self._etag: str | None = None

    async def poll(self) -> list[Notice]:
        headers = {"Metadata-Flavor": "Google"}
        if self._etag is None:
            r = await self.fetch(self.PATH, headers=headers)
        else:
            r = await self.fetch(f"{self.PATH}?wait_for_change=true&last_etag={self._etag}"
                                 f"&timeout_sec={self.long_poll_s}", headers=headers, timeout=self.long_poll_s + 10)
        if r.code != 200 or r.headers.get("Metadata-Flavor") != "Google":
            self._etag = None
            raise NotThisCloud(f"preempted answered {r.code}")
        self._etag = r.headers.get("ETag") or self._etag
        if r.body.decode().strip().upper() == "TRUE":
            now = time.time()
            return [Notice(self.name, "preempted", now + self.window, True, key=f"preempted:{self._etag}")]
        return []


class AzureWatcher(Watcher):
    """Scheduled Events: a `Preempt` (or `Terminate`) of this VM; acknowledged once the final snapshot is in."""

    name = "azure"
    PATH = "/metadata/scheduledevents?api-version=2020-07-01"
    NAME_PATH = "/metadata/instance/compute/name?api-version=2021-02-01&format=text"
    FATAL = ("Preempt", "Terminate")

    def __init__(self, *args: Any, window: float = 30.0, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.window = window
        self.vm_name: str | None = None
        self.acknowledged: list[str] = []

    async def poll(self) -> list[Notice]:
        headers = {"Metadata": "true"}
        if self.vm_name is None:
            r = await self.fetch(self.NAME_PATH, headers=headers)
            if r.code == 200 and r.body:
                self.vm_name = r.body.decode().strip()
        r = await self.fetch(self.PATH, headers=headers)
        if r.code != 200:
            raise NotThisCloud(f"scheduledevents answered {r.code}")
        try:
            doc = json.loads(r.body)
            events = doc.get("Events") or []
        except (ValueError, AttributeError):
            raise NotThisCloud("scheduledevents answered something that is not its JSON") from None
        now = time.time()
        notices = []
        for event in events:
            if not isinstance(event, dict) or event.get("EventType") not in self.FATAL:
                continue
            resources = event.get("Resources") or []
            if self.vm_name and resources and self.vm_name not in resources:
                continue  # another VM of the same availability set or scale set
            stated = None
            try:
                stated = parsedate_to_datetime(event["NotBefore"]).timestamp() if event.get("NotBefore") else None
            except (TypeError, ValueError):
                stated = None
            notices.append(Notice(self.name, str(event["EventType"]), _deadline(stated, self.window, now), True,
                                  key=f"event:{event.get('EventId')}", details=event))
        return notices

    async def acknowledge(self, notice: Notice) -> None:
        """POST StartRequests with the EventId: the platform need not wait for NotBefore any longer."""
        event_id = notice.details.get("EventId")
        if not event_id:
            return
        r = await self.fetch(self.PATH, "POST", {"Metadata": "true", "Content-Type": "application/json"},
                             body=json.dumps({"StartRequests": [{"EventId": event_id}]}))
        if r.code // 100 == 2:
            self.acknowledged.append(event_id)
