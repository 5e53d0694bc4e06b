"""Which variables executed code could have touched since the last committed snapshot.

Each cell's code is read before it runs (its syntax tree): every name it loads, stores or deletes is
touched, and so, at every snapshot, is every global name read or written by any function, lambda or
method the notebook has defined (they can run from anywhere: a call, a callback, a torch hook).
Code that reaches variables by other routes (`exec`, `eval`, `globals()`, `vars()`, frames, IPython's
output history, `sys.modules`, magics other than `%spotwarp`) makes the next snapshot a full one. Before
any cell is seen (no hook attached) every snapshot is full. See docs/incremental.md. The analysis of
one piece of code is code_names.py's, shared with progressive restore.
"""

from __future__ import annotations

import ast
import threading
from dataclasses import dataclass
from typing import Union

from .code_names import CellAccess, scan

__all__ = ["AccessTracker", "CellAccess", "Mark", "scan"]


@dataclass(frozen=True)
class Mark:
    """Where a snapshot started in the tracker's log (see AccessTracker.begin / committed)."""

    index: int
    carry: tuple[CellAccess, ...]


# what the cell that loaded SpotWarp does after a snapshot began counts at the next one: it was never seen
_UNTRACKED = CellAccess(frozenset(), frozenset(), "the cell that loaded SpotWarp ran on after the last snapshot")


class AccessTracker:
    """The names touched since the last committed snapshot, from every cell seen (thread-safe)."""

    def __init__(self) -> None:
        self.hooked = False  # a hook passes each cell's code to `note` from now on
        self.attached = False  # True once every cell's code reaches `note` (a whole cell has run since hooking)
        self.untracked_cell = False  # the cell that installed the hook runs on, unseen by it
        self._log: list[CellAccess] = []
        self._deferred: set[str] = set()
        self._deferred_dynamic: str | None = None
        self._running: list[CellAccess] = []  # the cell running now (and code it ran through IPython, %time)
        self._lock = threading.Lock()

    def note(self, code: Union[str, ast.Module]) -> CellAccess:
        """A cell (or code run like one) is about to execute."""
        try:
            access = scan(code)
        except Exception as exc:  # noqa: BLE001 - unreadable code counts as touching everything
            access = CellAccess(frozenset(), frozenset(), f"code not understood ({type(exc).__name__})")
        with self._lock:
            self._log.append(access)
            self._deferred |= access.deferred
            self._deferred_dynamic = self._deferred_dynamic or access.deferred_dynamic
            self._running.append(access)
        return access

    def finished(self) -> None:
        """The running cell has finished."""
        with self._lock:
            self._running = []
            self.untracked_cell = False

    def begin(self) -> tuple[Mark, frozenset[str], str | None]:
        """At a snapshot's start: (mark, names touched since the last commit, why every name counts, or None)."""
        with self._lock:
            touched = set(self._deferred)
            why = None if self.attached else "cell code is not tracked in this process"
            why = why or (f"a notebook function: {self._deferred_dynamic}" if self._deferred_dynamic else None)
            for access in self._log:
                touched |= access.names
                why = why or access.dynamic
            carry = tuple(self._running) + ((_UNTRACKED,) if self.untracked_cell else ())
            return Mark(len(self._log), carry), frozenset(touched), why

    def committed(self, mark: Mark) -> None:
        """The snapshot begun at `mark` is committed: forget what it covered (a cell still running stays)."""
        with self._lock:
            self._log = list(mark.carry) + self._log[mark.index:]
