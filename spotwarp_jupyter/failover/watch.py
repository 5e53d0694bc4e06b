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
from typing import Any, Callable

from ..engine.coordination import FENCED, DamagedLease
from ..engine.errors import one_line
from ..engine.journal import FINAL_SNAPSHOT_COMMITTED, HOST_LOST, NOTICE_SEEN, Journal
from ..engine.storage import Store
from .lease import LeaseConflict, read_lease
from .liveness import BeatClock, candidates_for_adoption, live_host, read_heartbeat, skew_s
from .provider import FAILED, GONE, CandidateHandle, LaunchSpec, Provider
from .race import OnEvent, RaceFailed, RaceResult, finish, race, wait_promotion_seen
from .standby import WarmStandby

log = logging.getLogger("spotwarp")


@dataclass
class Holder:
    """The host the watch follows: its heartbeat id, the provider's handle when this orchestrator started it."""

    id: str
    generation: int
    since: float  # promotion (or adoption) time, this machine's clock (for the record)
    handle: CandidateHandle | None = None
    notices_before: frozenset[str] = frozenset()  # notice events already journalled when the watch began
    interval: float | None = None  # the seconds between its beats, as its heartbeat says


@dataclass
class Loss:
    """Why the holder is considered lost, and when (this machine's clock)."""

    reason: str  # "notice", "no heartbeat", "lease lost", or "lease damaged" (the holder says it stopped writing)
    lost_at: float  # when the orchestrator last saw a sign of it (its last heartbeat change, or the notice)
    detected_at: float
    details: dict[str, Any] = field(default_factory=dict)


def adopt(store: Store, dead_after: float, stop: threading.Event | None = None) -> Holder | None:
    """The live host serving the project now, if any (`launch --watch` then watches it instead of racing).

    Alive means its heartbeat changes within `dead_after` seconds of this machine's own clock: a host whose
    clock is off is still adopted, a dead one is not, however recent the `time` it last wrote.
    """
    try:
        lease = read_lease(store)
    except DamagedLease:
        return None  # nobody holds a damaged lease: `launch` races past it
    ids = candidates_for_adoption(store, lease)
    if not ids:
        return None
    doc = live_host(store, ids, dead_after, stop, generation=lease.generation if lease.holder else None)
    if doc is None:
        return None
    interval = doc.get("interval")
    return Holder(str(doc["id"]), lease.generation, time.time(), notices_before=_notice_names(store),
                  interval=float(interval) if isinstance(interval, (int, float)) and interval > 0 else None)


def holder_of(result: RaceResult) -> Holder:
    assert result.winner is not None
    return Holder(result.winner.id, result.generation, result.promoted_at or time.time(), result.winner.handle)


def _notice_names(store: Store) -> frozenset[str]:
    try:
        return frozenset(e.name for e in Journal(store).events(limit=20) if e.event == NOTICE_SEEN)
    except Exception:  # noqa: BLE001 - an unreadable journal: every notice counts
        return frozenset()


def _notice(store: Store, holder: Holder) -> Any:
    for e in reversed(Journal(store).events(limit=20)):
        if e.event == NOTICE_SEEN and e.details.get("fatal", True) is not False and e.name not in holder.notices_before \
                and e.details.get("host_id") == holder.id:
            return e
    return None


