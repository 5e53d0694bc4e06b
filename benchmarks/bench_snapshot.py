"""Snapshot and restore speed, pause and memory on the reference workload (workload.py), as ratios.

    python benchmarks/bench_snapshot.py            # the reference workload (~2 GB)
    python benchmarks/bench_snapshot.py --scale 0.1 --train-pairs 2 --every 15   # quick (~200 MB)

Every time is a median of --reps runs, divided by a reference measured in the same run: this disk's
best sequential write and read of the state's bytes (the better of a buffered write + fsync or cold read
and O_DIRECT with several 64 MiB blocks in flight). The rows marked "old reference" repeat the snapshot
and restore figures against the buffered write + fsync and the buffered cold read (the older references).
`--breakdown` adds where the synchronous full snapshot's seconds go (serialize, hash, write,
fsync: wall and CPU seconds per phase, medians), gathered by spotwarp_jupyter.engine.timings.
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent

import workload  # noqa: E402
from common import (  # noqa: E402
    MemorySampler,
    disk_limits,
    drop_cache,
    median,
    print_phase_header,
    print_phase_lines,
    table,
    timed,
)

from spotwarp_jupyter.engine import Settings, timings  # noqa: E402
from spotwarp_jupyter.kernel.policy import Policy  # noqa: E402
from spotwarp_jupyter.kernel.session import KernelSession  # noqa: E402

RESTORE_CHILD = r"""
import json, sys, time
sys.path.insert(0, sys.argv[2])  # the workload's code is saved by reference, as any imported module's
t0 = time.perf_counter()
import numpy, pandas, torch
import torch._dynamo  # an optimizer's first step (or its constructor) imports it, ~1 s: an import, not restore work
t1 = time.perf_counter()
from spotwarp_jupyter.engine import Settings, SnapshotEngine
engine = SnapshotEngine(Settings(project="bench", storage=sys.argv[1]))
ns = {}
t2 = time.perf_counter()
engine.restore_kernel("latest", ns)
t3 = time.perf_counter()
print(json.dumps({"imports_s": t1 - t0, "restore_s": t3 - t2, "names": sorted(ns)}))
"""


# The cells a notebook would have run to define the workload's code (the tracker learns what they touch).
DEFINITIONS = """
class Record:
    def __init__(self, i):
        self.i = i
        self.name = f"r{i}"
def loss_fn(out, target):
    return (out - target).square().mean()
scale_by = lambda v: v * 2
"""


def session_for(ns: dict, store: Path, every: float = 1e9, tracked: bool = False) -> KernelSession:
    """A session on `ns`; `tracked`: as in a kernel with the extension loaded, cells reach its access tracker."""
    settings = Settings(project="bench", storage=str(store))
    session = KernelSession(ns, {}, settings, Policy(enabled=True, every_s=every, after_cell=True, max_var_size=None))
    if tracked:
        session.access.hooked = session.access.attached = True
        session.access.note(DEFINITIONS)
        session.access.finished()
    return session


def cell(session: KernelSession, source: str) -> None:
    """What the kernel's hook does for a cell that ran `source` (the benchmark then runs its equivalent)."""
    session.access.note(source)
    session.access.finished()


def background(session: KernelSession) -> tuple[float, dict]:
    """Trigger to committed manifest for a background snapshot; returns (seconds, stats)."""
    started = time.perf_counter()
    job = session.snapshot_in_background()
    session.wait_in_flight()
    took = time.perf_counter() - started
    assert session.last is not None and session.last_error is None, session.last_error
    return took, {**session.last.stats, "pause_s": job.pause_s if job is not None else None}


def after_a_call(session: KernelSession, figures: dict, reps: int, raw_w: float, snap_bytes: int) -> tuple:
    """The unchanged snapshot after a cell that only called a notebook function reading the model, its optimizer
    and the array: their groups are pickled again (the function could have changed them), their bytes are not."""
    cell(session, "def peek():\n    return model, opt, big\n")
    background(session)  # the definition's own snapshot
    called = []
    for _ in range(reps):
        cell(session, "peek()")
        called.append(background(session))
    figures["called_time_ratio"] = median([t for t, _ in called]) / raw_w
    figures["called_s"] = median([t for t, _ in called])
    figures["called_written_fraction"] = median([s["bytes_written"] for _, s in called]) / snap_bytes
    figures["called_groups_written"] = median([s["groups_written"] for _, s in called])
    return ("unchanged snapshot after a call of a notebook function", f"{figures['called_time_ratio']:.3f}x raw write "
            f"({figures['called_s']:.2f} s; re-pickled {figures['called_groups_written']:.0f} groups, written "
            f"{figures['called_written_fraction'] * 100:.3f}%)", "< 0.1x", "ok" if figures["called_time_ratio"] < 0.1 else "MISSED")


