"""The adaptive cadence with default settings: training overhead and redo window on the reference workload (workload.py).

    python benchmarks/bench_cadence.py --scale 0.25 --pairs 12 --window 10     # ~500 MB, about 5 minutes

One training loop over the workload's model, in windows of --window seconds that alternate SpotWarp off and on
(off, on, off, ..., off): a machine whose load changes over minutes slows both arms alike, and many short windows
pooled average the swings out. An on window goes on until its writer is done and the steps after it that measure
its cost are taken. In the on windows the kernel session's default policy snapshots at the loop's steps, as in a
notebook with nothing configured; the on windows form one continuous loop (the session's clocks skip the off
windows), so the cadence is the one a loop of that length gets. Figures: the throughput and CPU per step the
snapshots take, when the first step snapshot was committed after the loop's start, the intervals the cadence chose,
the largest span of training a loss could have redone (a snapshot's step to the commit of the next one), and the
status's cadence.
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent

import workload  # noqa: E402
from common import median, table  # noqa: E402  (it sets the import path)

from spotwarp_jupyter import safepoints  # noqa: E402
from spotwarp_jupyter.engine import Settings  # noqa: E402
from spotwarp_jupyter.kernel.policy import MAX_OVERHEAD, Policy  # noqa: E402
from spotwarp_jupyter.kernel.session import KernelSession  # noqa: E402

LOOP = ("for step in loader:\n    loss = model(batch).square().mean()\n    opt.zero_grad()\n"
        "    loss.backward()\n    opt.step()\n    sched.step()")


def cpu_seconds() -> float:
    """CPU time of this process and its reaped children (forked snapshot writers), user and system."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def window_log(on: list[tuple], off: list[tuple], spans: list[tuple[float, float]], near: list[tuple[int, float]],
               log: list[dict]) -> list[dict]:
    """Per on window: the training time it lost (its steps' wall time beyond the same steps at the pace of the off
    windows either side of it), split into the steps a snapshot's flight or its after-steps held (`near`) and the
    others, against what the session charged the snapshots that started in it (`LoopMeter.log`)."""
    rows = []
    for k, ((_, _, steps, seconds), (lo, hi), (near_steps, near_s)) in enumerate(zip(on, spans, near)):
        pace = (off[k][3] / off[k][2] + off[k + 1][3] / off[k + 1][2]) / 2
        flights = [f for f in log if lo <= f["started"] < hi]
        rows.append({"seconds": seconds, "steps": steps, "off_pace_s": pace, "lost_s": seconds - steps * pace,
                     "lost_near_s": near_s - near_steps * pace,
                     "lost_elsewhere_s": (seconds - near_s) - (steps - near_steps) * pace,
                     "charged_s": sum(f["cost"] for f in flights), "flights": flights})
    return rows


