"""A kernel's automatic snapshots: when one is due at a safe point, and the one a background writer takes.

The session (kernel/session.py) owns the state a snapshot holds and how it is captured and committed; this
component decides when: at the end of a cell, at a resumable loop's step (at the interval the cadence adapts to
their measured cost, kernel/policy.py), between cells, or when a notice asks. It starts the snapshot in a forked
writer (engine.writers) so the kernel pauses only for the fork; where fork is unavailable it is taken
synchronously, and where little is left to serialize a writer thread is used instead. Requests arriving while
one is in flight are taken at the next safe point.
"""

from __future__ import annotations

import threading
import time
from contextlib import AbstractContextManager
from typing import Any, Callable, Mapping, NamedTuple, Protocol

from .. import safepoints
from ..engine import CaptureOptions, Manifest, SnapshotEngine, writers
from ..engine.incremental import ReusePlan, StaleBaseline
from ..engine.variables import LoadResult
from ..engine.writers import BackgroundSnapshot, Commit
from .arrivals import Arrivals
from .busy import still_busy
from .increments import Increments
from .policy import FIRST_STEP_S, Cadence, LoopMeter, Policy


class BackgroundCapture(NamedTuple):
    """A kernel's state at the instant a background snapshot starts: what its writer needs besides the namespace."""

    commit: Commit  # the writer hands its image to the store with it
    plan: ReusePlan | None  # what it reuses of the previous snapshot; None: every variable is written
    options: CaptureOptions


class Session(Protocol):
    """What automatic snapshots use of their kernel's session (kernel/session.py's KernelSession is one): the
    state a snapshot holds, how it is captured and committed, and the facts of the last one."""

    namespace: dict[str, Any]
    hidden: Mapping[str, Any]
    policy: Policy
    increments: Increments
    arrivals: Arrivals
    lock: AbstractContextManager[Any]  # held while a snapshot is captured: a writer starts under it
    last_restore: tuple[Manifest, LoadResult] | None
    last_error: str | None
    last_pause_s: float | None
    last_started_at: float | None
    last_snapshot_at: float | None
    restored_at: float | None

    @property
    def engine(self) -> SnapshotEngine: ...
    def settle_key(self) -> None: ...
    def snapshot(self, message: str | None = None, requests: list[str] | None = None,
                 full: bool = False, at: str = "call") -> Manifest: ...
    def background_capture(self, message: str | None, requests: list[str] | None, urgent: bool,
                           in_loop: bool) -> BackgroundCapture: ...
    def extras(self) -> dict[str, Any]: ...
    def committed(self, manifest: Manifest) -> None: ...
    def holds_state(self) -> bool: ...
    def own_manifests(self) -> list[Manifest]: ...


