"""How snapshot and restore scale with the state's size and with the number of small objects.

    python benchmarks/bench_scaling.py                         # sizes 0.25-4 GB, counts 1k-1M
    python benchmarks/bench_scaling.py --sizes 0.25,0.5 --counts 1000,10000 --reps 3
    python benchmarks/bench_scaling.py --sizes 4 --counts none --reps 1   # the large end once
    python benchmarks/bench_scaling.py --sizes 1,4 --counts none --reps 3 --breakdown   # where restores' seconds go
    PYTHONPATH=/other/tree python benchmarks/bench_scaling.py ...   # restores by another tree's package (before/after)
    python benchmarks/bench_scaling.py --sizes 1,4 --counts none --trees /main,/branch   # both, alternated, same snapshots

Sizes are the reference workload (workload.py) (model + Adam, array, DataFrame, small objects, code)
scaled to about that many GB of state; counts are a dict of that many small notebook objects.
Every figure is the median of --reps runs divided by a raw reference of the same byte count measured
in the same run: full and unchanged snapshots against this disk's best sequential write, a restore into a
fresh process (cold cache) against its best sequential read; each best is the minimum over shapes
(common.disk_limits: buffered, dd-style 64 MiB O_DIRECT blocks, batches of four 64 MiB blocks, two and
four threads streaming 8 MiB O_DIRECT requests with no barrier). The last column repeats full and restore
against the old references (buffered, or batches of four 64 MiB blocks), so the change of reference stays
visible for one release. `usable` is the same restore's time until the small
variables are bound (a progressive restore); the large ones arrive by `restore`.
A ratio that grows with size means something does not scale: the last column flags it.
`--breakdown` adds, per size, where a full snapshot's seconds go (serialize, hash, write,
fsync: wall and CPU seconds, CPU per GB, against the best write's) and where the restore's seconds go (read, hash, page population, unpickle,
copies, the unpickling thread's wait for reads: wall and CPU seconds, CPU per GB, gathered by
spotwarp_jupyter.engine.timings only when asked) beside the CPU of a cold buffered and an O_DIRECT read,
and of an O_DIRECT read into new memory, whose pages the read faults in as a restore's are: on a VM that
populates pages slowly, that and not the reference read is the floor for a restore into a fresh process.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

HERE = Path(__file__).resolve().parent

import workload  # noqa: E402
from common import (  # noqa: E402
    direct_read,
    direct_read_fresh,
    disk_limits,
    drop_cache,
    median,
    print_phase_header,
    print_phase_lines,
    raw_read,
)

from spotwarp_jupyter.engine import Settings, SnapshotEngine, timings  # noqa: E402

REFERENCE_GB = 1.89  # state of the reference workload at scale 1
RESTORE_CHILD = r"""
import json, sys, time
sys.path.insert(0, sys.argv[2])  # the workload's code is saved by reference, as any imported module's
import numpy, pandas, torch
import torch._dynamo  # an optimizer's first step (or its constructor) imports it, ~1 s: an import, not restore work
from spotwarp_jupyter.engine import Settings, SnapshotEngine
from spotwarp_jupyter.engine import timings
engine = SnapshotEngine(Settings(project="bench", storage=sys.argv[1]), create=False)
ns = {}
def rss(field):  # bytes of /proc/self/status's VmRSS (now) or VmHWM (peak since the reset below)
    return next(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith(field + ":"))
try:
    open("/proc/self/clear_refs", "w").write("5")  # the peak so far (imports) is not the restore's
except OSError:
    pass
rss_before = rss("VmRSS")
collect = timings.collecting() if sys.argv[3:] == ["breakdown"] else None
phases = collect.__enter__() if collect else None
cpu = time.process_time()
started = time.perf_counter()
if hasattr(engine, "restore_kernel_progressive"):
    _m, result, load = engine.restore_kernel_progressive("latest", ns)
