"""Shared measurement helpers: references measured in the same run, medians, memory sampling, tables."""

from __future__ import annotations

import mmap
import os
import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
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
    """Seconds to write `nbytes` sequentially through the page cache, then fsync (the old write reference)."""
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
    """Seconds to read a file sequentially through the page cache from a cold cache (the old read reference)."""
    drop_cache(path)
    started = time.perf_counter()
    buf = bytearray(block)
    with open(path, "rb", buffering=0) as f:
        while f.readinto(buf):
            pass
    return time.perf_counter() - started


_ALIGN = 4096


def _aligned_buffers(count: int, block: int) -> list[mmap.mmap]:
    """Page-aligned buffers (anonymous maps), as O_DIRECT needs."""
    return [mmap.mmap(-1, block) for _ in range(count)]


def direct_write(path: Path, nbytes: int, block: int = 64 << 20, inflight: int = 4) -> float | None:
    """Seconds to write `nbytes` with O_DIRECT, `inflight` blocks at a time, then fsync; None where refused."""
    rounded = (nbytes + _ALIGN - 1) // _ALIGN * _ALIGN
    buffers = _aligned_buffers(inflight, block)
    for buf in buffers:
        buf.write(os.urandom(1 << 20) * (block >> 20))
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_DIRECT", 0), 0o644)
    except OSError:
        return None
    offsets = list(range(0, rounded, block))

    def write(i: int) -> None:
        offset = offsets[i]
        view = memoryview(buffers[i % inflight])[: min(block, rounded - offset)]
        done = 0
        while done < view.nbytes:
            done += os.pwrite(fd, view[done:], offset + done)

    started = time.perf_counter()
    try:
        with ThreadPoolExecutor(max_workers=inflight) as pool:
            for first in range(0, len(offsets), inflight):
                list(pool.map(write, range(first, min(first + inflight, len(offsets)))))
        os.ftruncate(fd, nbytes)
        os.fsync(fd)
    except OSError:
        return None  # a filesystem that accepts the flag but refuses the writes (tmpfs, some overlays)
    finally:
        os.close(fd)
    return time.perf_counter() - started


def _read_block(fd: int, view: memoryview, offset: int, size: int) -> None:
    """Fill `view` from the file at `offset` (short where the file of `size` bytes ends first)."""
    got = 0
    while offset + got < size and got < view.nbytes:
        n = os.preadv(fd, [view[got:]], offset + got)
        if n <= 0:
            break
        got += n


def direct_read(path: Path, block: int = 64 << 20, inflight: int = 4) -> float | None:
    """Seconds to read a file with O_DIRECT (no page cache), `inflight` blocks at a time; None where refused."""
    size = path.stat().st_size
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECT", 0))
    except OSError:
        return None
    buffers = _aligned_buffers(inflight, block)
    offsets = list(range(0, size, block))

    def read(i: int) -> None:
        _read_block(fd, memoryview(buffers[i % inflight]), offsets[i], size)

    started = time.perf_counter()
    try:
        with ThreadPoolExecutor(max_workers=inflight) as pool:
            for first in range(0, len(offsets), inflight):
                list(pool.map(read, range(first, min(first + inflight, len(offsets)))))
    except OSError:
        return None
    finally:
        os.close(fd)
    return time.perf_counter() - started


def direct_read_fresh(path: Path, block: int = 64 << 20, inflight: int = 4) -> float | None:
    """`direct_read`, but into memory mapped for the whole file just before, as any loader gets for a new
    array: the kernel faults each page in as the read reaches it. What a restore of the same bytes into a
    fresh process cannot avoid; on a VM whose page population is slow, it is the real floor."""
    size = path.stat().st_size
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECT", 0))
    except OSError:
        return None
    started = time.perf_counter()
    target = mmap.mmap(-1, max(size + _ALIGN - 1, 1) // _ALIGN * _ALIGN)
    view = memoryview(target)

    def read(offset: int) -> None:
        _read_block(fd, view[offset:offset + block], offset, size)

    try:
        with ThreadPoolExecutor(max_workers=inflight) as pool:
            list(pool.map(read, range(0, size, block)))
        took = time.perf_counter() - started
    except OSError:
        return None
    finally:
        os.close(fd)
        view.release()
        target.close()
    return took


@dataclass
class DiskLimits:
    """This disk's sequential limits for one size, measured in the same run: each way, and the better one.

    `buffered_*` are the old references (page cache, fsync'd writes, cold reads); `best_*` the better of
    those and O_DIRECT with several blocks in flight: the real limits ratios are taken against.
    """

    buffered_write_s: float
    buffered_read_s: float
    direct_write_s: float | None
    direct_read_s: float | None

    @property
    def best_write_s(self) -> float:
        return min(t for t in (self.buffered_write_s, self.direct_write_s) if t is not None)

    @property
    def best_read_s(self) -> float:
        return min(t for t in (self.buffered_read_s, self.direct_read_s) if t is not None)

    def as_dict(self) -> dict[str, float | None]:
        return {"buffered_write_s": self.buffered_write_s, "buffered_read_s": self.buffered_read_s,
                "direct_write_s": self.direct_write_s, "direct_read_s": self.direct_read_s,
                "best_write_s": self.best_write_s, "best_read_s": self.best_read_s}


def disk_limits(path: Path, nbytes: int, reps: int = 1) -> DiskLimits:
    """Median over `reps` of each way to write and read `nbytes` at `path` (the file is left there)."""
    bw, br, dw, dr = [], [], [], []
    for _ in range(reps):
        dw.append(direct_write(path, nbytes))
        dr.append(direct_read(path))
        bw.append(raw_write(path, nbytes))
        br.append(raw_read(path))
    direct_w = [t for t in dw if t is not None]
    direct_r = [t for t in dr if t is not None]
    return DiskLimits(median(bw), median(br), median(direct_w) if direct_w else None,
                      median(direct_r) if direct_r else None)


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


def print_phase_header(title: str) -> None:
    """The head of a per-phase table (`print_phase_lines` prints its rows)."""
    print(f"\n{title}")
    header = f"{'state':>8} {'phase':>16} {'wall s':>8} {'CPU s':>8} {'CPU s/GB':>9}"
    print(header)
    print("-" * len(header))


def print_phase_lines(point: str, nbytes: int, lines: list[tuple[str, float, float]]) -> None:
    """One state's rows of a per-phase table: each (phase, wall s, CPU s), with CPU s per GB of `nbytes`."""
    for name, wall, cpu in lines:
        print(f"{point:>8} {name:>16} {wall:>8.2f} {cpu:>8.2f} {cpu / (nbytes / 1e9):>9.2f}")


def table(rows: list[tuple[str, str, str, str]]) -> str:
    """A plain text table: figure, measured, goal, verdict."""
    header = ("figure", "measured", "goal", "")
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(4)]
    line = lambda r: "  ".join(str(c).ljust(w) for c, w in zip(r, widths))  # noqa: E731
    return "\n".join([line(header), line(tuple("-" * w for w in widths)), *map(line, rows)])
