"""Where a restore's or a snapshot's seconds go, per phase, when asked.

A restore's phases: read (an O_DIRECT read's own page faults included), hash, populate (pages the CPU
then copies into), unpickle, copy, wait for reads. A snapshot's: serialize
(pickling, in the capturing thread), detect (the xxh3 digest of each chunk of 1 MiB or more, which finds
those this process stored before), hash (blake3 naming each other stream and chunk, which also finds those
stored already), write (to its temporary or its PUT: staging copies included), fsync (making the batch durable).

Nothing is gathered unless a caller opens `collecting()`: each `phase(...)` is then one test of a
module flag. While collecting, every phase adds its wall seconds and the CPU seconds of the thread
that ran it (phases run in several reading threads at once, so their wall seconds may add up to more
than the restore's), and the bytes it handled.
"""

from __future__ import annotations

import contextlib
import threading
import time
from dataclasses import dataclass, field
from typing import Iterator


@dataclass
class Phases:
    """Seconds (wall, and CPU of the thread that ran each phase) and bytes per phase name."""

    wall: dict[str, float] = field(default_factory=dict)
    cpu: dict[str, float] = field(default_factory=dict)
    nbytes: dict[str, int] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, name: str, wall: float, cpu: float, nbytes: int = 0) -> None:
        with self._lock:
            self.wall[name] = self.wall.get(name, 0.0) + wall
            self.cpu[name] = self.cpu.get(name, 0.0) + cpu
            self.nbytes[name] = self.nbytes.get(name, 0) + nbytes

    def as_dict(self) -> dict[str, dict[str, float]]:
        """{phase: {"wall_s", "cpu_s", "bytes"}}."""
        with self._lock:
            return {name: {"wall_s": self.wall[name], "cpu_s": self.cpu[name], "bytes": self.nbytes[name]}
                    for name in self.wall}


_active: Phases | None = None


@contextlib.contextmanager
def collecting() -> Iterator[Phases]:
    """Gather the phases of whatever runs inside (in any thread) into the Phases yielded."""
    global _active
    previous, _active = _active, Phases()
    try:
        yield _active
    finally:
        _active = previous


@contextlib.contextmanager
def phase(name: str, nbytes: int = 0) -> Iterator[None]:
    """Count the time inside towards `name` while collecting; nothing otherwise."""
    phases = _active
    if phases is None:
        yield
        return
    wall, cpu = time.perf_counter(), time.thread_time()
    try:
        yield
    finally:
        phases.add(name, time.perf_counter() - wall, time.thread_time() - cpu, nbytes)
