"""Loss detection and the failover loop of `spotwarp launch --watch`.

The host holding the session is lost when it journals a fatal preemption notice (then its final snapshot
is awaited, within the notice's window), or when its heartbeat has been silent for `dead_after` seconds
(Vast.ai gives no notice; a host cut off from the store is as good as lost: the lease fences it off).
The provider is asked how the host is doing (recorded with the loss); a host it reports gone is torn
down, one it reports running is left alone: it finds itself fenced when it reaches the store, and stops.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from ..engine.coordination import FENCED
from ..engine.journal import FINAL_SNAPSHOT_COMMITTED, HOST_LOST, NOTICE_SEEN, Journal
from ..engine.storage import Store
from .heartbeat import current_holder, read_heartbeat
from .lease import LeaseConflict, read_lease
from .provider import FAILED, GONE, CandidateHandle, LaunchSpec, Provider
from .race import OnEvent, RaceFailed, RaceResult, finish, race, wait_promotion_seen

log = logging.getLogger("spotwarp")


@dataclass
class Holder:
    """The host the watch follows: its heartbeat id, the provider's handle when this orchestrator started it."""

    id: str
    generation: int
    since: float  # promotion (or adoption) time: notices and silence count from here
    handle: CandidateHandle | None = None


@dataclass
class Loss:
    """Why the holder is considered lost, and when."""

    reason: str  # "notice" or "no heartbeat"
    lost_at: float  # the notice's time, or the last heartbeat's
    detected_at: float
    details: dict[str, Any] = field(default_factory=dict)


def adopt(store: Store, dead_after: float) -> Holder | None:
    """The live host serving the project now, if any (`launch --watch` then watches it instead of racing)."""
    lease = read_lease(store)
    doc = current_holder(store, lease, dead_after)
    if doc is None or time.time() - float(doc.get("time") or 0) >= dead_after:
        return None
    return Holder(str(doc["id"]), lease.generation, max(lease.time, time.time() - dead_after))


def holder_of(result: RaceResult) -> Holder:
    assert result.winner is not None
    return Holder(result.winner.id, result.generation, result.promoted_at or time.time(), result.winner.handle)


def _notice(store: Store, holder: Holder) -> Any:
    for e in reversed(Journal(store).events(limit=20)):
        if e.event == NOTICE_SEEN and e.details.get("fatal", True) and e.time >= holder.since \
                and e.details.get("host_id") == holder.id:
            return e
    return None


def detect_loss(store: Store, holder: Holder, dead_after: float, provider: Provider | None,
                stop: threading.Event, poll_s: float = 0.5, notice_every_s: float = 1.0) -> Loss | None:
    """Block until the holder is lost (a Loss) or `stop` is set (None)."""
    next_notice = 0.0
    while not stop.is_set():
        now = time.time()
        lease = read_lease(store)
        if lease.generation > holder.generation:
            raise LeaseConflict(f"the lease moved to {lease.holder} (generation {lease.generation}) under this watch: "
                                "another `spotwarp launch` runs for this project; run only one")
        doc = read_heartbeat(store, holder.id)
        last = max(float(doc.get("time") or 0), holder.since) if doc is not None else holder.since
        if doc is not None and doc.get("state") == FENCED:
            raise LeaseConflict(f"the holder {holder.id} says it is fenced: {doc.get('why')}")
        if time.monotonic() >= next_notice:
            next_notice = time.monotonic() + notice_every_s
            notice = _notice(store, holder)
            if notice is not None:
                return _after_notice(store, holder, notice, stop)
        if now - last >= dead_after:
            details: dict[str, Any] = {"silent_s": round(now - last, 3), "last_heartbeat": last}
            if provider is not None and holder.handle is not None:
                status = provider.poll(holder.handle)
                details.update(provider_state=status.state, provider_message=status.message or None)
            return Loss("no heartbeat", last, time.time(), details)
        stop.wait(poll_s)
    return None


def _after_notice(store: Store, holder: Holder, notice: Any, stop: threading.Event) -> Loss:
    """A notice: wait (within its window) for the final snapshot, so the race restores it."""
    detected = time.time()
    window = float(notice.details.get("window_s") or 30.0)
    deadline = notice.time + window + 2.0
    final = None
    while final is None and time.time() < deadline and not stop.is_set():
        final = next((e for e in Journal(store).events(limit=20) if e.event == FINAL_SNAPSHOT_COMMITTED
                      and e.details.get("run") == notice.details.get("run")), None)
        if final is None:
            stop.wait(0.25)
    return Loss("notice", notice.time, detected, {"source": notice.details.get("source"),
                                                  "kind": notice.details.get("kind"),
                                                  "final_snapshot": final.snapshot if final else None})


def record_loss(store: Store, holder: Holder, loss: Loss) -> None:
    try:
        Journal(store).record(HOST_LOST, candidate=holder.id, generation=holder.generation, reason=loss.reason,
                              lost_at=loss.lost_at, detect_s=round(loss.detected_at - loss.lost_at, 3), **loss.details)
    except Exception as exc:  # noqa: BLE001
        log.warning("SpotWarp: event host_lost not recorded: %s", exc)


def watch(provider: Provider, spec: LaunchSpec, store: Store, count: int, holder: Holder, dead_after: float,
          stop: threading.Event, on_event: OnEvent, race_timeout: float = 900.0, retry_s: float = 10.0) -> Holder:
    """Follow the holder; when it is lost, race again and follow the winner; until `stop` is set (the last holder)."""
    while not stop.is_set():
        loss = detect_loss(store, holder, dead_after, provider, stop)
        if loss is None:
            return holder
        record_loss(store, holder, loss)
        on_event(HOST_LOST, {"lost": holder.id, "reason": loss.reason,
                             "detect_s": round(loss.detected_at - loss.lost_at, 3), **loss.details})
        gone = loss.reason == "notice" or loss.details.get("provider_state") in (GONE, FAILED)
        if holder.handle is not None and gone:
            # gone, or going after its final snapshot: make sure nothing of it stays up (and billed); a host
            # the provider says runs (a partition) is left: the lease fences it off and it stops itself
            threading.Thread(target=provider.down, args=(holder.handle,), name="spotwarp-down-lost",
                             daemon=True).start()  # never delays the race
        while not stop.is_set():
            try:
                result = race(provider, spec, store, count, timeout=race_timeout, reason=loss.reason,
                              on_event=on_event)
                break
            except RaceFailed as exc:
                on_event("race_failed", {"error": str(exc)})
                stop.wait(retry_s)
        else:
            return holder
        wait_promotion_seen(store, result, timeout=min(30.0, max(5.0, dead_after)))
        row = finish(store, result, loss.reason, holder.id, loss.lost_at, loss.detected_at)
        on_event("failover_finished", row)
        holder = holder_of(result)
    return holder