def print_breakdown(breakdowns: list[dict], state: int) -> None:
    """Medians of each phase of the synchronous full snapshots: wall and CPU seconds (all its threads), CPU s/GB."""
    print_phase_header("where a full snapshot's seconds go (medians; writer threads run at once, so phases' wall "
                       "seconds may add up to more than the snapshot's)")
    names = sorted({n for b in breakdowns for n in b}, key=lambda n: (n == "snapshot (all)", n))
    print_phase_lines(f"{state / 1e9:.2f} GB", state,
                      [(name, median([b.get(name, {}).get("wall_s", 0.0) for b in breakdowns]),
                        median([b.get(name, {}).get("cpu_s", 0.0) for b in breakdowns])) for name in names])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scale", type=float, default=1.0, help="1.0 = ~2 GB reference workload, 0.1 = ~200 MB")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--cells", type=int, default=60, help="cells run for the latency figure")
    parser.add_argument("--train-pairs", type=int, default=3,
                        help="training windows of one interval each, without then with snapshots, interleaved")
    parser.add_argument("--train-only", action="store_true", help="measure only the training throughput figure")
    parser.add_argument("--cost-trials", type=int, default=4, help="snapshots timed for the training time lost per snapshot")
    parser.add_argument("--cost-steps", type=int, default=3, help="steps timed before and after each of them for the pace")
    parser.add_argument("--every", type=float, default=60.0, help="snapshot interval during the training run")
    parser.add_argument("--dir", default=None, help="scratch folder on the disk to measure (default: a temp dir)")
    parser.add_argument("--json", action="store_true", help="also print the figures as JSON")
    parser.add_argument("--breakdown", action="store_true", help="also show where a full snapshot's seconds go")
    args = parser.parse_args()

    scratch = Path(args.dir or tempfile.mkdtemp(prefix="spotwarp-bench-"))
    scratch.mkdir(parents=True, exist_ok=True)
    print(f"building the workload (scale {args.scale}) ...", flush=True)
    ns = workload.build(args.scale)
    state = workload.state_bytes(ns)
    print(f"state: {state / 1e9:.2f} GB", flush=True)
    figures: dict[str, float] = {}
    rows = []

    if args.train_only:  # the training figure alone, on a store holding one snapshot
        store = scratch / "store-train"
        limits = disk_limits(scratch / "raw.bin", state)
        raw_w = limits.best_write_s
        figures.update(raw_write_s=raw_w, raw_read_s=limits.best_read_s)
    else:
        # -- full snapshot (synchronous, then background) vs raw write ---------------------------
        full_sync, full_bg, pauses, mems, limits, breakdowns = [], [], [], [], [], []
        snap_bytes = 0
        for rep in range(args.reps):
            store = scratch / f"store-full-{rep}"
            limits.append(disk_limits(scratch / "raw.bin", state))  # this disk's best write and read of `state` bytes
            with timings.collecting() as phases:
                cpu = time.process_time()
                took, manifest = timed(lambda: session_for(ns, store).snapshot())
            full_sync.append(took)
            breakdowns.append({**phases.as_dict(), "snapshot (all)": {"wall_s": took, "cpu_s": time.process_time() - cpu}})
            snap_bytes = manifest.stats["bytes_written"]
            shutil.rmtree(store)
            session = session_for(ns, store)
            took, stats = background(session)  # timed alone: sampling /proc/<pid>/smaps slows the writer
            full_bg.append(took)
            pauses.append(stats["pause_s"])
            shutil.rmtree(store)
            with MemorySampler() as mem:
                background(session_for(ns, store))
            mems.append(mem.peak)
            if rep < args.reps - 1:
                shutil.rmtree(store)
        raw_w = median([x.best_write_s for x in limits])
        old_w = median([x.buffered_write_s for x in limits])  # the older reference: buffered + fsync
        figures["raw_write_s"] = raw_w
        figures["buffered_write_s"] = old_w
        figures["direct_write_s"] = median([x.direct_write_s or float("nan") for x in limits])
        figures["full_sync_ratio"] = median(full_sync) / raw_w
        figures["full_background_ratio"] = median(full_bg) / raw_w
        figures["full_bandwidth_vs_raw"] = raw_w / median(full_bg)
        figures["pause_ms"] = median(pauses) * 1000
        figures["extra_memory_fraction"] = median(mems) / state
        rows.append(("full snapshot, background (trigger -> commit)", f"{figures['full_bandwidth_vs_raw']:.2f}x raw write bandwidth "
                     f"({median(full_bg):.2f} s vs {raw_w:.2f} s)", ">= 0.9x", "ok" if figures["full_bandwidth_vs_raw"] >= 0.9 else "MISSED"))
        rows.append(("full snapshot, synchronous", f"{raw_w / median(full_sync):.2f}x raw write bandwidth", "", ""))
        rows.append(("  the same against the old reference (buffered write + fsync)",
                     f"{old_w / median(full_bg):.2f}x background, {old_w / median(full_sync):.2f}x synchronous "
                     f"({old_w:.2f} s)", "", ""))
        rows.append(("pause of the kernel per background snapshot", f"{figures['pause_ms']:.0f} ms", "<= 50 ms", "ok" if figures["pause_ms"] <= 50 else "MISSED"))
        rows.append(("extra peak memory during a snapshot", f"{figures['extra_memory_fraction'] * 100:.1f}% of state "
                     f"({median(mems) / 1e6:.0f} MB)", "<= 25%", "ok" if figures["extra_memory_fraction"] <= 0.25 else "MISSED"))

        # -- unchanged, and one 500 MB array changed -----------------------------------------------
        store = scratch / f"store-full-{args.reps - 1}"
        session = session_for(ns, store, tracked=True)
        background(session)  # this session's own first snapshot: the baseline untouched groups are reused from
        unchanged = []
        for _ in range(args.reps):
            cell(session, "print('step done')")  # a cell that names none of the variables
            unchanged.append(background(session))
        figures["unchanged_written_fraction"] = median([s["bytes_written"] for _, s in unchanged]) / snap_bytes
        figures["unchanged_time_ratio"] = median([t for t, _ in unchanged]) / raw_w
        figures["unchanged_s"] = median([t for t, _ in unchanged])
        figures["unchanged_groups_reused"] = median([s["groups_reused"] for _, s in unchanged])
        figures["unchanged_groups_written"] = median([s["groups_written"] for _, s in unchanged])
        rows.append(("unchanged snapshot: bytes written", f"{figures['unchanged_written_fraction'] * 100:.3f}% of state", "< 1%",
                     "ok" if figures["unchanged_written_fraction"] < 0.01 else "MISSED"))
        rows.append(("unchanged snapshot: time", f"{figures['unchanged_time_ratio']:.3f}x raw write "
                     f"({figures['unchanged_s']:.2f} s; groups reused {figures['unchanged_groups_reused']:.0f}, "
                     f"re-pickled {figures['unchanged_groups_written']:.0f})", "< 0.1x",
                     "ok" if figures["unchanged_time_ratio"] < 0.1 else "MISSED"))
        rows.append(after_a_call(session, figures, args.reps, raw_w, snap_bytes))
        changed = []
        for _ in range(args.reps):
            cell(session, "big += 1.0")
            ns["big"] += 1.0
            changed.append(background(session)[1]["bytes_written"] / ns["big"].nbytes)
        figures["changed_array_write_factor"] = median(changed)
        rows.append((f"after one {ns['big'].nbytes / 1e6:.0f} MB array changed: bytes written", f"{figures['changed_array_write_factor']:.3f}x the changed bytes",
                     "<= 1.1x", "ok" if figures["changed_array_write_factor"] <= 1.1 else "MISSED"))

        # -- restore into a fresh process vs a cold raw read -----------------------------------------
        restores, imports = [], []
        reads = [x.best_read_s for x in limits]
        old_reads = [x.buffered_read_s for x in limits]
        for _ in range(args.reps):
            drop_cache(store)
            out = subprocess.run([sys.executable, "-c", RESTORE_CHILD, str(store), str(HERE)], capture_output=True, text=True, check=True)
            result = json.loads(out.stdout.strip().splitlines()[-1])
            restores.append(result["restore_s"])
            imports.append(result["imports_s"])
        figures["raw_read_s"] = median(reads)
        figures["buffered_read_s"] = median(old_reads)
        figures["restore_ratio"] = median(restores) / median(reads)
        figures["imports_s"] = median(imports)
        rows.append(("restore into a fresh process (cold cache)", f"{figures['restore_ratio']:.2f}x best raw read "
                     f"({median(restores):.2f} s vs {median(reads):.2f} s) + {median(imports):.1f} s imports", "<= 1.1x + start",
                     "ok" if figures["restore_ratio"] <= 1.1 else "MISSED"))
        rows.append(("  the same against the old reference (buffered cold read)",
                     f"{median(restores) / median(old_reads):.2f}x ({median(old_reads):.2f} s)", "", ""))

        # -- cell latency with automatic snapshots --------------------------------------------------
        import numpy as np

        work = np.random.default_rng(0).random((400, 400))

        def run_cell(i: int, session: KernelSession | None) -> None:
            if session is not None:
                cell(session, "for _ in range(6):\n    work @ work\ncounter = i\nif i % 5 == 0:\n    big[i] += 1.0")
            for _ in range(6):
                work @ work
            ns["counter"] = i
            if i % 5 == 0:
                ns["big"][i] += 1.0  # one chunk of the big array changes now and then

        def run_cells(session: KernelSession | None, min_snapshots: int = 0) -> tuple[list[float], int]:
            # at least --cells cells, and until `min_snapshots` automatic snapshots have started
            lat, started_snapshots, i = [], 0, 0
            while i < args.cells or started_snapshots < min_snapshots:
                started = time.perf_counter()
                run_cell(i, session)
                if session is not None:
                    before = session.last_started_at
                    session.automatic.at_safe_point("cell", [])
                    started_snapshots += session.last_started_at != before
                lat.append(time.perf_counter() - started)
                i += 1
            if session is not None:
                session.wait_in_flight()
            return lat, started_snapshots

        off, _ = run_cells(None)
        auto = session_for(ns, store, every=1.0, tracked=True)
        auto.automatic.started_at = 0.0  # due at the first cell
        on, taken = run_cells(auto, min_snapshots=4)
        figures["cell_median_added_ms"] = (median(on) - median(off)) * 1000
        figures["cell_max_ms"] = max(on) * 1000
        figures["cell_max_off_ms"] = max(off) * 1000
        figures["cell_snapshots"] = taken
        rows.append((f"cell median latency added ({taken} snapshots every 1 s in {len(on)} cells)", f"{figures['cell_median_added_ms']:.1f} ms "
                     f"(median {median(off) * 1000:.0f} -> {median(on) * 1000:.0f} ms)", "<= 50 ms",
                     "ok" if figures["cell_median_added_ms"] <= 50 else "MISSED"))
        rows.append(("longest cell with snapshots on", f"{figures['cell_max_ms']:.0f} ms (off: {figures['cell_max_off_ms']:.0f} ms)",
                     "no stall > 300 ms", "ok" if figures["cell_max_ms"] - median(off) * 1000 <= 300 else "MISSED"))

    # -- training throughput with snapshots every N s ---------------------------------------------
    import torch

    from spotwarp_jupyter import safepoints

    model, opt = ns["model"], ns["opt"]
    width = model[0].in_features
    batch = torch.randn(8, width)

    def cpu_seconds() -> float:
        """CPU time of this process and its reaped children (the forked snapshot writers), user and system."""
        own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime

    def train(seconds: float, session: KernelSession | None) -> tuple[float, float]:
        """Steps per second over `seconds` of training, and CPU seconds per step, snapshot writers included;
        with a session, its policy snapshots at the steps: once, the window being one interval long (a second
        one due in the window's last step would be waited for, counting a whole write against one interval)."""
        first = session.last_started_at if session else None

        def once(where: str, reasons: list[str]) -> None:
            if session.last_started_at == first:
                session.automatic.at_safe_point(where, reasons)

        safepoints.set_handler(once if session else None)
        steps, started, cpu = 0, time.perf_counter(), cpu_seconds()
        while time.perf_counter() - started < seconds:
            loss = model(batch).square().mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            steps += 1
            safepoints.reached("step")
        if session is not None:
            session.wait_in_flight()  # a snapshot still writing counts against this window
        elapsed = time.perf_counter() - started
        safepoints.set_handler(None)
        return steps / elapsed, (cpu_seconds() - cpu) / steps

    trained = session_for(ns, store, every=args.every, tracked=True)
    trained.snapshot()  # the running session's last snapshot, before the training cell starts
    # the training cell, running through every snapshot taken at its steps
    trained.access.note("for step in loader:\n    loss = model(batch).square().mean()\n    opt.zero_grad()\n"
                        "    loss.backward()\n    opt.step()\n    sched.step()")
    # Interleaved windows of one snapshot interval each, off then on: a machine whose load changes over
    # minutes slows both arms of a pair alike, where one long run of each would compare different loads.
    if args.train_pairs > 0:  # --train-pairs 0: no throughput windows
        off, on = [], []
        for _pair in range(args.train_pairs):
            off.append(train(args.every, None))
            trained.last_started_at = time.time() - args.every  # due at the window's first step: one per interval
            on.append(train(args.every, trained))
        off.append(train(args.every, None))  # each on-window sits between two off-windows
        slowdowns = [1 - o[0] / ((a[0] + b[0]) / 2) for o, a, b in zip(on, off, off[1:])]
        # CPU per step counts the work snapshots add (the writer, copy-on-write faults) whatever else loads the
        # machine; the wall-clock slowdown also carries the load's swings between windows
        cpu_costs = [o[1] / ((a[1] + b[1]) / 2) - 1 for o, a, b in zip(on, off, off[1:])]
        figures["train_slowdown"] = median(slowdowns)
        figures["train_slowdowns"] = slowdowns
        figures["train_cpu_per_step_added"] = median(cpu_costs)
        figures["train_cpu_per_step_s"] = median([o[1] for o in off])
        rows.append((f"training throughput, snapshots every {args.every:.0f} s",
                     f"{figures['train_slowdown'] * 100:+.1f}% slower (median of {len(slowdowns)} interleaved pairs: "
                     + ", ".join(f"{x * 100:+.1f}%" for x in slowdowns)
                     + f"; {median([o[0] for o in off]):.2f} -> {median([o[0] for o in on]):.2f} steps/s)",
                     "within 2%", "ok" if figures["train_slowdown"] <= 0.02 else "MISSED"))
        rows.append(("training CPU per step added by snapshots (writer included)",
                     f"{figures['train_cpu_per_step_added'] * 100:+.1f}% ("
                     + ", ".join(f"{x * 100:+.1f}%" for x in cpu_costs)
                     + f"; {figures['train_cpu_per_step_s']:.2f} s of CPU per step without)", "", ""))

    # -- training time lost per snapshot, staged (the loop's writer) against forked --------------------
    # Each snapshot's cost directly: the steps run from its start (its pause included) until its writer is
    # done, against the same number of steps at the pace of the steps just before and after it, alternating
    # writers; this sees a 1 s cost that the load's swings between 60 s windows hide.
    lost: dict[str, list[float]] = {"staged": [], "fork": []}
    trained.access.note("for step in loader:\n    loss = model(batch).square().mean()\n    opt.zero_grad()\n"
                        "    loss.backward()\n    opt.step()\n    sched.step()")

    def one_step() -> None:
        loss = model(batch).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()

    def pace() -> float:
        started = time.perf_counter()
        for _ in range(args.cost_steps):
            one_step()
        return (time.perf_counter() - started) / args.cost_steps

    for trial in range(args.cost_trials):
        for writer in ("staged", "fork") if trial % 2 == 0 else ("fork", "staged"):
            before = pace()
            started, steps = time.perf_counter(), 0
            job = trained.snapshot_in_background(in_loop=writer == "staged")
            assert job is not None and job.writer == writer, (job, writer)
            while steps == 0 or not job.done.is_set():
                one_step()
                steps += 1
            during = time.perf_counter() - started
            trained.wait_in_flight()
            lost[writer].append(during - steps * (before + pace()) / 2)
    for writer, label in (("staged", "staged copy (a loop's step)"), ("fork", "forked writer (as before)")):
        if not lost[writer]:  # --cost-trials 0
            continue
        figures[f"train_lost_per_snapshot_{writer}_s"] = median(lost[writer])
        rows.append((f"training time lost per snapshot, {label}",
                     f"{median(lost[writer]):.2f} s = {median(lost[writer]) / args.every * 100:.1f}% of {args.every:.0f} s ("
                     + ", ".join(f"{x:.2f}" for x in lost[writer]) + " s)", "within 2%" if writer == "staged" else "",
                     ("ok" if median(lost[writer]) / args.every <= 0.02 else "MISSED") if writer == "staged" else ""))

    print()
    print(f"SpotWarp snapshot benchmark: state {state / 1e9:.2f} GB, best raw write {raw_w:.2f} s, best raw cold read "
          f"{figures['raw_read_s']:.2f} s, medians of {args.reps}")
    print(table(rows))
    if args.breakdown and not args.train_only:
        print_breakdown(breakdowns, state)
    if args.json:
        print(json.dumps(figures, indent=2))
    shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
