"""Probe: which read shape fills fresh memory from a cold file fastest, with blake3 over every byte in order.

    python benchmarks/probe_read_pipeline.py --gb 1 --reps 3

Each shape reads the same file cold (page cache dropped), alternated shape after shape, medians of --reps,
against the streaming reference read into reused buffers (common.stream_read). Shapes:
- `objects`: SpotWarp's object read (storage.local_reads) of 64 MiB objects, four objects at a time;
- `pipe N`: N O_DIRECT readers streaming 8 MiB requests into fresh memory (the pages faulted in by the
  reads), blake3 in order on its own thread; `+pop` adds one thread populating (MADV_POPULATE_WRITE)
  32 MiB ahead of the readers; `+thp` leaves huge pages allowed on the destination.
"""

from __future__ import annotations

import argparse
import mmap
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent

from common import PIECE, drop_cache, median, stream_read  # noqa: E402

from spotwarp_jupyter.engine import pages  # noqa: E402
from spotwarp_jupyter.engine.hashing import object_hasher  # noqa: E402
from spotwarp_jupyter.engine.storage.local_reads import read_local_checked  # noqa: E402

MADV_HUGEPAGE, MADV_NOHUGEPAGE = 14, 15
OBJECT = 64 << 20


def pipe(path: Path, readers: int, populate: bool, huge: bool, ahead: int = 32 << 20) -> float:
    size = path.stat().st_size
    started = time.perf_counter()
    dest = mmap.mmap(-1, size)
    dest.madvise(MADV_HUGEPAGE if huge else MADV_NOHUGEPAGE)
    view = memoryview(dest)
    base = pages.address(view)
    count = (size + PIECE - 1) // PIECE
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    lock = threading.Condition()
    state = {"next": 0, "done": set(), "populated": 0}
    hasher = object_hasher()

    def populator() -> None:
        for i in range(count):
            with lock:  # at most `ahead` bytes beyond what the readers took
                lock.wait_for(lambda: i * PIECE < state["next"] * PIECE + ahead)
            pages.populate_range(base + i * PIECE, min(PIECE, size - i * PIECE))

    def reader() -> None:
        while True:
            with lock:
                i = state["next"]
                if i >= count:
                    return
                state["next"] += 1
                lock.notify_all()
            piece = view[i * PIECE:min((i + 1) * PIECE, size)]
            got = 0
            while got < piece.nbytes:
                got += os.preadv(fd, [piece[got:]], i * PIECE + got)
            with lock:
                state["done"].add(i)
                lock.notify_all()

    def hashing() -> None:
        for i in range(count):
            with lock:
                lock.wait_for(lambda: i in state["done"])
            hasher.update(view[i * PIECE:min((i + 1) * PIECE, size)])

    with ThreadPoolExecutor(readers + 2) as pool:
        jobs = [pool.submit(reader) for _ in range(readers)] + [pool.submit(hashing)]
        if populate:
            jobs.append(pool.submit(populator))
        for job in jobs:
            job.result()
    os.close(fd)
    took = time.perf_counter() - started
    view.release()
    dest.close()
    return took


def objects(path: Path) -> float:
    """The object read of local_reads, on 64 MiB slices of the file as if each were an object (unchecked
    hash: the digest is computed, the comparison fails and is ignored: the time is the same)."""
    size = path.stat().st_size
    started = time.perf_counter()
    dest = mmap.mmap(-1, size)
    view = memoryview(dest)
    parts = list(range(0, size, OBJECT))
    slices = []
    for i, start in enumerate(parts):  # one file per object: the slices are cut once, outside the clock
        slices.append(path.parent / f"obj-{i}")
    if not slices[0].exists():
        raise SystemExit("objects not cut")

    def one(i: int) -> None:
        try:
            read_local_checked("0" * 64, str(slices[i]), view[parts[i]:parts[i] + OBJECT])
        except Exception:  # noqa: BLE001
            pass

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(one, range(len(parts))))
    took = time.perf_counter() - started
    view.release()
    dest.close()
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gb", type=float, default=1.0)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--dir", default="/tmp/spotwarp-probe")
    args = parser.parse_args()
    folder = Path(args.dir)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "data.bin"
    size = int(args.gb * (1 << 30)) // PIECE * PIECE
    with open(path, "wb") as f:
        for _ in range(size // PIECE):
            f.write(os.urandom(PIECE))
    with open(path, "rb") as f:
        for i, start in enumerate(range(0, size, OBJECT)):
            (folder / f"obj-{i}").write_bytes(f.read(OBJECT))
    shapes = {
        "reference 2 streams (reused buffers)": lambda: stream_read(path, 2),
        "reference 4 streams (reused buffers)": lambda: stream_read(path, 4),
        "objects (local_reads, 4 at a time)": lambda: objects(path),
        "pipe 2": lambda: pipe(path, 2, False, False),
        "pipe 2 +pop": lambda: pipe(path, 2, True, False),
        "pipe 4 +pop": lambda: pipe(path, 4, True, False),
        "pipe 2 +pop +thp": lambda: pipe(path, 2, True, True),
    }
    times: dict[str, list[float]] = {k: [] for k in shapes}
    for _ in range(args.reps):
        for name, run in shapes.items():
            drop_cache(folder)
            times[name].append(run())
    best = min(median(v) for k, v in times.items() if k.startswith("reference"))
    print(f"{size / 1e9:.2f} GB cold, medians of {args.reps}, load {os.getloadavg()[0]:.2f}")
    for name, v in times.items():
        print(f"{name:>40} {median(v):6.3f} s  {median(v) / best:5.2f}x  ({median(v) / (size / 1e9):.3f} s/GB)")


if __name__ == "__main__":
    main()
