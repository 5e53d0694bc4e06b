"""What committing the workspace files with a kernel snapshot (the cut, engine/files/cut.py) costs.

A local store, a workspace of --files small files (10,000 by default), a kernel with one small variable. For each
repetition, in the same run:
  - unchanged: a kernel snapshot with the cut, nothing changed since the previous one, minus the same snapshot
    without the cut (the time the cut adds), and the part of it spent on the kernel's thread (`take_cut`: the
    pause it adds), against the reference: a stat of every file of the workspace (a walk with `os.scandir` and
    a stat of each: what "an unchanged file costs a stat" can cost at best), the pause and the walk also as the
    process's CPU time, which other work on a shared machine moves less than their wall time;
  - changed: --changed files (4 KiB each) rewritten, then a kernel snapshot with the cut, minus one without it,
    against the reference: writing those bytes as as many files into the same store folder, each made durable
    (written, fdatasync'd, renamed into place, the folder fsync'd once), which is what storing them must do.
Goals (benchmarks/README.md): unchanged at most 50 ms added for 10,000 files; changed at most 1.2x
the reference. Medians of --reps repetitions.

    python benchmarks/bench_cut.py --files 10000 --changed 1000 --reps 5
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent

from common import median, table  # noqa: E402

from spotwarp_jupyter.engine import Settings, SnapshotEngine  # noqa: E402

SMALL = 1024
CHANGED = 4096


def build(root: Path, files: int) -> list[Path]:
    paths = []
    for i in range(files):
        folder = root / f"d{i // 100:03d}"
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"f{i:05d}.txt"
        path.write_bytes(os.urandom(SMALL))
        paths.append(path)
    return paths


def age(paths: list[Path]) -> None:
    """Older than the racy-write window, as files are between two snapshots of a real session."""
    past = time.time() - 120
    for p in paths:
        os.utime(p, (past, past))


def stat_all(root: Path) -> tuple[float, float]:
    """Seconds of a scandir walk with a stat of every entry, and the CPU seconds of it."""
    started, cpu = time.perf_counter(), time.process_time()
    stack = [str(root)]
    while stack:
        with os.scandir(stack.pop()) as it:
            for entry in it:
                st = entry.stat(follow_symlinks=False)
                if entry.is_dir(follow_symlinks=False):
                    stack.append(entry.path)
                del st
    return time.perf_counter() - started, time.process_time() - cpu


def durable_writes(folder: Path, blobs: list[bytes]) -> float:
    folder.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    for i, blob in enumerate(blobs):
        tmp, final = folder / f"w{i}.tmp", folder / f"w{i}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, blob)
            os.fdatasync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, final)
    dfd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)
    took = time.perf_counter() - started
    for p in folder.iterdir():
        p.unlink()
    return took


def snapshot_s(engine: SnapshotEngine, value: int, cut: bool) -> tuple[float, float, float]:
    """Seconds of the whole snapshot, and of its cut (on the kernel's thread), and the CPU seconds of that cut."""
    previous = engine.with_files()  # the kernel's last snapshot holding files, as KernelSession.cut() passes
    started, cpu = time.perf_counter(), time.process_time()
    taken = engine.cut_workspace(previous) if cut else None
    cut_s, cut_cpu = time.perf_counter() - started, time.process_time() - cpu
    engine.snapshot_kernel({"step": value}, "train.ipynb", cut=taken)
    return time.perf_counter() - started, cut_s, cut_cpu


def report(args: argparse.Namespace, result: dict) -> str:
    """The figures as a table, each next to its same-run reference and goal."""
    return table([
        ("measure", "SpotWarp", "reference", "goal"),
        (f"{args.files} files unchanged: added to a kernel snapshot", f"{result['unchanged_added_s'] * 1000:.1f} ms",
         f"stat of every file {result['stat_all_s'] * 1000:.1f} ms", "<= 50 ms"),
        ("  of which on the kernel's thread (its pause)", f"{result['unchanged_pause_s'] * 1000:.1f} ms",
         f"ratio to the stat {result['unchanged_pause_s'] / result['stat_all_s']:.2f}x", ""),
        ("  the same, CPU time", f"{result['unchanged_pause_cpu_s'] * 1000:.1f} ms",
         f"stat {result['stat_all_cpu_s'] * 1000:.1f} ms CPU "
         f"(ratio {result['unchanged_pause_cpu_s'] / result['stat_all_cpu_s']:.2f}x)", ""),
        (f"{args.changed} files changed ({CHANGED} B each): added", f"{result['changed_added_s'] * 1000:.1f} ms",
         f"durable write {result['durable_write_s'] * 1000:.1f} ms (ratio {result['changed_ratio']:.2f}x)",
         "<= 1.2x"),
    ])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=10_000)
    parser.add_argument("--changed", type=int, default=1_000)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--dir", default=None, help="scratch folder (default: a temporary folder)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as scratch:
        root = Path(scratch)
        ws, store = root / "ws", root / "store"
        paths = build(ws, args.files)
        age(paths)
        engine = SnapshotEngine(Settings.resolve(project="bench", storage=str(store), workspace=str(ws), env={}),
                                key=b"bench-key")
        engine.snapshot_kernel({"step": 0}, "train.ipynb", cut=engine.cut_workspace())  # every file stored once
        unchanged, pause, stat_ref, changed, write_ref, pause_cpu, stat_cpu = [], [], [], [], [], [], []
        step = 0
        for rep in range(args.reps):
            step += 1
            without, _, _ = snapshot_s(engine, step, cut=False)
            step += 1
            with_cut, cut_s, cut_cpu = snapshot_s(engine, step, cut=True)
            unchanged.append(with_cut - without)
            pause.append(cut_s)
            pause_cpu.append(cut_cpu)
            walk_s, walk_cpu = stat_all(ws)
            stat_ref.append(walk_s)
            stat_cpu.append(walk_cpu)
            blobs = [os.urandom(CHANGED) for _ in range(args.changed)]
            write_ref.append(durable_writes(store / "bench" / "objects" / "ref", blobs))
            for path, blob in zip(paths[rep * args.changed:(rep + 1) * args.changed] or paths[:args.changed], blobs):
                path.write_bytes(blob)
            step += 1
            without, _, _ = snapshot_s(engine, step, cut=False)
            step += 1
            with_cut, _, _ = snapshot_s(engine, step, cut=True)
            changed.append(with_cut - without)
            age(paths)
            step += 1
            snapshot_s(engine, step, cut=True)  # the aged stats become the baseline of the next repetition
        result = {
            "files": args.files, "changed_files": args.changed, "changed_bytes": args.changed * CHANGED,
            "unchanged_added_s": median(unchanged), "unchanged_pause_s": median(pause), "stat_all_s": median(stat_ref),
            "unchanged_pause_cpu_s": median(pause_cpu), "stat_all_cpu_s": median(stat_cpu),
            "changed_added_s": median(changed), "durable_write_s": median(write_ref),
            "changed_ratio": median(changed) / median(write_ref),
        }
    print(json.dumps(result, indent=2) if args.json else report(args, result))


if __name__ == "__main__":
    main()
