"""The race: launch N candidates in parallel through a provider, promote the first that serves a restored session.

A candidate is ready when its own heartbeat in the store says so (restored, serving, in standby for this
race's generation): readiness never depends on the provider. The winner is promoted by moving the lease
to it; only then are the others torn down, so a loser's teardown (SIGTERM) finds itself fenced off and
writes nothing. Candidates that fail are dropped; when all fail, the race fails with one line.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable

from ..engine.coordination import HOLDER
from ..engine.errors import SpotWarpError
from ..engine.journal import CANDIDATE_READY, FAILOVER_FINISHED, PROMOTED, RACE_STARTED, Journal
from ..engine.storage import Store
from .lease import LeaseConflict, move_lease, next_generation, taken_generation
from .liveness import read_heartbeat, ready_candidate
from .provider import FAILED, GONE, CandidateHandle, LaunchSpec, Offer, Provider

log = logging.getLogger("spotwarp")
OnEvent = Callable[[str, dict[str, Any]], None]


class RaceFailed(SpotWarpError):
    """No candidate came up: each one's reason in one line."""


@dataclass
class Candidate:
    """One candidate of a race, as the orchestrator follows it."""

    id: str
    offer: Offer
    handle: CandidateHandle | None = None
    state: str = "launching"  # launching, running, ready, promoted, failed, down
    message: str = ""
    launched_at: float = 0.0
    started_at: float | None = None  # when `spotwarp start` began on it (its heartbeat says)
    ready_at: float | None = None  # when it served (its heartbeat says)
    seen_ready_at: float | None = None  # when the orchestrator saw it ready
    restore: dict[str, Any] | None = None
    url: str | None = None

    @property
    def provision_s(self) -> float | None:
        """From the launch to `spotwarp start` beginning: the orchestrator's launch-to-ready (its own clock) less
        the candidate's restore-and-serve (its own clock): never one machine's time minus another's."""
        serve = self.restore_serve_s
        if self.seen_ready_at is None or serve is None:
            return None
        return round(max(0.0, self.seen_ready_at - self.launched_at - serve), 3)

    @property
    def restore_serve_s(self) -> float | None:
        if self.started_at is None or self.ready_at is None:
            return None
        return round(max(0.0, self.ready_at - self.started_at), 3)

    def as_dict(self) -> dict[str, Any]:
        return {"id": self.id, "offer": self.offer.describe(), "cloud": self.offer.cloud,
                "price_per_hour": self.offer.price_per_hour, "state": self.state, "message": self.message or None,
                "provision_s": self.provision_s, "restore_serve_s": self.restore_serve_s,
                "ready_s": None if self.seen_ready_at is None else round(self.seen_ready_at - self.launched_at, 3),
                "restored": (self.restore or {}).get("snapshot")}


@dataclass
class RaceResult:
    """How a race went: the winner (None when all failed), every candidate, and the times."""

    race: str
    generation: int
    provider: str
    started: float
    candidates: list[Candidate] = field(default_factory=list)
    winner: Candidate | None = None
    promoted_at: float | None = None
    url: str | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.winner is not None and self.error is None

    def as_dict(self) -> dict[str, Any]:
        w = self.winner
        return {"race": self.race, "generation": self.generation, "provider": self.provider, "ok": self.ok,
                "winner": w.id if w else None, "offer": w.offer.describe() if w else None, "url": self.url,
                "race_s": None if self.promoted_at is None else round(self.promoted_at - self.started, 3),
                "provision_s": w.provision_s if w else None, "restore_serve_s": w.restore_serve_s if w else None,
                "error": self.error, "candidates": [c.as_dict() for c in self.candidates]}


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _confirmed_url(c: Candidate, doc: dict[str, Any]) -> str | None:
    """The candidate's URL as its provider's handle knows it (None where the provider cannot tell, e.g. SkyPilot:
    `sky status --endpoints`); a different URL in its heartbeat is not shown, only logged."""
    url = (c.handle.data.get("url") if c.handle is not None else None) or None
    said = doc.get("url")
    if said and url and said.rstrip("/") != url.rstrip("/"):
        log.warning("SpotWarp: %s's heartbeat names %s, its provider %s: showing the provider's", c.id, said, url)
    return url