def detect_loss(store: Store, holder: Holder, dead_after: float, provider: Provider | None,
                stop: threading.Event, poll_s: float = 0.5, notice_every_s: float = 1.0,
                on_event: OnEvent | None = None, max_backoff_s: float = 10.0) -> Loss | None:
    """Block until the holder is lost (a Loss) or `stop` is set (None).

    Silence is measured on this machine's monotonic clock, from the last change of the holder's heartbeat.
    A bad or missing heartbeat read is no news. While the store cannot be reached the watch retries with
    backoff and says so, and declares nothing: silence counts again from when the store answers (plus a grace,
    BeatClock.restart); so after a round of reads that took half of `dead_after` or more (_Reachability).
    """
    say: OnEvent = on_event or (lambda kind, data: None)
    clock = BeatClock()
    store_state = _Reachability(holder.id, clock, say, poll_s, max_backoff_s, slow_s=dead_after / 2)
    skew_said = False
    leases = _LeaseReader(store, holder.id, say)
    next_notice = 0.0
    while not stop.is_set():
        started = time.monotonic()
        try:
            lease = leases.read()
            doc = read_heartbeat(store, holder.id)
            notice = None
            if time.monotonic() >= next_notice:
                next_notice = time.monotonic() + notice_every_s
                notice = _notice(store, holder)
        except Exception as exc:  # noqa: BLE001 - the store unreachable: unknown, never a loss by itself
            stop.wait(store_state.failed(exc))
            continue
        store_state.answered(started)
        lost = _lease_verdict(lease, holder, clock) if lease is not None else None
        if lost is not None:
            return lost
        if clock.see(doc) and not skew_said:
            off = skew_s(doc)
            if off is not None:
                skew_said = True
                say("clock_skew", {"host": holder.id, "behind_s": off})
        if lease is None and doc is not None and (doc.get("state") == FENCED or doc.get("lease_lost") is True):
            # the holder itself stopped writing under the lease nobody can read: a race past it is the way out
            return Loss("lease damaged", clock.last_sign(), time.time(),
                        {"why": leases.unreadable, "holder_why": doc.get("why")})
        if doc is not None and doc.get("state") == FENCED:
            raise LeaseConflict(f"the holder {holder.id} says it is fenced: {doc.get('why')}")
        if notice is not None:
            return _after_notice(store, holder, notice, stop)
        if clock.silent_s() >= dead_after:
            details: dict[str, Any] = {"silent_s": round(clock.silent_s(), 3)}
            if provider is not None and holder.handle is not None:
                status = provider.poll(holder.handle)
                details.update(provider_state=status.state, provider_message=status.message or None)
            return Loss("no heartbeat", clock.last_sign(), time.time(), details)
        stop.wait(poll_s)
    return None


class _LeaseReader:
    """The lease as the watch reads it: None when it cannot be read, which says nothing of the holder (the watch
    keeps watching its heartbeat), warned once per reason."""

    def __init__(self, store: Store, holder_id: str, say: OnEvent):
        self.store, self.holder_id, self.say = store, holder_id, say
        self.unreadable: str | None = None

    def read(self) -> Any:
        try:
            return read_lease(self.store)
        except DamagedLease as exc:
            if self.unreadable != str(exc):
                self.unreadable = str(exc)
                self.say("lease_unreadable", {"holder": self.holder_id, "why": one_line(exc)})
                log.warning("SpotWarp: the watch cannot read the lease (%s); it keeps watching %s",
                            one_line(exc), self.holder_id)
            return None


class _Reachability:
    """How the store answers the watch. An outage (reads that raise) and a round of reads so slow that it was
    an outage the storage client's own retries hid are time the watch did not see, and the host could not
    write in either: silence counts again once the store answers, plus a grace of the outage's length (at
    most twice the longest backoff), for the host's first beat comes through its own retries."""

    def __init__(self, holder_id: str, clock: BeatClock, say: OnEvent, poll_s: float, max_backoff_s: float,
                 slow_s: float):
        self.holder_id, self.clock, self.say = holder_id, clock, say
        self.poll_s, self.max_backoff_s, self.slow_s = poll_s, max_backoff_s, slow_s
        self.outage: float | None = None  # when the first failed round of this outage came back
        self.backoff = poll_s

    def failed(self, exc: Exception) -> float:
        """A round of reads raised: say so once; the seconds to wait before the next round."""
        if self.outage is None:
            self.outage = time.monotonic()
            self.say("store_unreachable", {"holder": self.holder_id, "error": one_line(exc)})
            log.warning("SpotWarp: the store is unreachable (%s); the watch retries", one_line(exc))
        self.backoff = min(self.max_backoff_s, self.backoff * 2)
        return self.backoff

    def answered(self, started: float) -> None:
        """A round of reads begun at `started` (monotonic) came back."""
        now = time.monotonic()
        if self.outage is not None:
            self.say("store_reachable", {"holder": self.holder_id, "outage_s": round(now - self.outage, 3)})
            self.clock.restart(grace_s=min(now - self.outage, 2 * self.max_backoff_s))
            self.outage, self.backoff = None, self.poll_s
        elif now - started >= self.slow_s:
            self.say("store_slow", {"holder": self.holder_id, "read_s": round(now - started, 3)})
            log.warning("SpotWarp: the store took %.1f s to answer the watch; silence counts again from now",
                        now - started)
            self.clock.restart(grace_s=min(now - started, 2 * self.max_backoff_s))