else:  # an engine from before progressive restores: usable only once complete
    engine.restore_kernel("latest", ns)
    load = None
usable = time.perf_counter() - started
if load is not None:
    load.wait()
    load.bind_ready(ns)
    assert not load.failure_report(), load.failure_report()
import spotwarp_jupyter  # which tree restored (PYTHONPATH picks it: a before/after runs one bench against two trees)
out = {"engine": spotwarp_jupyter.__file__.rsplit("/", 2)[0], "usable_s": usable,
       "restore_s": time.perf_counter() - started, "names": len(ns),
       "cpu_s": time.process_time() - cpu, "peak_growth": rss("VmHWM") - rss_before,
       "final_growth": rss("VmRSS") - rss_before}
# the first training step of the restored model: its pages really resident, the optimizer's state ready
if "model" in ns:
    step_started = time.perf_counter()
    model, opt = ns["model"], ns["opt"]
    model(torch.randn(4, model[0].in_features)).square().mean().backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    out["first_step_s"] = time.perf_counter() - step_started
if phases is not None:
    out["phases"] = phases.as_dict()
print(json.dumps(out))
"""


class Item:
    """A small object as notebooks hold them by the thousand."""

    def __init__(self, i: int):
        self.i = i
        self.name = f"item-{i}"
        self.tags = (i % 7, i % 11)


def small_objects(count: int) -> dict:
    return {"items": {f"k{i}": Item(i) for i in range(count)}}


def restore_in_child(store: Path, breakdown: bool, tree: str | None = None) -> dict:
    """A restore of `store`'s latest snapshot into a fresh process: its figures (and phases, when asked).
    `tree`: the checkout whose package restores (PYTHONPATH), else the one this process's PYTHONPATH names."""
    drop_cache(store)
    env = dict(os.environ, PYTHONPATH=tree) if tree else None
    # run from the store's folder: `-c` puts the working folder first on sys.path, and run from a checkout
    # that would import its package whatever PYTHONPATH names
    out = subprocess.run([sys.executable, "-c", RESTORE_CHILD, str(store), str(HERE)]
                         + (["breakdown"] if breakdown else []), capture_output=True, text=True, check=True,
                         cwd=store.parent, env=env)
    return json.loads(out.stdout.strip().splitlines()[-1])


def read_cpu(path: Path) -> dict[str, float]:
    """CPU seconds (user + system, all threads) of a cold buffered read, an O_DIRECT read of `path` into reused
    buffers, and one into fresh memory (its pages faulted in by the read, as a restore's are)."""
    out = {}
    for name, read in (("buffered", raw_read), ("direct", direct_read), ("fresh", direct_read_fresh)):
        drop_cache(path)
        cpu = time.process_time()
        wall = read(path)
        out[f"{name}_cpu_s"] = time.process_time() - cpu if wall is not None else float("nan")
        out[f"{name}_wall_s"] = wall if wall is not None else float("nan")
    return out


def breakdown_row(children: list[dict], reads: list[dict], nbytes: int) -> dict:
    """Medians over the repetitions: each phase's wall and CPU seconds, the restore's CPU, the raw reads' CPU."""
    names = sorted({name for child in children for name in child["phases"]})
    phases = {name: {k: median([c["phases"].get(name, {}).get(k, 0.0) for c in children])
                     for k in ("wall_s", "cpu_s", "bytes")} for name in names}
    row = {"bytes": nbytes, "phases": phases, "restore_s": median([c["restore_s"] for c in children]),
           "restore_cpu_s": median([c["cpu_s"] for c in children]),
           "peak_extra": median([c["peak_growth"] - nbytes for c in children]) / max(nbytes, 1),
           "transient": median([c["peak_growth"] - c["final_growth"] for c in children]) / max(nbytes, 1)}
    for key in reads[0]:
        row[key] = median([r[key] for r in reads])
    return row


