"""Shared measurement helpers: references measured in the same run, medians, memory sampling, tables."""

from __future__ import annotations

import mmap
import os
import statistics
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import psutil

ROOT = Path(__file__).resolve().parent.parent
# The benchmarks share the tests' helpers (a real `spotwarp start`, the storage emulators, fake cloud metadata)
# and measure the checkout they sit in: both go on the import path here, once, for every benchmark (each imports
# this module before those helpers; its own folder is on the path as the script's).
sys.path[:0] = [path for path in (str(ROOT / "tests" / "support"), str(ROOT)) if path not in sys.path]


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


def _direct_writer(path: Path, nbytes: int, count: int, block: int) -> tuple[int, int, list[mmap.mmap]] | None:
    """An O_DIRECT file opened for writing `nbytes` (rounded up to the alignment), and `count` aligned buffers of
    `block` bytes filled with random data; None where O_DIRECT is refused."""
    rounded = (nbytes + _ALIGN - 1) // _ALIGN * _ALIGN
    buffers = _aligned_buffers(count, block)
    for buf in buffers:
        buf.write(os.urandom(1 << 20) * (block >> 20))
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_DIRECT", 0), 0o644)
    except OSError:
        return None
    return fd, rounded, buffers


def _write_block(fd: int, view: memoryview, offset: int) -> None:
    """Write all of `view` at `offset` (pwrite may write less than asked)."""
    done = 0
    while done < view.nbytes:
        done += os.pwrite(fd, view[done:], offset + done)


def direct_write(path: Path, nbytes: int, block: int = 64 << 20, inflight: int = 4) -> float | None:
    """Seconds to write `nbytes` with O_DIRECT, `inflight` blocks at a time, then fsync; None where refused."""
    opened = _direct_writer(path, nbytes, inflight, block)
    if opened is None:
        return None
    fd, rounded, buffers = opened
    offsets = list(range(0, rounded, block))

    def write(i: int) -> None:
        offset = offsets[i]
        _write_block(fd, memoryview(buffers[i % inflight])[: min(block, rounded - offset)], offset)

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


def _open_direct(path: Path) -> tuple[int, int] | None:
    """`path` opened for O_DIRECT reads, and its size; None where the file system refuses O_DIRECT."""
    size = path.stat().st_size
    try:
        return os.open(path, os.O_RDONLY | getattr(os, "O_DIRECT", 0)), size
    except OSError:
        return None


def direct_read(path: Path, block: int = 64 << 20, inflight: int = 4) -> float | None:
    """Seconds to read a file with O_DIRECT (no page cache), `inflight` blocks at a time; None where refused."""
    opened = _open_direct(path)
    if opened is None:
        return None
    fd, size = opened
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
    opened = _open_direct(path)
    if opened is None:
        return None
    fd, size = opened
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


PIECE = 8 << 20  # the streaming references' request size


def stream_read(path: Path, threads: int = 2, piece: int = PIECE) -> float | None:
    """Seconds to read a file with O_DIRECT, `threads` threads each streaming `piece`-byte requests into its
    own reused buffer, taking the next offset as soon as its last read is in (no barrier between requests):
    the read limit of this disk. None where O_DIRECT is refused."""
    opened = _open_direct(path)
    if opened is None:
        return None
    fd, size = opened
    buffers = _aligned_buffers(threads, piece)
    for buf in buffers:  # reused buffers: their pages are in before the clock starts, as a reference's are
        buf.write(bytes(piece))
    offsets = iter(range(0, size, piece))
    lock = threading.Lock()

    def run(buf: mmap.mmap) -> None:
        view = memoryview(buf)
        while True:
            with lock:
                offset = next(offsets, None)
            if offset is None:
                return
            _read_block(fd, view, offset, size)

    started = time.perf_counter()
    try:
        with ThreadPoolExecutor(max_workers=threads) as pool:
            list(pool.map(run, buffers))
    except OSError:
        return None
    finally:
        os.close(fd)
    return time.perf_counter() - started


def stream_write(path: Path, nbytes: int, threads: int = 2, piece: int = PIECE) -> float | None:
    """Seconds to write `nbytes` with O_DIRECT, `threads` threads each streaming `piece`-byte writes from its own
    reused buffer with no barrier, then fsync: the write limit of this disk. None where O_DIRECT is refused."""
    opened = _direct_writer(path, nbytes, threads, piece)
    if opened is None:
        return None
    fd, rounded, buffers = opened
    offsets = iter(range(0, rounded, piece))
    lock = threading.Lock()

    def run(buf: mmap.mmap) -> None:
        while True:
            with lock:
                offset = next(offsets, None)
            if offset is None:
                return
            _write_block(fd, memoryview(buf)[: min(piece, rounded - offset)], offset)

    started = time.perf_counter()
    try:
        with ThreadPoolExecutor(max_workers=threads) as pool:
            list(pool.map(run, buffers))
        os.ftruncate(fd, nbytes)
        os.fsync(fd)
    except OSError:
        return None
    finally:
        os.close(fd)
    return time.perf_counter() - started