def print_window_log(rows: list[dict]) -> None:
    """The window log as a table, each flight's measurement under its window."""
    print("\nper on window: the training time lost against the off windows either side, and what the session charged")
    print("  window   steps  off pace   lost (near a snapshot, elsewhere)  charged | per flight: seconds/steps, "
          "pace before/after, pause, aftermath -> cost")
    for k, row in enumerate(rows, 1):
        print(f"  {k:2d} {row['seconds']:6.1f}s {row['steps']:5d} {row['off_pace_s']:8.3f}s {row['lost_s']:6.2f}s "
              f"({row['lost_near_s']:6.2f}s, {row['lost_elsewhere_s']:6.2f}s) {row['charged_s']:6.2f}s | " + "; ".join(
                  f"{f['seconds']:.2f}s/{f['steps']}, {f['pace_before']:.3f}/"
                  + ("-" if f["pace_after"] is None else f"{f['pace_after']:.3f}")
                  + f", {f['pause']:.2f}s, {f['aftermath']:+.2f}s -> {f['cost']:.2f}s" for f in row["flights"]))
    steady = rows[1:]
    if steady:
        print(f"  after the first window: lost {sum(r['lost_s'] for r in steady):.2f} s "
              f"({sum(r['lost_near_s'] for r in steady):.2f} s near a snapshot, "
              f"{sum(r['lost_elsewhere_s'] for r in steady):.2f} s elsewhere), "
              f"charged {sum(r['charged_s'] for r in steady):.2f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scale", type=float, default=0.25, help="1.0 = ~2 GB reference workload, 0.1 = ~200 MB")
    parser.add_argument("--pairs", type=int, default=2, help="on windows, each between two off windows")
    parser.add_argument("--window", type=float, default=60.0, help="seconds per window")
    parser.add_argument("--threads", type=int, default=0,
                        help="torch threads for the training steps (0: torch's default); 1 keeps a shared machine's "
                             "other load from turning into spin-waits between a step's threads")
    parser.add_argument("--dir", default=None, help="scratch folder on the disk to measure (default: a temp dir)")
    parser.add_argument("--json", action="store_true", help="also print the figures as JSON")
    args = parser.parse_args()

    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    scratch = Path(args.dir or tempfile.mkdtemp(prefix="spotwarp-cadence-"))
    print(f"building the workload (scale {args.scale}) ...", flush=True)
    ns = workload.build(args.scale)
    state = workload.state_bytes(ns)
    print(f"state: {state / 1e9:.2f} GB", flush=True)
    model, opt = ns["model"], ns["opt"]
    batch = torch.randn(8, model[0].in_features)

    session = KernelSession(ns, {}, Settings(project="bench", storage=str(scratch / "store")), Policy())
    session.access.hooked = session.access.attached = True
    session.cell_started("setup", "model, opt, sched, big, frame, records = build()")
    session.cell_ended()
    session.snapshot()  # the notebook's state before the training cell: as at a setup cell's end
    session.cell_started("train", LOOP)
    session.access.note(LOOP)

    starts: list[float] = []  # on-clock seconds of each snapshot's step
    commits: list[float] = []  # on-clock seconds of the first step that saw it committed
    writers: list[str] = []  # which writer each snapshot at a step used (staged, fork, thread)
    on_spans: list[tuple[float, float]] = []  # perf_counter span of each on window
    near: list[tuple[int, float]] = []  # per on window: steps (and their seconds) a snapshot's flight or its after-steps held
    on_clock = 0.0

    def window(seconds: float, on: bool) -> tuple[float, float]:
        """Steps per second and CPU seconds per step over one window; `on`: the session snapshots at the steps."""
        nonlocal on_clock
        safepoints.set_handler(session.automatic.at_safe_point if on else None)
        if on:
            session.automatic.meter.new_cell()  # the off window's time is no step
        steps, started, cpu = 0, time.perf_counter(), cpu_seconds()
        last, near_steps, near_s = started, 0, 0.0
        seen_start, seen_last = session.last_started_at, session.last
        # an on window goes on stepping while a writer runs and over the steps after it that the session charges
        # it: the steps it slows are the ones it costs
        while time.perf_counter() - started < seconds or (on and (session.in_flight is not None
                                                                  or session.automatic.meter.measuring)):
            loss = model(batch).square().mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            steps += 1
            safepoints.reached("step")
            if on:
                dt, last = time.perf_counter() - last, time.perf_counter()
                if session.automatic.meter.measuring:
                    near_steps, near_s = near_steps + 1, near_s + dt
                now = on_clock + time.perf_counter() - started
                if session.last_started_at != seen_start:
                    seen_start = session.last_started_at
                    starts.append(now)
                if session.last is not seen_last:
                    seen_last = session.last
                    commits.append(now)
                    writers.append(str(session.last.stats.get("writer")))
        if on:
            session.wait_in_flight()  # its bookkeeping (the writer is done)
            if session.last is not seen_last:
                commits.append(on_clock + time.perf_counter() - started)
                writers.append(str(session.last.stats.get("writer")))
        elapsed = time.perf_counter() - started
        if on:
            on_spans.append((started, started + elapsed))
            near.append((near_steps, near_s))
        safepoints.set_handler(None)
        if on:
            on_clock += elapsed
        else:  # the session's clocks skip the off window: one continuous loop
            for name in ("last_started_at", "last_snapshot_at", "loop_started_at"):
                if getattr(session, name) is not None:
                    setattr(session, name, getattr(session, name) + elapsed)
        return steps / elapsed, (cpu_seconds() - cpu) / steps, steps, elapsed

    off, on = [], []
    for pair in range(args.pairs):
        print(f"pair {pair + 1}/{args.pairs}: off window, then on window ...", flush=True)
        off.append(window(args.window, False))
        on.append(window(args.window, True))
    off.append(window(args.window, False))
    slowdowns = [1 - o[0] / ((a[0] + b[0]) / 2) for o, a, b in zip(on, off, off[1:])]
    # all windows pooled: with many short windows the load's swings fall on both arms alike
    pooled = 1 - (sum(o[2] for o in on) / sum(o[3] for o in on)) / (sum(o[2] for o in off) / sum(o[3] for o in off))
    # after the first on window, which holds the loop's first full snapshot (a one-time cost, paid once per
    # kernel however long it trains): the steady cadence's share of training time
    steady = (1 - (sum(o[2] for o in on[1:]) / sum(o[3] for o in on[1:]))
              / (sum(o[2] for o in off[1:]) / sum(o[3] for o in off[1:]))) if len(on) > 1 else None
    cpu_added = [o[1] / ((a[1] + b[1]) / 2) - 1 for o, a, b in zip(on, off, off[1:])]
    intervals = [b - a for a, b in zip(starts, starts[1:])]
    spans = [c - s for s, c in zip(starts, commits[1:])]  # a loss just before commit k+1 redoes from start k
    redo = max([commits[0] if commits else float("inf"), *spans])
    cadence = session.automatic.cadence().as_dict()
    windows = window_log(on, off, on_spans, near, list(session.automatic.meter.log))
    figures = {"state_bytes": state, "slowdown": median(slowdowns), "slowdowns": slowdowns, "slowdown_pooled": pooled,
               "slowdown_steady": steady,
               "cpu_per_step_added": median(cpu_added), "first_commit_s": commits[0] if commits else None,
               "snapshots": len(starts), "intervals_s": intervals, "redo_window_observed_s": redo,
               "cadence": cadence, "costs_s": list(session.automatic.meter.costs),
               "writes_s": list(session.automatic.meter.writes), "writers": writers,
               "windows": windows,
               "steps_per_s_off": median([o[0] for o in off])}
    rows = [
        ("training throughput, default settings (adaptive cadence)",
         f"{figures['slowdown'] * 100:+.1f}% slower (median of {len(slowdowns)} interleaved pairs: "
         + ", ".join(f"{x * 100:+.1f}%" for x in slowdowns)
         + f"; {median([o[0] for o in off]):.2f} -> {median([o[0] for o in on]):.2f} steps/s)",
         "", ""),
        ("  the same, all windows pooled (steps / seconds, on against off), the first full snapshot included",
         f"{pooled * 100:+.1f}% slower over {sum(o[3] for o in on):.0f} s on, {sum(o[3] for o in off):.0f} s off",
         "", ""),
        ("  the same after the first on window (the steady cadence; the first full snapshot is paid once)",
         "n/a (one pair)" if steady is None else
         f"{steady * 100:+.1f}% slower over {sum(o[3] for o in on[1:]):.0f} s on, {sum(o[3] for o in off[1:]):.0f} s off",
         f"within {MAX_OVERHEAD:.0%}", "" if steady is None else "ok" if steady <= MAX_OVERHEAD else "MISSED"),
        ("training CPU per step added by snapshots (writers included)",
         f"{figures['cpu_per_step_added'] * 100:+.1f}% (" + ", ".join(f"{x * 100:+.1f}%" for x in cpu_added) + ")",
         "", ""),
        ("first step snapshot committed after the loop's start",
         "none" if not commits else f"{commits[0]:.1f} s", "within 10 s",
         "ok" if commits and commits[0] <= 10 else "MISSED"),
        ("snapshots at steps, intervals chosen",
         f"{len(starts)} in {on_clock:.0f} s of training: " + ", ".join(f"{x:.1f}" for x in intervals) + " s", "", ""),
        ("training a loss could have redone (largest, observed)", f"{redo:.1f} s", "<= 60 s",
         "ok" if redo <= 60 else "MISSED"),
        ("what each snapshot cost the loop (measured by the session)",
         ", ".join(f"{x:.2f}" for x in session.automatic.meter.costs) + " s; written in "
         + ", ".join(f"{x:.1f}" for x in session.automatic.meter.writes) + " s; writers " + ", ".join(writers), "", ""),
        ("the status's cadence", cadence["text"], "", ""),
    ]
    print()
    print(f"SpotWarp adaptive cadence benchmark: state {state / 1e9:.2f} GB, windows of {args.window:.0f} s, "
          f"{torch.get_num_threads()} torch thread(s)")
    print(table(rows))
    print_window_log(windows)
    if args.json:
        print(json.dumps(figures, indent=2))
    shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