def snapshot_timed(engine: SnapshotEngine, ns: dict, breakdown: bool) -> tuple[float, object, dict | None]:
    """A full snapshot of `ns`: its seconds, manifest, and (when asked) its phases and CPU seconds."""
    with timings.collecting() if breakdown else contextlib.nullcontext() as phases:
        cpu, started = time.process_time(), time.perf_counter()
        manifest = engine.snapshot_kernel(ns)
        took, cpu = time.perf_counter() - started, time.process_time() - cpu
    return took, manifest, ({"phases": phases.as_dict(), "cpu_s": cpu, "wall_s": took} if phases else None)


def snapshot_breakdown_row(snapshots: list[dict], limits: list, nbytes: int) -> dict:
    """Medians over the repetitions of each snapshot phase's wall and CPU seconds, and the whole snapshot's."""
    names = sorted({name for s in snapshots for name in s["phases"]})
    phases = {name: {k: median([s["phases"].get(name, {}).get(k, 0.0) for s in snapshots])
                     for k in ("wall_s", "cpu_s")} for name in names}
    return {"bytes": nbytes, "phases": phases, "snapshot_s": median([s["wall_s"] for s in snapshots]),
            "snapshot_cpu_s": median([s["cpu_s"] for s in snapshots]),
            "best_write_s": median([x.best_write_s for x in limits])}


def measure(build: Callable[[], dict], scratch: Path, reps: int, breakdown: bool = False,
            trees: list[str | None] | None = None) -> list[dict[str, float]]:
    """Full, unchanged and restore times for the state `build` makes, each as a ratio to a raw reference of its
    bytes; one row per tree in `trees` (whose package restores: the same snapshots, references and cold cache,
    the trees alternated within each repetition, the first one changing every repetition).

    Every repetition's snapshots are taken first; the state is then freed, so each restore (into a fresh
    process) runs beside no second copy of it: the 8 GB point fits in 24 GB.
    """
    trees = trees or [None]
    full, unchanged, limits, reads, stores, snapshots = [], [], [], [], [], []
    children: dict[str | None, list[dict]] = {tree: [] for tree in trees}
    ns = build()
    for rep in range(reps):
        store = scratch / f"store-{rep}"
        engine = SnapshotEngine(Settings(project="bench", storage=str(store)))
        full_s, manifest, snap_phases = snapshot_timed(engine, ns, breakdown)
        full.append(full_s)
        snapshots.append(snap_phases)
        started = time.perf_counter()
        engine.snapshot_kernel(ns)
        unchanged.append(time.perf_counter() - started)
        stores.append((store, manifest.size))
    nbytes = stores[-1][1]
    del ns, engine
    gc.collect()
    for rep, (store, size) in enumerate(stores):
        limits.append(disk_limits(scratch / "raw.bin", max(size, 1)))
        if breakdown:
            reads.append(read_cpu(scratch / "raw.bin"))
        for tree in trees[rep % len(trees):] + trees[:rep % len(trees)]:
            children[tree].append(restore_in_child(store, breakdown, tree))
        shutil.rmtree(store)
    # the best write and read this disk does (minimum over shapes, common.disk_limits), and the old references
    w, r = median([x.best_write_s for x in limits]), median([x.best_read_s for x in limits])
    old_w, old_r = median([x.old_best_write_s for x in limits]), median([x.old_best_read_s for x in limits])
    rows = []
    for tree in trees:
        done = children[tree]
        restore, usable = [c["restore_s"] for c in done], [c["usable_s"] for c in done]
        first_step = [c["restore_s"] + c["first_step_s"] for c in done if "first_step_s" in c]
        rows.append({
            "breakdown": breakdown_row(done, reads, nbytes) if breakdown else None,
            "snapshot_breakdown": snapshot_breakdown_row(snapshots, limits, nbytes) if breakdown else None,
            "engine": done[-1].get("engine", "?"), "load": os.getloadavg(),
            "bytes": nbytes, "raw_write_s": w, "raw_read_s": r, "old_write_s": old_w, "old_read_s": old_r,
            "full_s": median(full), "unchanged_s": median(unchanged), "restore_s": median(restore),
            "usable_s": median(usable), "full_x": median(full) / w, "unchanged_x": median(unchanged) / w,
            "restore_x": median(restore) / r, "usable_x": median(usable) / r,
            "to_first_step_s": median(first_step) if first_step else float("nan"),
            "full_old_x": median(full) / old_w, "restore_old_x": median(restore) / old_r})
    return rows