class AutomaticSnapshots:
    """When a kernel's automatic snapshot is due, and the one in flight (at most one at a time)."""

    def __init__(self, session: Session):
        self.session = session
        self.in_flight: BackgroundSnapshot | None = None
        self._flight_done = threading.Event()
        self._flight_done.set()
        self._deferred: list[str] = []
        self._requests: list[str] = []  # ids of requests (notices) the next automatic snapshot answers
        self._flight_requests: list[str] = []  # those the snapshot in flight answers
        self._first_cell = True  # the session is protected at the end of its first cell, not `every` later
        self.started_at = time.time()
        self.cell_ended_at: float | None = None  # the last cell's end (its state is stored by a snapshot started since)
        self.meter = LoopMeter()  # what snapshots at steps cost the loop: the cadence adapts to it
        self.loop_started_at: float | None = None  # the first step's safe point in the running cell
        self.last_full = True  # the last snapshot started in the background wrote every variable (no plan reused)
        self._cadence: tuple[tuple, Cadence] | None = None

    def new_cell(self) -> None:
        """A cell starts or ends: the loop the meter times, if any, is over."""
        self.meter.new_cell()
        self.loop_started_at = None

    def cadence(self) -> Cadence:
        """How often snapshots are taken at a loop's steps now, from the policy and their measured cost
        (computed again only when a snapshot was measured or the policy changed: due() asks at every step)."""
        policy = self.session.policy
        key = (self.meter.measured, policy.max_redo_s, policy.every_s)
        if self._cadence is None or self._cadence[0] != key:
            self._cadence = (key, self.meter.cadence(policy.max_redo_s, policy.every_s))
        return self._cadence[1]

    def snapshot_in_background(self, message: str | None = None, requests: list[str] | None = None,
                               urgent: bool = False, in_loop: bool = False) -> BackgroundSnapshot | Manifest | None:
        """Start a snapshot the kernel does not wait for; None if one is already in flight.

        Falls back to a synchronous snapshot where fork is unavailable. `urgent` (a preemption notice's
        snapshot, the kernel held until it commits): the writer keeps the kernel's CPU priority.
        `in_loop` (taken at a loop's step): what changed is copied and written from a thread (engine/writers/staged.py)
        when that is cheap to serialize, since the next step would rewrite it under a forked writer.
        """
        session = self.session
        session.settle_key()
        if writers.fork_unavailable_reason():
            return session.snapshot(message, requests, at="step" if in_loop else "call")
        with session.lock:
            if self.in_flight is not None:
                return None
            capture = session.background_capture(message, requests, urgent, in_loop)
            self._flight_done.clear()
            self.last_full = capture.plan is None
            start = self._writer_for(capture.plan, capture.options, in_loop and not urgent)
            self._flight_requests = list(requests or [])
            try:
                self.in_flight = start(capture.commit, session.namespace, session.hidden, capture.options,
                                       session.extras, on_done=self._background_done, reuse=capture.plan, urgent=urgent)
            except BaseException:
                self._flight_done.set()
                raise
            session.last_pause_s = self.in_flight.pause_s
            return self.in_flight

    def _writer_for(self, plan: ReusePlan | None, options: CaptureOptions, in_loop: bool) -> Callable[..., Any]:
        """How to take this snapshot: a writer thread, a staged copy (in a loop), or a forked writer."""
        session = self.session
        left = session.increments.left_to_serialize(session.namespace, session.hidden, plan, options)
        if session.increments.little_left(left, plan):
            return writers.start_in_thread
        if in_loop and not writers.cuda_in_use() and session.increments.quick_to_serialize(left):
            return writers.start_staged
        return writers.start_background

    def _background_done(self, job: BackgroundSnapshot) -> None:
        """Runs in the reaper thread once the child has exited."""
        session = self.session
        self.meter.written(time.perf_counter())
        try:
            result = job.result
            if result is not None and result.ok and result.snapshot_id:
                manifest = session.engine.get(result.snapshot_id)
                manifest.stats["pause_s"] = round(job.pause_s, 4)
                manifest.stats["writer"] = job.writer
                session.committed(manifest)
            else:
                # its requests (a notice, a server's request) are answered by the next snapshot instead
                self._requests[:0] = self._flight_requests
                session.last_error = (result.error if result else None) or "background snapshot failed"
                if session.last_error.startswith(StaleBaseline.__name__):
                    session.increments.baseline = None
        except Exception as exc:  # noqa: BLE001 - a reaper thread must not die silently
            session.last_error = f"{type(exc).__name__}: {exc}"
        finally:
            self.in_flight = None
            deferred, self._deferred = self._deferred, []
            self._flight_done.set()
            for reason in deferred:
                safepoints.request(reason)

    def wait_in_flight(self, timeout: float | None = None) -> bool:
        """Wait until no background snapshot is running (its bookkeeping done); False on timeout."""
        return self._flight_done.wait(timeout)

    def due(self, reasons: list[str], cell_end: bool = False, step: bool = False) -> bool:
        """Whether a snapshot should be taken now: asked for, or the policy's interval has passed.

        At a loop's `step` with no fixed `--every`: FIRST_STEP_S after the loop's first step when nothing was
        snapshotted since, then at the interval the cadence adapts to the measured cost of the last ones."""
        if reasons:
            return True
        session = self.session
        policy = session.policy
        if not policy.enabled:
            return False
        never = session.last_snapshot_at is None and session.last_started_at is None and session.last_restore is None
        if never and not session.holds_state():
            return False  # an empty session never becomes a notebook's newest snapshot over real state
        if cell_end and self._first_cell:
            self._first_cell = False
            if never and not self._first_cell_waits():
                return True
        last = self._last_stored_at()
        now = time.time()
        if step and policy.every_s is None:
            loop_start = self.loop_started_at or now
            # a snapshot started before the loop holds the state from before it, even when it commits after
            if (session.last_started_at or 0.0) < loop_start:
                return now - loop_start >= FIRST_STEP_S
            return now - last >= self.cadence().interval_s
        return now - last >= policy.cell_every_s

    def _last_stored_at(self) -> float:
        """The newest instant whose state is stored or being stored: the interval counts from it."""
        session = self.session
        return (max(session.last_snapshot_at or 0.0, session.last_started_at or 0.0, session.restored_at or 0.0)
                or self.started_at)

    def idle_snapshot_in(self) -> float | None:
        """Seconds until the automatic snapshot the last cell's end did not take (its interval had not passed)
        is due, or None when none waits. An idle kernel reaches no safe point, so the extension runs one then
        (kernel/extension.py): the interval holds between cells too, not only at the next cell's end."""
        ended = self.cell_ended_at
        policy = self.session.policy
        if ended is None or not (policy.enabled and policy.after_cell):
            return None
        if (self.session.last_started_at or 0.0) >= ended:
            return None  # a snapshot started at the cell's end, or since, holds what the cell left
        return max(0.0, self._last_stored_at() + policy.cell_every_s - time.time())

    def _first_cell_waits(self) -> bool:
        """Whether the first cell must not snapshot: this kernel restored one (its state is already stored),
        or its notebook has one this kernel has not restored (an empty session must not become its newest
        at once: the widget offers it, and the interval gives time to restore)."""
        if self.session.last_restore is not None:
            return True
        try:
            return bool(self.session.own_manifests())
        except Exception:  # noqa: BLE001 - unreachable storage: the snapshot attempt reports it
            return False

    def at_safe_point(self, where: str, reasons: list[str], urgent: bool = False) -> None:
        """Run at every safe point (a resumable step, the end of a cell): start a snapshot when due.

        `urgent`: the caller holds the kernel here until the snapshot commits (snapshot_in_background).
        """
        session = self.session
        step_at = 0.0
        if where == "cell":
            self.cell_ended_at = time.time()
        elif where == "step":
            step_at = time.perf_counter()
            self.meter.step(step_at, writing=self.in_flight is not None)
            if self.loop_started_at is None:
                self.loop_started_at = time.time()
            still_busy()  # a tab connecting while the loop runs shows the kernel busy
        if where in ("cell", "idle") and not reasons and not session.policy.after_cell:
            return
        if not self.due(reasons, cell_end=where == "cell", step=where == "step"):
            return
        if session.arrivals.load is not None:
            if not reasons:
                return  # the state being restored is stored already: the timer waits for the restore to end
            session.arrivals.finish()  # asked for (a preemption notice): the snapshot must hold every variable
        if self.in_flight is not None:
            self._deferred.extend(reasons)  # taken at the first safe point after the one in flight
            return
        message = ("requested: " + ", ".join(sorted(set(reasons)))) if reasons else None
        requests, self._requests = self._requests, []
        try:
            job = self.snapshot_in_background(message, requests, urgent=urgent, in_loop=where == "step")
            if job is not None and where == "step":
                self.meter.started(step_at, session.last_pause_s or 0.0, full=self.last_full)
        except Exception as exc:  # noqa: BLE001 - automatic snapshots never break the user's cell
            session.last_error = f"{type(exc).__name__}: {exc}"
            self._requests[:0] = requests  # the next one answers them

    def answer_with_next_snapshot(self, request_id: str) -> None:
        """Name `request_id` in the next snapshot started at a safe point (how a notice finds its snapshot)."""
        self._requests.append(request_id)