def _quietly(journal: Journal, event: str, **details: Any) -> None:
    try:
        journal.record(event, **details)
    except Exception as exc:  # noqa: BLE001 - the journal is a record, never a reason to fail a failover
        log.warning("SpotWarp: event %s not recorded: %s", event, exc)


def race(provider: Provider, spec: LaunchSpec, store: Store, count: int, *, timeout: float = 900.0,
         poll_s: float = 0.2, provider_poll_s: float = 1.0, reason: str = "launch",
         on_event: OnEvent | None = None, floor: Callable[[], int] | None = None,
         stop: threading.Event | None = None,
         warm: Callable[[int], list[Candidate]] | None = None) -> RaceResult:
    """Race `count` candidates; promote the first ready; tear the rest down. RaceFailed when none comes up.

    The race is for the generation above every one the project recorded (`floor()`: its manifests' highest).
    `warm(generation)`: candidates already running in standby for that generation (standby.py); they take the
    place of launches, and only the rest of `count` is launched.
    """
    the_race = _Race(provider, spec, store, on_event, floor, stop)
    ready = warm(the_race.result.generation) if warm is not None else []
    try:
        offers = list(provider.offers(spec, count - len(ready)))[:count - len(ready)] if len(ready) < count else []
    except BaseException:  # the standbys taken are this race's: none is left running
        for c in ready:
            try:
                the_race._down(c)
            except Exception as exc:  # noqa: BLE001 - the offers' error is the one to raise
                log.warning("SpotWarp: standby %s not torn down: %s", c.id, exc)
        raise
    if not offers and not ready:
        raise RaceFailed(f"provider {provider.name} has no offer for {spec.gpus or 'this task'}"
                         + (f" on {', '.join(spec.clouds)}" if spec.clouds else "")
                         + (f" under ${spec.max_price:g}/h" if spec.max_price is not None else ""))
    return the_race.run(offers, timeout, poll_s, provider_poll_s, reason, ready)


