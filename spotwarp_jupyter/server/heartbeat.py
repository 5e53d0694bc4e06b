"""The server's heartbeat: its role under the lease, written into the store from a thread every few seconds.

Each beat reads the lease (a standby candidate reads it every 0.25 s between beats too), so a standby candidate
learns at once that it was promoted, and a host cut off from the
store learns, once it reaches it again, that it lost the lease. Transitions are handed to the event loop.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import threading
import time
from typing import Any, Callable

from ..engine.coordination import FENCED, HOLDER, SERVING, STANDBY, Fence, Fenced, host_id, read_lease, write_heartbeat
from ..engine.coordination.heartbeats import read_request
from ..engine.storage import Store

log = logging.getLogger("spotwarp")
STANDBY_POLL_S = 0.25  # how often a standby candidate reads the lease between beats (a promotion acts at once)


class Heartbeat:
    """Writes `hosts/<id>.json` every `interval` seconds and tracks this host's role."""

    def __init__(self, store: Store, fence: Fence, interval: float, info: dict[str, Any],
                 loop: asyncio.AbstractEventLoop, on_promoted: Callable[[], Any], on_fenced: Callable[[str], Any],
                 on_lease_lost: Callable[[str], Any] | None = None,
                 on_request: Callable[[dict[str, Any]], Any] | None = None):
        self.store = store
        self.fence = fence
        self.interval = interval
        self.info = info
        self.loop = loop
        self.on_promoted = on_promoted
        self.on_fenced = on_fenced
        self.on_lease_lost: Callable[[str], Any] = on_lease_lost or (lambda why: None)
        self.lease_lost: str | None = None  # why, once the lease that named this holder vanished
        self.on_request: Callable[[dict[str, Any]], Any] = on_request or (lambda doc: None)
        self.requests_seen: set[str] = set()
        self.id = host_id(fence.candidate, info.get("port"))
        self.role = STANDBY if fence.candidate else SERVING
        self.why: str | None = None
        self.ready_at = time.time()  # the extension starts once the server listens and its loop runs
        self.last_beat: float | None = None
        self.beats = 0  # the beat counter: the orchestrator judges silence by it changing, never by `time`
        self.last_error: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def describe(self) -> dict[str, Any]:
        """What `GET status` shows."""
        return {"id": self.id, "role": self.role, "generation": self.fence.generation,
                "candidate": self.fence.candidate, "interval_s": self.interval, "why": self.why,
                "last_beat": self.last_beat, "last_error": self.last_error}

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="spotwarp-heartbeat", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while True:
            self.beat()
            if self.role == FENCED or self._until_next_beat():
                return

    def _until_next_beat(self) -> bool:
        """Wait one interval (True once stopped). In standby the lease is read every STANDBY_POLL_S meanwhile,
        and a promotion beats at once: the new holder starts its work without waiting for its next beat."""
        deadline = time.monotonic() + self.interval
        while self.role == STANDBY and self.fence.candidate:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            if self._stop.wait(min(STANDBY_POLL_S, left)):
                return True
            try:
                if self.fence.role(read_lease(self.store)) != STANDBY:
                    return False
            except Exception:  # noqa: BLE001 - a damaged or unreachable lease: the next beat says so
                pass
        return self._stop.wait(max(0.0, deadline - time.monotonic()))

    def beat(self) -> str:
        """Read the lease, update the role, write the heartbeat (blocking: runs in the heartbeat thread)."""
        previous = self.role
        try:
            lease = read_lease(self.store)
            role = self.fence.role(lease)
            why = None if role in (SERVING, HOLDER) else self.fence.why_not(role, lease)
        except Fenced as exc:  # a damaged lease: write nothing, but not a reason to stop
            role, why = (STANDBY if self.fence.candidate else previous), str(exc)
        except Exception as exc:  # noqa: BLE001 - an unreachable store: keep serving, try again
            self.last_error = f"{type(exc).__name__}: {exc}"
            return self.role
        if previous == FENCED:
            role = FENCED
        if previous == HOLDER and role == STANDBY:
            # the lease that named this host is gone (deleted) or damaged: it must stop writing, and say so
            why = (f"the lease naming this host (candidate {self.fence.candidate}, generation "
                   f"{self.fence.generation}) is gone from the store or damaged ({why}): it writes nothing "
                   "until `spotwarp launch` moves the lease on (docs/failover.md#a-lost-or-damaged-lease)")
            self.lease_lost = why
            log.error("SpotWarp: %s", why)
            self.loop.call_soon_threadsafe(self.on_lease_lost, why)
        elif self.lease_lost and role == STANDBY:
            why = self.lease_lost
        elif role == HOLDER:
            self.lease_lost = None
        self.role, self.why = role, why
        self.beats += 1
        doc = {**self.info, "id": self.id, "candidate": self.fence.candidate, "generation": self.fence.generation,
               "beat": self.beats, "interval": self.interval, "state": role, "ready": True, "ready_at": self.ready_at, "time": time.time(),
               "host": socket.gethostname(), "pid": os.getpid(), "why": why,
               **({"lease_lost": True} if self.lease_lost else {})}
        try:
            write_heartbeat(self.store, doc)
            self.last_beat, self.last_error = doc["time"], None
        except Exception as exc:  # noqa: BLE001
            self.last_error = f"{type(exc).__name__}: {exc}"
        if role in (SERVING, HOLDER):
            self._take_request()
        if role != previous:
            if role == HOLDER:
                log.warning("SpotWarp: promoted: candidate %s holds the lease (generation %d)", self.fence.candidate,
                            self.fence.generation)
                self.loop.call_soon_threadsafe(self.on_promoted)
            elif role == FENCED:
                log.error("SpotWarp: %s; stopping this server", why)
                self.loop.call_soon_threadsafe(self.on_fenced, why or "fenced")
        return role

    def _take_request(self) -> None:
        """A request of the orchestrator for this host (a final snapshot before `launch --replace` fences it)."""
        try:
            doc = read_request(self.store, self.id)
        except Exception:  # noqa: BLE001 - unreachable: the next beat reads it again
            return
        if doc is None or doc["request"] in self.requests_seen or doc["generation"] != self.fence.generation:
            return
        self.requests_seen.add(doc["request"])
        log.warning("SpotWarp: the orchestrator asks for a final snapshot (request %s): this host is being replaced",
                    doc["request"])
        self.loop.call_soon_threadsafe(self.on_request, doc)
