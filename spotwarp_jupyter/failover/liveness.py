"""Reading hosts' heartbeats for the race (who serves) and the watch (who stopped beating).

Silence is judged on the orchestrator's own monotonic clock: a host is alive while its heartbeat keeps
changing (its `beat` counter, pid and time), never by comparing the `time` it wrote with this machine's
clock. That `time` only serves to warn about skew.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from ..engine.coordination import HOLDER, SERVING, STANDBY, Lease, age, read_heartbeat, read_heartbeats
from ..engine.storage import Store

__all__ = ["age", "BeatClock", "candidates_for_adoption", "live_host", "ready_candidate", "read_heartbeat",
           "read_heartbeats", "skew_s", "SKEW_WARN_S"]

SKEW_WARN_S = 5.0  # a heartbeat `time` further than this from this machine's clock is reported as skew


def ready_candidate(store: Store, candidate_id: str, generation: int) -> dict[str, Any] | None:
    """The candidate's heartbeat once it restored and serves, in standby for `generation`; None before."""
    doc = read_heartbeat(store, candidate_id)
    if doc is None or doc.get("generation") != generation or not doc.get("ready"):
        return None
    return doc if doc.get("state") in (STANDBY, HOLDER) else None


class BeatClock:
    """When a host's heartbeat last changed, on this machine's monotonic clock."""

    def __init__(self, since: float | None = None):
        self.key: tuple[Any, ...] | None = None
        self.changed = time.monotonic() if since is None else since
        self.doc: dict[str, Any] | None = None
        self.beats: dict[Any, int] = {}  # the highest beat seen of each process (pid) of the host

    def see(self, doc: dict[str, Any] | None) -> bool:
        """Record a read of the heartbeat (None: no news); True when it changed since the last read.

        A beat counts only when it is above every beat seen from that process: an older heartbeat written back
        (a signed one replayed by a store writer without the key) is no sign of life."""
        if doc is None:
            return False
        key = (doc.get("pid"), doc.get("beat"), doc.get("time"), doc.get("state"))
        if key == self.key:
            return False
        beat = doc.get("beat")
        if isinstance(beat, int) and not isinstance(beat, bool):
            if beat <= self.beats.get(key[0], -1):
                return False
            self.beats[key[0]] = beat
        first = self.key is None
        self.key, self.doc = key, doc
        if not first:
            self.changed = time.monotonic()
        return True

    def silent_s(self) -> float:
        """Seconds (monotonic) since the heartbeat last changed (or since watching began)."""
        return time.monotonic() - self.changed

    def last_sign(self) -> float:
        """The last change, as this machine's wall-clock time (for the journal's figures)."""
        return time.time() - self.silent_s()

    def restart(self, grace_s: float = 0.0) -> None:
        """Silence counts again from now plus `grace_s` (after an outage of the store: the host could not write
        either, and its first beat after it comes through its own retries' backoff); a new beat ends the grace."""
        self.changed = max(self.changed, time.monotonic() + grace_s)


def skew_s(doc: dict[str, Any], interval: float | None = None) -> float | None:
    """How far the writer's clock seems off this one's when its beat was just seen to change: positive when
    it is behind. None when within SKEW_WARN_S (plus the beat interval it writes at)."""
    off = time.time() - float(doc["time"])
    slack = SKEW_WARN_S + float(interval if interval is not None else doc.get("interval") or 0)
    if -SKEW_WARN_S <= off <= slack:
        return None
    return round(off, 1)


def candidates_for_adoption(store: Store, lease: Lease) -> list[str]:
    """Ids of hosts that may be serving the project now: the lease's holder (whatever one read of its heartbeat
    says: a torn or missing read is no news), or without failover yet every host serving at generation 0;
    whether they are alive is for `live_host` to see."""
    if lease.holder:
        return [lease.holder]
    return [d["id"] for d in read_heartbeats(store) if d.get("state") == SERVING and not d.get("candidate")]


def live_host(store: Store, ids: list[str], within: float, stop: threading.Event | None = None,
              poll_s: float = 0.25, generation: int | None = None) -> dict[str, Any] | None:
    """The first of `ids` whose heartbeat (of `generation`, when given) changes within `within` seconds
    (this machine's monotonic clock): it is alive. Bad, torn or missing reads are no news."""
    clocks = {i: BeatClock() for i in ids}
    deadline = time.monotonic() + within
    stop = stop or threading.Event()
    while clocks and not stop.is_set():
        for ident, clock in clocks.items():
            try:
                doc = read_heartbeat(store, ident)
            except Exception:  # noqa: BLE001 - an unreachable store is no news
                continue
            if doc is not None and generation is not None and doc.get("generation") != generation:
                doc = None
            first = clock.key is None
            if clock.see(doc) and not first:
                return doc
        if time.monotonic() >= deadline:
            return None
        stop.wait(poll_s)
    return None
