"""`resumable(iterable, name)`: a loop whose position is part of every snapshot.

Each step is a safe point: at the top of `__next__`, once the previous step's body has finished,
pending snapshot requests are honoured, so a snapshot never lands inside an optimizer step and
its position is the number of completed steps. After a restore, the next pass under the same name
continues after that step: the random states in force when the pass began are put back, the
iterator is rebuilt from them (the same shuffled order, the same worker seeds) and advanced,
then the random states restored with the snapshot are put back again.

Passes nest: an inner pass records the position of the pass around it (`for epoch in resumable(...)`),
and a restored inner position is only used inside the same outer step.
"""

from __future__ import annotations

import hashlib
import linecache
import os
import sys
import warnings
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from .. import safepoints
from . import collective, loaders
from .rng import capture_rng, restore_rng

_live: dict[str, _Pass] = {}
_stack: list[_Pass] = []
_pending: dict[str, dict[str, Any]] = {}
on_resume: list[Any] = []  # hook(name, position) runs when a pass continues from a restored position


class Resumable:
    """An iterable whose passes resume where a restored snapshot left them."""

    def __init__(self, iterable: Iterable[Any], name: str, state: dict[str, Any] | None = None):
        self.iterable = iterable
        self.name = name
        self.state = state

    def __iter__(self) -> Iterator[Any]:
        if self.state is not None and collective.process_group() is not None:
            return collective.CollectivePass(self.iterable, self.name, self.state)
        return _Pass(self.iterable, self.name)

    def __len__(self) -> int:
        return len(self.iterable)  # type: ignore[arg-type]

    def __repr__(self) -> str:
        return f"resumable({self.iterable!r}, name={self.name!r})"


def resumable(iterable: Iterable[Any], name: str | None = None, state: Mapping[str, Any] | None = None) -> Resumable:
    """Wrap a data loader or any iterable so each step is a safe point and its position survives restore.

    `name` identifies the loop across kernels; by default it is derived from the code calling this
    (the cell's text and line), so re-running the same cell finds the same loop.
    `state` names the objects the loop carries (state_dict()/load_state_dict()): in a rank of a torch.distributed
    process group, snapshots are collective and a new run continues from the newest (collective.py); in a kernel
    they are its variables, saved with it.
    """
    if name is None:
        name = _call_site_name(sys._getframe(1))
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"resumable name must be a non-empty string, got {name!r}")
    checked = None if state is None else collective.check_state(state)
    if isinstance(iterable, Resumable):
        iterable = iterable.iterable
    return Resumable(iterable, name, checked)


class _Pass:
    """One run of a `for` loop over a Resumable."""

    def __init__(self, iterable: Iterable[Any], name: str):
        self.iterable = iterable
        self.name = name
        self.stateful = loaders.is_stateful(iterable)
        self.position = 0  # items handed out
        self.in_step = False
        self.finished = False
        _leave_stack(name)
        outer = _stack[-1] if _stack else None
        self.parent = None if outer is None else (outer.name, outer.completed)
        saved = _pending.get(name)
        if saved is not None and _belongs_here(saved, self.parent):
            del _pending[name]
            self._resume(saved)
            for hook in on_resume:
                hook(name, self.position)
        else:
            self.start_rng = capture_rng()
            self.start_generators = loaders.generator_states(iterable)
            self._it = iter(iterable)
        _stack.append(self)
        _live[name] = self

    def _resume(self, saved: dict[str, Any]) -> None:
        now_rng = capture_rng()
        self.start_rng = saved["rng"]
        self.start_generators = saved.get("generators") or {}
        restore_rng(self.start_rng)
        loaders.set_generator_states(self.iterable, self.start_generators)
        try:
            wanted = int(saved["position"])
            if self.stateful and "loader" in saved:
                self.iterable.load_state_dict(saved["loader"])  # type: ignore[attr-defined]
                self._it = iter(self.iterable)
                self.position = wanted
            else:
                self._it = iter(self.iterable)
                self.position = loaders.fast_forward(self._it, wanted)
                if self.position < wanted:
                    warnings.warn(f"resumable {self.name!r}: the snapshot stopped after step {wanted}, "
                                  f"but this pass has only {self.position} steps", RuntimeWarning, stacklevel=4)
        finally:
            # the random streams as they were at the safe point this pass continues from, not as they are now:
            # whatever ran since the restore (IPython draws from `random` on each kernel_info_request) is undone
            restore_rng(saved.get("rng_now") or now_rng)
            loaders.set_generator_states(self.iterable, saved.get("generators_now") or {})

    @property
    def completed(self) -> int:
        """Steps whose body has finished (the one in progress, if any, is not counted)."""
        return self.position - (1 if self.in_step else 0)

    def __iter__(self) -> _Pass:
        return self

    def __next__(self) -> Any:
        if self.finished:
            raise StopIteration
        self.in_step = False
        safepoints.reached("step")
        try:
            item = next(self._it)
        except StopIteration:
            self._finish()
            raise
        self.position += 1
        self.in_step = True
        return item

    def _finish(self) -> None:
        self.finished = True
        if _live.get(self.name) is self:
            del _live[self.name]
        if self in _stack:
            del _stack[_stack.index(self):]

    def state(self) -> dict[str, Any]:
        """What a snapshot keeps of this pass."""
        state: dict[str, Any] = {
            "position": self.completed,
            "parent": self.parent,
            "rng": self.start_rng,
            "generators": self.start_generators,
            "generators_now": loaders.generator_states(self.iterable),
        }
        if self.stateful:
            state["loader"] = self.iterable.state_dict()  # type: ignore[attr-defined]
            state["position"] = self.position
        return state


