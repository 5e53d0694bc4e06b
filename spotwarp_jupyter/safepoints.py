"""Safe points: moments between two steps of user work where a snapshot may be taken.

`resumable` loops call `reached()` between batches; the kernel calls it after each cell.
Anyone (a timer, the server, a preemption watcher, another thread) may `request()` a snapshot;
it is taken at the next safe point, never in the middle of an optimizer step. No Jupyter imports.
"""

from __future__ import annotations

import threading
from typing import Callable

_lock = threading.Lock()
_pending: list[str] = []
_handler: Callable[[str, list[str]], None] | None = None
_in_handler = threading.local()


def set_handler(handler: Callable[[str, list[str]], None] | None) -> None:
    """Install what runs at a safe point: handler(where, pending_reasons). One per process."""
    global _handler
    _handler = handler


def request(reason: str = "user") -> None:
    """Ask for a snapshot at the next safe point (thread-safe, cheap, callable from signal handlers' threads)."""
    with _lock:
        _pending.append(reason)


def take_pending() -> list[str]:
    """The reasons asked for since the last safe point, clearing them."""
    with _lock:
        reasons = list(_pending)
        _pending.clear()
        return reasons


def reached(where: str = "step") -> None:
    """Called by user-facing loops between steps: let the handler snapshot if one is due."""
    handler = _handler
    if handler is None or getattr(_in_handler, "active", False):
        return
    _in_handler.active = True
    try:
        handler(where, take_pending())
    finally:
        _in_handler.active = False