def growth(rows: list[dict], key: str) -> str:
    """'grows' when the ratio at the largest point is clearly above the smallest's (noise allowed)."""
    if len(rows) < 2:
        return ""
    first, last = rows[0][key], rows[-1][key]
    return "GROWS" if last > first * 1.25 and last - first > 0.1 else "flat"


def print_table(title: str, label: str, rows: list[dict], per_object: bool = False) -> None:
    engines = sorted({row["engine"] for row in rows})
    print(f"\n{title} (restores by the package in {', '.join(engines)}; 'to step': restore to the end of the "
          "restored model's first training step, seconds)")
    header = (f"{label:>10} {'bytes':>10} {'best w/r s':>12} {'full':>14} {'unchanged':>14} {'restore':>14} "
              f"{'usable':>14} {'to step':>8} {'old ref full/restore':>21} {'load':>5}")
    if len(engines) > 1:
        header += "  tree"
    if per_object:
        header += f" {'us/object full/unch/restore':>28}"
    print(header)
    print("-" * len(header))
    for row in rows:
        cell = lambda k: f"{row[k + '_x']:.2f}x {row[k + '_s']:.2f}s"  # noqa: E731
        print(f"{row['point']:>10} {row['bytes'] / 1e6:>8.1f}MB {row['raw_write_s']:>5.2f}/{row['raw_read_s']:<5.2f} "
              f"{cell('full'):>14} {cell('unchanged'):>14} {cell('restore'):>14} {cell('usable'):>14}"
              f" {row.get('to_first_step_s', float('nan')):>8.2f}"
              f" {row['full_old_x']:>9.2f}x/{row['restore_old_x']:.2f}x {row['load'][0]:>5.2f}"
              + (f"  {row['engine']}" if len(engines) > 1 else "")
              + (" " + "/".join(f"{row[k + '_s'] / int(row['point']) * 1e6:.1f}" for k in ("full", "unchanged", "restore"))
                 if per_object else ""))
    if len(rows) > 1 and len(engines) == 1:
        print(f"{'trend':>10} {'':>10} {'':>12} " + " ".join(f"{growth(rows, k + '_x'):>14}"
                                                        for k in ("full", "unchanged", "restore", "usable")))


def print_breakdown(rows: list[dict]) -> None:
    """Per size: each phase's wall and CPU seconds (summed over the threads that ran it) and CPU s/GB,
    against the restore's whole CPU and a raw cold read's (buffered and O_DIRECT) of the same bytes."""
    print_phase_header("where a restore's seconds go (medians; phases run in several threads at once, so their wall "
                       "seconds may add up to more than the restore's)")
    for row in rows:
        b = row["breakdown"]
        print(f"{row['point']:>8} restored by {row['engine']} (load {row['load'][0]:.2f})")
        lines = [(name, p["wall_s"], p["cpu_s"]) for name, p in b["phases"].items()]
        lines += [("restore (all)", b["restore_s"], b["restore_cpu_s"]),
                  ("raw read buffered", b["buffered_wall_s"], b["buffered_cpu_s"]),
                  ("raw read O_DIRECT", b["direct_wall_s"], b["direct_cpu_s"]),
                  ("same, new memory", b["fresh_wall_s"], b["fresh_cpu_s"])]
        print_phase_lines(row["point"], b["bytes"], lines)
        print(f"{row['point']:>8} {'restore':>16}: {b['restore_s'] / b['fresh_wall_s']:.2f}x an O_DIRECT read into new "
              "memory (the floor for a fresh process where page population is slow)")
        print(f"{row['point']:>8} {'peak extra memory':>16}: {b['transient']:.1%} of the state above what the restore "
              f"ends holding (a second copy would show here); {b['peak_extra']:.1%} peak growth beyond the state's "
              "stored bytes (imports and Python objects larger than their pickles count here)")


