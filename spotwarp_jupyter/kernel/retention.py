"""The policy's `--keep N`: old snapshots pruned after a commit, in a thread of their own, never in the user's cell.

A gc reads every manifest and lists every object: seconds on an object store. Run inline it stalled the
cell that took a synchronous snapshot (and, for a background snapshot, the reaper that lets the next one
start). It runs on its own engine, so it never holds the session engine's lock a snapshot needs; the store's
leases keep it from deleting what a snapshot being written will name (engine/coordination/locks.py). One gc at a time:
commits during a gc ask for one more pass, run right after. A failing gc is logged once per distinct reason.
"""

from __future__ import annotations

import logging
import threading
from typing import Callable

from ..engine import SnapshotEngine

log = logging.getLogger("spotwarp")


class Pruner:
    """Runs `gc(keep)` after commits, one pass at a time, in a daemon thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running = False
        self._next: tuple[Callable[[], SnapshotEngine], int] | None = None
        self._idle = threading.Event()
        self._idle.set()
        self.last_error: str | None = None

    def after_commit(self, engine: Callable[[], SnapshotEngine], keep: int) -> None:
        """Prune to the newest `keep` snapshots soon; `engine` makes the engine the pass runs on."""
        with self._lock:
            self._next = (engine, keep)
            if self._running:
                return  # the running pass picks this one up when it ends
            self._running = True
            self._idle.clear()
        threading.Thread(target=self._run, name="spotwarp-keep", daemon=True).start()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until no gc pass is running or asked for; False on timeout."""
        return self._idle.wait(timeout)

    def _run(self) -> None:
        while True:
            with self._lock:
                job, self._next = self._next, None
                if job is None:
                    self._running = False
                    self._idle.set()
                    return
            make_engine, keep = job
            try:
                make_engine().gc(keep)
            except Exception as exc:  # noqa: BLE001 - a failed prune never reaches the user's cell
                self._failed(f"{type(exc).__name__}: {exc}".strip().splitlines()[0], keep)
            else:
                self.last_error = None

    def _failed(self, reason: str, keep: int) -> None:
        if reason != self.last_error:
            log.warning("SpotWarp: pruning to the newest %d snapshots (--keep) failed: %s", keep, reason)
        self.last_error = reason
