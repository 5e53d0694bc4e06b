"""Automatic snapshots of a kernel: when one is due at a safe point, and taking it in the background.

A background snapshot forks a writer (engine/background.py) so the kernel pauses only for the fork;
where fork is unavailable it is taken synchronously, and where little is left to serialize a writer
thread is used instead. Requests arriving while one is in flight are taken at the next safe point.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING

from .. import safepoints
from ..engine import CaptureOptions, Manifest
from ..engine.background import (
    BackgroundSnapshot,
    cuda_in_use,
    fork_unavailable_reason,
    start_background,
    start_in_thread,
)
from ..engine.reuse import ReusePlan, StaleBaseline
from ..engine.staging import start_staged

if TYPE_CHECKING:
    from .session import KernelSession


class AutomaticSnapshots:
    """The part of KernelSession that decides when to snapshot and runs snapshots the kernel does not wait for."""

    in_flight: BackgroundSnapshot | None
    last_snapshot_at: float | None
    last_started_at: float | None
    last_pause_s: float | None
    last_error: str | None

    def _init_automatic(self) -> None:
        self.in_flight = None
        self._flight_done = threading.Event()
        self._flight_done.set()
        self._deferred: list[str] = []
        self._requests: list[str] = []  # ids of requests (notices) the next automatic snapshot answers
        self._first_cell = True  # the session is protected at the end of its first cell, not `every` later
        self.started_at = time.time()

    def snapshot_in_background(self: "KernelSession", message: str | None = None, requests: list[str] | None = None,
                               urgent: bool = False, in_loop: bool = False) -> BackgroundSnapshot | Manifest | None:
        """Start a snapshot the kernel does not wait for; None if one is already in flight.

        Falls back to a synchronous snapshot where fork is unavailable. `urgent` (a preemption notice's
        snapshot, the kernel held until it commits): the writer keeps the kernel's CPU priority.
        `in_loop` (taken at a loop's step): what changed is copied and written from a thread (engine/staging.py)
        when that is cheap to serialize, since the next step would rewrite it under a forked writer.
        """
        if fork_unavailable_reason():
            return self.snapshot(message, requests)
        with self._lock:
            if self.in_flight is not None:
                return None
            engine, notebook = self.engine, self.notebook
            started = time.perf_counter()
            self.last_started_at = time.time()
            self._flight_done.clear()
            options = self.capture_options()
            plan, stats = self.increments.plan(self.namespace, options, full=False)

            def commit(image, on_written):
                return engine.commit_image(image, notebook, message, started=started,
                                           stats={"mode": "background", **stats}, on_written=on_written, requests=requests)

            start = self._writer_for(plan, options, in_loop and not urgent)
            try:
                self.in_flight = start(commit, self.namespace, self.hidden, options,
                                       self.extras, on_done=self._background_done, reuse=plan, urgent=urgent)
            except BaseException:
                self._flight_done.set()
                raise
            self.last_pause_s = self.in_flight.pause_s
            return self.in_flight

    def _writer_for(self: "KernelSession", plan: ReusePlan | None, options: CaptureOptions, in_loop: bool):
        """How to take this snapshot: a writer thread, a staged copy (in a loop), or a forked writer."""
        left = self.increments.left_to_serialize(self.namespace, self.hidden, plan, options)
        if self.increments.little_left(left, plan):
            return start_in_thread
        if in_loop and not cuda_in_use() and self.increments.quick_to_serialize(left):
            return start_staged
        return start_background

    def _background_done(self: "KernelSession", job: BackgroundSnapshot) -> None:
        """Runs in the reaper thread once the child has exited."""
        try:
            result = job.result
            if result is not None and result.ok and result.snapshot_id:
                manifest = self.engine.get(result.snapshot_id)
                manifest.stats["pause_s"] = round(job.pause_s, 4)
                manifest.stats["writer"] = job.writer
                self.increments.remember(manifest, self.notebook)
                self._committed(manifest)
            else:
                self.last_error = (result.error if result else None) or "background snapshot failed"
                if self.last_error.startswith(StaleBaseline.__name__):
                    self.increments.baseline = None
        except Exception as exc:  # noqa: BLE001 - a reaper thread must not die silently
            self.last_error = f"{type(exc).__name__}: {exc}"
        finally:
            self.in_flight = None
            deferred, self._deferred = self._deferred, []
            self._flight_done.set()
            for reason in deferred:
                safepoints.request(reason)

    def wait_in_flight(self, timeout: float | None = None) -> bool:
        """Wait until no background snapshot is running (its bookkeeping done); False on timeout."""
        return self._flight_done.wait(timeout)

    def due(self: "KernelSession", reasons: list[str], cell_end: bool = False) -> bool:
        """Whether a snapshot should be taken now: asked for, or the policy's interval has passed."""
        if reasons:
            return True
        if not self.policy.enabled:
            return False
        if cell_end and self._first_cell:
            self._first_cell = False
            if self.last_snapshot_at is None and self.last_started_at is None and not self._first_cell_waits():
                return True
        last = max(self.last_snapshot_at or 0.0, self.last_started_at or 0.0) or self.started_at
        return time.time() - last >= self.policy.every_s

    def _first_cell_waits(self: "KernelSession") -> bool:
        """Whether the first cell must not snapshot: this kernel restored one (its state is already stored),
        or its notebook has one this kernel has not restored (an empty session must not become its newest
        at once: the widget offers it, and the interval gives time to restore)."""
        if self.last_restore is not None:
            return True
        try:
            return bool(self.engine.manifests(self.notebook))
        except Exception:  # noqa: BLE001 - unreachable storage: the snapshot attempt reports it
            return False

    def at_safe_point(self: "KernelSession", where: str, reasons: list[str], urgent: bool = False) -> None:
        """Run at every safe point (a resumable step, the end of a cell): start a snapshot when due.

        `urgent`: the caller holds the kernel here until the snapshot commits (snapshot_in_background).
        """
        if where == "cell" and not reasons and not self.policy.after_cell:
            return
        if not self.due(reasons, cell_end=where == "cell"):
            return
        if self.arrivals.load is not None:
            if not reasons:
                return  # the state being restored is stored already: the timer waits for the restore to end
            self.arrivals.finish()  # asked for (a preemption notice): the snapshot must hold every variable
        if self.in_flight is not None:
            self._deferred.extend(reasons)  # taken at the first safe point after the one in flight
            return
        message = ("requested: " + ", ".join(sorted(set(reasons)))) if reasons else None
        requests, self._requests = self._requests, []
        try:
            self.snapshot_in_background(message, requests, urgent=urgent, in_loop=where == "step")
        except Exception as exc:  # noqa: BLE001 - automatic snapshots never break the user's cell
            self.last_error = f"{type(exc).__name__}: {exc}"
            self._requests[:0] = requests  # the next one answers them

    def answer_with_next_snapshot(self, request_id: str) -> None:
        """Name `request_id` in the next snapshot started at a safe point (how a notice finds its snapshot)."""
        self._requests.append(request_id)