def _leave_stack(name: str) -> None:
    """A new pass under `name` ends any abandoned pass of that name and the passes inside it."""
    for index, running in enumerate(_stack):
        if running.name == name:
            del _stack[index:]
            return


def _belongs_here(saved: dict[str, Any], parent: tuple[str, int] | None) -> bool:
    recorded = saved.get("parent")
    if recorded is None or parent is None or recorded[0] != parent[0]:
        return True
    return tuple(recorded) == tuple(parent)


def _call_site_name(frame: Any) -> str:
    filename = frame.f_code.co_filename
    where = f"{frame.f_lineno}{_column(frame)}"
    lines = linecache.getlines(filename)
    if lines:
        digest = hashlib.blake2b("".join(lines).encode(), digest_size=6).hexdigest()
        return f"{digest}:{where}"
    return f"{os.path.basename(filename)}:{where}"


def _column(frame: Any) -> str:
    """`:column` of the call being made, so two loops on one line get two names (Python 3.11+)."""
    positions = getattr(frame.f_code, "co_positions", None)
    if positions is None:
        return ""
    for index, (_line, _end, column, _end_column) in enumerate(positions()):
        if index == frame.f_lasti // 2:
            return f":{column}" if column is not None else ""
    return ""


# -- state provider: the positions of every loop, saved with each snapshot ----------------------

def capture_positions() -> dict[str, dict[str, Any]]:
    """The positions of running passes, and of restored ones not yet resumed."""
    out = {name: dict(state) for name, state in _pending.items()}
    now = None
    for name, running in list(_live.items()):
        if running.finished:
            continue
        try:
            now = capture_rng() if now is None else now
            out[name] = {**running.state(), "rng_now": now}
        except Exception as exc:  # noqa: BLE001 - one loader failing must not fail the snapshot
            warnings.warn(f"resumable {name!r}: position not saved: {type(exc).__name__}: {exc}", RuntimeWarning)
    return out


def positions() -> dict[str, int]:
    """How many steps each running (or restored, not yet resumed) pass has completed: what a snapshot's
    summary says of training, without capturing loader state."""
    out = {name: int(state.get("position") or 0) for name, state in _pending.items()}
    for name, running in list(_live.items()):
        if not running.finished:
            out[name] = int(running.position if running.stateful else running.completed)
    return out


def restore_positions(states: dict[str, dict[str, Any]]) -> None:
    """After a restore: the next pass under each name continues from its saved position."""
    _live.clear()
    _stack.clear()
    _pending.clear()
    _pending.update(states or {})


def pending_positions() -> dict[str, int]:
    """Restored positions waiting for their loop to run again (name -> completed steps)."""
    return {name: int(state["position"]) for name, state in _pending.items()}
