"""Deadline-bounded waits for what another process does (a file written, a snapshot committed)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable, TypeVar

T = TypeVar("T")


def wait_for(predicate: Callable[[], T], what: str, timeout: float = 60.0, every: float = 0.05) -> T:
    """Poll `predicate` until it returns something truthy and return that; fail naming `what` after `timeout`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every)  # poll interval of a deadline-bounded wait
    raise AssertionError(f"no {what} within {timeout} s")


def read_progress(path: Path) -> int:
    """The step count a training loop in a kernel writes to `path` (0 before its first write)."""
    try:
        return int(path.read_text() or 0)
    except (FileNotFoundError, ValueError):
        return 0