def print_snapshot_breakdown(rows: list[dict]) -> None:
    """Per size: each snapshot phase's wall and CPU seconds (summed over the threads that ran it), CPU s/GB."""
    print_phase_header("where a full snapshot's seconds go (medians; writer threads run phases at once, so their wall "
                       "seconds may add up to more than the snapshot's; 'snapshot (all)' CPU counts every thread)")
    for row in rows:
        b = row["snapshot_breakdown"]
        lines = [(name, p["wall_s"], p["cpu_s"]) for name, p in b["phases"].items()]
        lines.append(("snapshot (all)", b["snapshot_s"], b["snapshot_cpu_s"]))
        print_phase_lines(row["point"], b["bytes"], lines)
        print(f"{row['point']:>8} {'best raw write':>16} {b['best_write_s']:>8.2f}")


def _points(text: str, kind) -> list:
    if text.strip().lower() in ("", "none"):
        return []
    return [kind(p) for p in text.split(",") if p.strip()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="0.25,0.5,1,2,4", help="GB of state, comma separated ('none' for no sizes)")
    parser.add_argument("--counts", default="1000,10000,100000,1000000", help="numbers of small objects ('none')")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--dir", default=None, help="scratch folder on the disk to measure (default: a temp dir)")
    parser.add_argument("--json", action="store_true", help="also print the figures as JSON")
    parser.add_argument("--trees", default=None,
                        help="checkouts whose packages restore, comma separated, alternated in each repetition "
                             "against the same snapshots (before/after: --trees /main,/branch)")
    parser.add_argument("--breakdown", action="store_true",
                        help="also show where each restore's seconds go, per phase, and its CPU per GB against "
                             "a raw read's (adds a cold buffered and an O_DIRECT read per repetition)")
    args = parser.parse_args()
    trees = [t.strip() for t in args.trees.split(",")] if args.trees else None
    scratch = Path(args.dir or tempfile.mkdtemp(prefix="spotwarp-scaling-"))
    scratch.mkdir(parents=True, exist_ok=True)
    results: dict[str, list[dict]] = {"sizes": [], "counts": []}
    try:
        for gb in _points(args.sizes, float):
            print(f"state of {gb} GB ...", flush=True)
            rows = measure(lambda: workload.build(gb / REFERENCE_GB), scratch, args.reps, args.breakdown, trees)
            results["sizes"].extend({"point": f"{gb} GB", **row} for row in rows)
        for count in _points(args.counts, int):
            print(f"{count} small objects ...", flush=True)
            rows = measure(lambda: small_objects(count), scratch, args.reps, trees=trees)
            results["counts"].extend({"point": f"{count}", **row} for row in rows)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print(f"\nSpotWarp scaling: medians of {args.reps}; each figure as a ratio to this disk's best of the same bytes "
          "(snapshots: best write, restores: best cold read, each the minimum over shapes), then seconds; "
          "'old ref': against the better of buffered and batches of four 64 MiB O_DIRECT blocks")
    if results["sizes"]:
        print_table("state size (reference workload scaled)", "state", results["sizes"])
    if results["counts"]:
        print_table("number of small objects (fixed costs dominate the small end)", "objects", results["counts"],
                    per_object=True)
    if args.breakdown and results["sizes"]:
        print_snapshot_breakdown(results["sizes"])
        print_breakdown(results["sizes"])
    if args.json:
        print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