def _lease_verdict(lease: Any, holder: Holder, clock: BeatClock) -> Loss | None:
    """LeaseConflict when the lease moved past the holder's generation (another orchestrator); a Loss when the
    holder's lease entry is gone; None while the lease is the holder's."""
    if lease.generation > holder.generation:
        raise LeaseConflict(f"the lease moved to {lease.holder} (generation {lease.generation}) under this watch: "
                            "another `spotwarp launch` runs for this project; run only one")
    if holder.generation > 0 and lease.generation < holder.generation:
        return Loss("lease lost", clock.last_sign(), time.time(),
                    {"why": f"the lease of generation {holder.generation} is gone from the store"})
    return None


def _after_notice(store: Store, holder: Holder, notice: Any, stop: threading.Event) -> Loss:
    """A notice: wait (within its window, on this machine's clock) for the final snapshot, so the race restores it."""
    detected = time.time()
    window = float(notice.details.get("window_s") or 30.0)
    deadline = time.monotonic() + window + 2.0
    final = None
    while final is None and time.monotonic() < deadline and not stop.is_set():
        try:
            final = next((e for e in Journal(store).events(limit=20) if e.event == FINAL_SNAPSHOT_COMMITTED
                          and e.details.get("run") == notice.details.get("run")), None)
        except Exception:  # noqa: BLE001 - the store unreachable: keep waiting within the window
            final = None
        if final is None:
            stop.wait(0.25)
    return Loss("notice", detected, detected, {"source": notice.details.get("source"),
                                               "kind": notice.details.get("kind"), "notice_time": notice.time,
                                               "final_snapshot": final.snapshot if final else None})


def record_loss(store: Store, holder: Holder, loss: Loss) -> None:
    try:
        Journal(store).record(HOST_LOST, candidate=holder.id, generation=holder.generation, reason=loss.reason,
                              lost_at=loss.lost_at, detect_s=round(loss.detected_at - loss.lost_at, 3), **loss.details)
    except Exception as exc:  # noqa: BLE001
        log.warning("SpotWarp: event host_lost not recorded: %s", exc)


def watch(provider: Provider, spec: LaunchSpec, store: Store, count: int, holder: Holder, dead_after: float,
          stop: threading.Event, on_event: OnEvent, race_timeout: float = 900.0, retry_s: float = 10.0,
          floor: Callable[[], int] | None = None, standby: int = 0) -> Holder:
    """Follow the holder; when it is lost, race again and follow the winner; until `stop` is set (the last holder).

    With `standby`, that many candidates wait in standby for the next race (standby.py); after a failover the
    next ones start `dead_after` seconds after the promotion, so they do not compete with the new holder's resume.
    """
    warm = WarmStandby(provider, spec, store, standby, on_event, floor, stop) if standby > 0 else None
    try:
        return _follow(provider, spec, store, count, holder, dead_after, stop, on_event, race_timeout, retry_s,
                       floor, warm)
    finally:
        if warm is not None:
            warm.drop()


def _follow(provider: Provider, spec: LaunchSpec, store: Store, count: int, holder: Holder, dead_after: float,
            stop: threading.Event, on_event: OnEvent, race_timeout: float, retry_s: float,
            floor: Callable[[], int] | None, warm: WarmStandby | None) -> Holder:
    settle_s = 0.0
    while not stop.is_set():
        if warm is not None:
            warm.start(settle_s)
        settle_s = dead_after
        loss = detect_loss(store, holder, dead_after, provider, stop, on_event=on_event)
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
                              on_event=on_event, floor=floor, stop=stop,
                              warm=warm.take if warm is not None else None)
                break
            except RaceFailed as exc:
                on_event("race_failed", {"error": str(exc)})
                stop.wait(retry_s)
        else:
            return holder
        wait_promotion_seen(store, result, timeout=min(30.0, max(5.0, dead_after)), on_event=on_event)
        row = finish(store, result, loss.reason, holder.id, loss.lost_at, loss.detected_at)
        on_event("failover_finished", row)
        holder = holder_of(result)
    return holder
