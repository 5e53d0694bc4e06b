"""Shared measurement helpers: references measured in the same run, medians, memory sampling, tables."""

from __future__ import annotations

import os
import statistics
import threading
import time
from pathlib import Path
from typing import Callable

import psutil


def median(values: list[float]) -> float:
    return statistics.median(values)


def drop_cache(path: Path) -> None:
    """Evict a file (or a folder's files) from the page cache so the next read is cold."""
    paths = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
    try:
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("1\n")
        return
    except OSError:
        pass
    for p in paths:  # not root: ask the kernel per file
        with open(p, "rb") as f:
            os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)


def raw_write(path: Path, nbytes: int, block: int = 64 << 20) -> float:
    """Seconds to write `nbytes` sequentially with fsync: the write limit."""
    buf = os.urandom(min(block, nbytes))
    started = time.perf_counter()
    with open(path, "wb") as f:
        left = nbytes
        while left > 0:
            n = min(left, len(buf))
            f.write(buf[:n] if n < len(buf) else buf)
            left -= n
        f.flush()
        os.fsync(f.fileno())
    return time.perf_counter() - started


def raw_read(path: Path, block: int = 64 << 20) -> float:
    """Seconds to read a file sequentially from a cold cache: the read limit."""
    drop_cache(path)
    started = time.perf_counter()
    buf = bytearray(block)
    with open(path, "rb", buffering=0) as f:
        while f.readinto(buf):
            pass
    return time.perf_counter() - started


class MemorySampler:
    """Peak extra memory of this process (RSS) plus its children's private memory (USS) while running."""

    def __init__(self, interval: float = 0.01):
        self.proc = psutil.Process()
        self.interval = interval
        self.base = self.proc.memory_info().rss
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> int:
        extra = self.proc.memory_info().rss - self.base
        for child in self.proc.children(recursive=True):
            try:
                extra += child.memory_full_info().uss
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
        return extra

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self._sample())
            self._stop.wait(self.interval)

    def __enter__(self) -> "MemorySampler":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self._sample())


def timed(fn: Callable[[], object]) -> tuple[float, object]:
    started = time.perf_counter()
    result = fn()
    return time.perf_counter() - started, result


def table(rows: list[tuple[str, str, str, str]]) -> str:
    """A plain text table: figure, measured, goal, verdict."""
    header = ("figure", "measured", "goal", "")
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(4)]
    line = lambda r: "  ".join(str(c).ljust(w) for c, w in zip(r, widths))  # noqa: E731
    return "\n".join([line(header), line(tuple("-" * w for w in widths)), *map(line, rows)])