def dd_read(path: Path, block: int = 64 << 20) -> float | None:
    """`dd iflag=direct bs=64M`: one thread, one large O_DIRECT block after the other."""
    return direct_read(path, block, inflight=1)


def dd_write(path: Path, nbytes: int, block: int = 64 << 20) -> float | None:
    """`dd oflag=direct conv=fsync bs=64M`: one thread, one large O_DIRECT block after the other, then fsync."""
    return direct_write(path, nbytes, block, inflight=1)


def _fastest(times: dict[str, float | None]) -> float:
    return min(t for t in times.values() if t is not None)


@dataclass
class DiskLimits:
    """This disk's sequential limits for one size, measured in the same run: each shape's seconds, the best.

    `best_*` is the minimum over every shape (buffered, `dd`-style large O_DIRECT blocks, four 64 MiB blocks
    per batch, two and four threads streaming 8 MiB O_DIRECT requests): the limit ratios are taken against.
    `old_best_*` is the minimum over the shapes the earlier reference had (buffered, four 64 MiB blocks per
    batch), printed beside it so the change of reference stays visible.
    """

    writes: dict[str, float | None]
    reads: dict[str, float | None]

    @property
    def buffered_write_s(self) -> float:
        return self.writes["buffered"]

    @property
    def buffered_read_s(self) -> float:
        return self.reads["buffered"]

    @property
    def direct_write_s(self) -> float | None:
        """The batches of four 64 MiB O_DIRECT blocks (the old O_DIRECT reference)."""
        return self.writes["4x64MiB batches"]

    @property
    def direct_read_s(self) -> float | None:
        return self.reads["4x64MiB batches"]

    @property
    def best_write_s(self) -> float:
        return _fastest(self.writes)

    @property
    def best_read_s(self) -> float:
        return _fastest(self.reads)

    @property
    def old_best_write_s(self) -> float:
        return _fastest({k: self.writes[k] for k in OLD_SHAPES})

    @property
    def old_best_read_s(self) -> float:
        return _fastest({k: self.reads[k] for k in OLD_SHAPES})

    def as_dict(self) -> dict[str, float | None]:
        return {**{f"write_{k}_s": v for k, v in self.writes.items()}, **{f"read_{k}_s": v for k, v in self.reads.items()},
                "best_write_s": self.best_write_s, "best_read_s": self.best_read_s,
                "old_best_write_s": self.old_best_write_s, "old_best_read_s": self.old_best_read_s}


OLD_SHAPES = ("buffered", "4x64MiB batches")


def disk_limits(path: Path, nbytes: int, reps: int = 1) -> DiskLimits:
    """Median over `reps` of each shape of writing and reading `nbytes` at `path` (the file is left there);
    every read is cold (the cache dropped first)."""
    write_shapes: dict[str, Callable[[], float | None]] = {
        "buffered": lambda: raw_write(path, nbytes),
        "4x64MiB batches": lambda: direct_write(path, nbytes),
        "dd 64MiB": lambda: dd_write(path, nbytes),
        "2 streams 8MiB": lambda: stream_write(path, nbytes, 2),
        "4 streams 8MiB": lambda: stream_write(path, nbytes, 4),
    }

    def cold(read: Callable[[], float | None]) -> Callable[[], float | None]:
        return lambda: (drop_cache(path), read())[1]

    read_shapes: dict[str, Callable[[], float | None]] = {
        "buffered": lambda: raw_read(path),
        "4x64MiB batches": cold(lambda: direct_read(path)),
        "dd 64MiB": cold(lambda: dd_read(path)),
        "2 streams 8MiB": cold(lambda: stream_read(path, 2)),
        "4 streams 8MiB": cold(lambda: stream_read(path, 4)),
    }
    writes: dict[str, list[float]] = {k: [] for k in write_shapes}
    reads: dict[str, list[float]] = {k: [] for k in read_shapes}
    for _ in range(reps):
        for shapes, out in ((write_shapes, writes), (read_shapes, reads)):
            for name, run in shapes.items():
                took = run()
                if took is not None:
                    out[name].append(took)
    return DiskLimits({k: median(v) if v else None for k, v in writes.items()},
                      {k: median(v) if v else None for k, v in reads.items()})


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