class _Race:
    """One race's moving parts: its candidates, the pool launching them, the journal."""

    def __init__(self, provider: Provider, spec: LaunchSpec, store: Store, on_event: OnEvent | None,
                 floor: Callable[[], int] | None = None, stop: threading.Event | None = None):
        self.provider, self.spec, self.store = provider, spec, store
        self.emit: OnEvent = on_event or (lambda kind, data: None)
        self.journal = Journal(store)
        self.lock = threading.Lock()
        self.conflict: LeaseConflict | None = None
        self.stop = stop or threading.Event()  # set by a signal: the race ends, every candidate goes down
        generation = next_generation(store, floor)
        self.result = RaceResult(secrets.token_hex(4), generation, provider.name, time.time())

    def run(self, offers: list[Offer], timeout: float, poll_s: float, provider_poll_s: float,
            reason: str, warm: list[Candidate] | None = None) -> RaceResult:
        result, generation = self.result, self.result.generation
        result.candidates.extend(warm or [])  # launched before the loss, in standby for this generation
        for i, offer in enumerate(offers):
            result.candidates.append(Candidate(f"g{generation}c{i}-{secrets.token_hex(2)}", offer))
        _quietly(self.journal, RACE_STARTED, race=result.race, generation=generation, provider=self.provider.name,
                 reason=reason, candidates=[{"id": c.id, "offer": c.offer.describe()} for c in result.candidates])
        self.emit(RACE_STARTED, {"race": result.race, "generation": generation,
                                 "candidates": [c.as_dict() for c in result.candidates]})
        pool = ThreadPoolExecutor(max_workers=len(result.candidates) * 2, thread_name_prefix="spotwarp-race")
        launches = [pool.submit(self._launch, c) for c in result.candidates if c.handle is None]
        try:
            self._wait_for_winner(timeout, poll_s, provider_poll_s)
            if result.winner is not None:
                self._promote(result.winner)
        finally:
            for f in launches:
                f.result()
            self._tear_down_losers(pool)
        if self.conflict is not None:
            _quietly(self.journal, FAILOVER_FINISHED, race=result.race, ok=False, provider=self.provider.name,
                     generation=result.generation, error=result.error,
                     candidates=[c.as_dict() for c in result.candidates])
            raise self.conflict
        if not result.ok:
            self._failed()
        return result

    def _launch(self, c: Candidate) -> None:
        c.launched_at = time.time()
        try:
            handle = self.provider.launch(self.spec, c.offer, c.id, self.result.generation)
        except Exception as exc:  # noqa: BLE001 - a failed launch drops this candidate only
            with self.lock:
                c.state, c.message = "failed", f"{type(exc).__name__}: {exc}"
            return
        with self.lock:
            c.handle = handle
            if c.state == "launching":
                c.state = "running"

    def _wait_for_winner(self, timeout: float, poll_s: float, provider_poll_s: float) -> None:
        """Poll the store for ready candidates (and the provider for failed ones) until one wins or none is left."""
        result = self.result
        deadline = time.monotonic() + timeout
        next_poll = 0.0
        while result.winner is None:
            live = [c for c in result.candidates if c.state in ("launching", "running")]
            if not live:
                return
            if time.monotonic() > deadline:
                result.error = f"no candidate served within {timeout:g} s"
                return
            if self.stop.is_set():
                result.error = "stopped by a signal before any candidate served: every candidate torn down"
                return
            ready = self._ready(live)
            if ready:
                # first seen ready on this machine's clock; candidates' own clocks are never compared
                result.winner = min(ready, key=lambda c: (c.seen_ready_at or 0, result.candidates.index(c)))
                result.url = result.winner.url
                return
            if time.monotonic() >= next_poll:
                next_poll = time.monotonic() + provider_poll_s
                if self._lease_moved():
                    return
                self._drop_failed(live)
            self.stop.wait(poll_s)  # the deadline-bounded poll of the store, not a stand-in for synchronisation

    def _lease_moved(self) -> bool:
        """Whether another orchestrator took this race's generation (or a later one): then this race is over."""
        try:
            taken = taken_generation(self.store)
        except SpotWarpError:
            return False  # the store unreachable: the promotion's create-only write decides
        if taken >= self.result.generation:
            self.conflict = LeaseConflict(f"the lease moved to generation {taken} during the race for generation "
                                          f"{self.result.generation}: another `spotwarp launch` runs for this "
                                          "project; run only one")
            self.result.error = str(self.conflict)
            return True
        return False

    def _ready(self, live: list[Candidate]) -> list[Candidate]:
        """The running candidates whose heartbeat says they serve a restored session for this generation."""
        ready = []
        for c in live:
            if c.state != "running":
                continue
            doc = ready_candidate(self.store, c.id, self.result.generation)
            if doc is not None:
                c.seen_ready_at = time.time()
                c.started_at, c.ready_at = _number(doc.get("started_at")), _number(doc.get("ready_at"))
                c.restore = doc.get("restore")
                # the address shown and journalled is the provider's own, never one read from the store
                c.state, c.url = "ready", _confirmed_url(c, doc)
                ready.append(c)
        return ready

    def _drop_failed(self, live: list[Candidate]) -> None:
        for c in live:
            if c.handle is None:
                continue
            status = self.provider.poll(c.handle)
            if status.state in (FAILED, GONE):
                c.state, c.message = "failed", status.message or status.state
                self.emit("candidate_failed", c.as_dict())

    def _promote(self, winner: Candidate) -> None:
        """Move the lease to the winner: from then on only it writes."""
        result = self.result
        _quietly(self.journal, CANDIDATE_READY, snapshot=(winner.restore or {}).get("snapshot"), race=result.race,
                 candidate=winner.id, offer=winner.offer.describe(), provision_s=winner.provision_s,
                 restore_serve_s=winner.restore_serve_s)
        self.emit(CANDIDATE_READY, winner.as_dict())
        try:
            lease = move_lease(self.store, result.generation, winner.id)
        except LeaseConflict as exc:
            # another orchestrator moved the lease: never a failed race to retry, the end of this one's work
            result.error, self.conflict = str(exc), exc
            return
        except SpotWarpError as exc:
            result.error = str(exc)
            return
        result.promoted_at = lease.time
        winner.state = "promoted"
        _quietly(self.journal, PROMOTED, race=result.race, candidate=winner.id, generation=result.generation)
        self.emit(PROMOTED, {"candidate": winner.id, "generation": result.generation, "url": result.url})

    def _tear_down_losers(self, pool: ThreadPoolExecutor) -> None:
        """Every candidate but a promoted winner goes down (after the promotion, so a loser finds itself fenced)."""
        result = self.result
        losers = [c for c in result.candidates if c is not result.winner or not result.ok]
        for c in losers:
            if c.state not in ("failed",):
                c.state = "down"
        list(pool.map(self._down, losers))
        pool.shutdown(wait=True)

    def _down(self, c: Candidate) -> None:
        """Tear one candidate down, then drop what it left on its machine (a provider that can)."""
        if c.handle is None:
            return
        self.provider.down(c.handle)
        discard = getattr(self.provider, "discard", None)
        if discard is not None:
            try:
                discard(c.handle)
            except Exception as exc:  # noqa: BLE001 - leftovers are not a failed race
                log.warning("SpotWarp: %s's folder not removed: %s", c.id, exc)

    def _failed(self) -> None:
        result = self.result
        reasons = "; ".join(f"{c.id} ({c.offer.describe()}): {c.message or c.state}" for c in result.candidates)
        result.error = result.error or f"all {len(result.candidates)} candidates failed"
        _quietly(self.journal, FAILOVER_FINISHED, race=result.race, ok=False, provider=self.provider.name,
                 generation=result.generation, error=result.error,
                 candidates=[c.as_dict() for c in result.candidates])
        raise RaceFailed(f"{result.error}: {reasons}")


def wait_promotion_seen(store: Store, result: RaceResult, timeout: float = 30.0, poll_s: float = 0.2,
                        on_event: OnEvent | None = None) -> bool:
    """Whether the winner's heartbeat said "holder" within `timeout` (it learnt of its promotion); when it did
    not, `promotion_unseen` is said: a winner that reads the lease with another SPOTWARP_KEY (or none where
    this machine has one) refuses the entry that promoted it and stays in standby."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        doc = read_heartbeat(store, result.winner.id) if result.winner else None
        if doc is not None and doc.get("state") == HOLDER:
            return True
        time.sleep(poll_s)  # deadline-bounded poll of the store
    if on_event is not None and result.winner is not None:
        on_event("promotion_unseen", {"candidate": result.winner.id, "waited_s": timeout})
    return False


def finish(store: Store, result: RaceResult, reason: str, lost: str | None = None, lost_at: float | None = None,
           detected_at: float | None = None) -> dict[str, Any]:
    """Record failover_finished with detect / provision / restore-and-serve / total seconds; return the row."""
    w = result.winner
    origin = lost_at if lost_at is not None else result.started
    row = {"race": result.race, "ok": result.ok, "reason": reason, "lost": lost, "provider": result.provider,
           "generation": result.generation, "winner": w.id if w else None, "offer": w.offer.describe() if w else None,
           "detect_s": None if lost_at is None or detected_at is None else round(detected_at - lost_at, 3),
           "provision_s": w.provision_s if w else None, "restore_serve_s": w.restore_serve_s if w else None,
           "race_s": None if result.promoted_at is None else round(result.promoted_at - result.started, 3),
           "total_s": None if result.promoted_at is None else round(result.promoted_at - origin, 3),
           "candidates": [c.as_dict() for c in result.candidates], "url": result.url}
    _quietly(Journal(store), FAILOVER_FINISHED, **{k: v for k, v in row.items() if k != "ok"}, ok=result.ok)
    return row
