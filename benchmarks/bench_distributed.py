"""Collective snapshot and restore of a DDP model and its Adam state, against plain DCP in the same run.

Ranks (gloo, forked as a notebook cell forks them) each time, alternating, on the same state and the same store
folder (every parameter moved before each rep, as a training step moves it: no rep reuses an earlier one's
objects): a plain `dcp.save` to a folder of the store against SpotWarp's collective snapshot (DCP, objects, signed
manifest), then a plain `dcp.load` from that folder against SpotWarp's restore (each file checked against its
hash), with the files in the page cache as written and again with it dropped, as on a new host. Both include the
DCP state-dict helpers. The arms alternate which goes first. Figures are medians of `--reps`, as
ratios of the medians and as the median of each rep's own ratio (goal: 1.1). Also the
price of every step (the ranks' agreement on whether to snapshot), as a share of a training step of the model.

    python benchmarks/bench_distributed.py [--mb 256] [--ranks 2] [--reps 3] [--dir DIR] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import tempfile
import time
from pathlib import Path

import common  # noqa: E402  (puts tests/support and the checkout on the import path; drop_cache)
import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _timed(fn) -> float:
    dist.barrier()
    started = time.perf_counter()
    fn()
    dist.barrier()
    return time.perf_counter() - started


def rank_main(rank: int, args: argparse.Namespace, port: int, out: str) -> None:
    from torch.distributed import checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    from spotwarp_jupyter.training import collective

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=args.ranks)
    width = 1024
    layers = max(1, int(args.mb * 2**20 / 4 / (width * width)))
    model = torch.nn.parallel.DistributedDataParallel(
        torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)]))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    model(torch.randn(4, width)).sum().backward()
    opt.step()
    state = {"model": model, "optim": opt}
    loop = collective.CollectivePass(range(1), "bench", state)
    plain_dir = os.path.join(args.dir, "plain")

    def plain_save(rep: int) -> None:
        model_sd, optim_sd = get_state_dict(model, opt)
        dcp.save({"model": model_sd, "optim": optim_sd}, storage_writer=dcp.FileSystemWriter(f"{plain_dir}/{rep}"))

    def plain_load(rep: int) -> None:
        model_sd, optim_sd = get_state_dict(model, opt)
        sd = {"model": model_sd, "optim": optim_sd}
        dcp.load(sd, storage_reader=dcp.FileSystemReader(f"{plain_dir}/{rep}"))
        set_state_dict(model, opt, model_state_dict=sd["model"], optim_state_dict=sd["optim"])

    times: dict[str, list[float]] = {k: [] for k in ("plain_save", "save", "plain_load", "load", "plain_cold_load",
                                                     "cold_load")}
    for rep in range(args.reps):
        with torch.no_grad():  # each rep saves new state, as training does (no object of an earlier rep is reused)
            for param in model.parameters():
                param.add_(1e-3)
        # the two arms alternate which goes first: neither always inherits the other's writeback or page cache
        first, second = ("plain_", "") if rep % 2 == 0 else ("", "plain_")
        saves = {"plain_": lambda: plain_save(rep), "": lambda: loop.snapshot("bench")}
        for arm in (first, second):
            times[f"{arm}save"].append(_timed(saves[arm]))
        manifest = collective.newest(collective.engine().manifests(), "bench")
        loads = {"plain_": lambda: plain_load(rep), "": lambda: loop._load(manifest)}
        for arm in (first, second):
            times[f"{arm}load"].append(_timed(loads[arm]))
        for arm in (first, second):  # as on a new host: nothing of the files in the page cache
            if rank == 0:
                common.drop_cache(Path(args.dir))
            times[f"{arm}cold_load"].append(_timed(loads[arm]))
    # the price of every step: the ranks' agreement (one all-reduce of a flag), against a step of this model
    steps = 500
    bare = _timed(lambda: [None for _ in collective.CollectivePass(range(steps), "agreement", state)]) / steps

    def train_step() -> None:
        model(torch.randn(8, width)).sum().backward()
        opt.step()
        opt.zero_grad()

    step_s = statistics.median(_timed(train_step) for _ in range(5))
    if rank == 0:
        medians = {k: statistics.median(v) for k, v in times.items()}
        state_bytes = sum(p.numel() * 4 for p in model.parameters()) * 3  # weights and Adam's two moments
        with open(out, "w") as f:
            json.dump({"ranks": args.ranks, "state_mb": round(state_bytes / 2**20), "reps": args.reps,
                       **{f"{k}_s": round(v, 3) for k, v in medians.items()},
                       "save_ratio": round(medians["save"] / medians["plain_save"], 3),
                       "load_ratio": round(medians["load"] / medians["plain_load"], 3),
                       # each rep's own ratio: a disk whose speed swings between reps moves both arms of a pair
                       "save_pair_ratio": round(statistics.median(
                           s / p for s, p in zip(times["save"], times["plain_save"])), 3),
                       "load_pair_ratio": round(statistics.median(
                           s / p for s, p in zip(times["load"], times["plain_load"])), 3),
                       "cold_load_ratio": round(medians["cold_load"] / medians["plain_cold_load"], 3),
                       "cold_load_pair_ratio": round(statistics.median(
                           s / p for s, p in zip(times["cold_load"], times["plain_cold_load"])), 3),
                       "agreement_us": round(bare * 1e6, 1), "train_step_s": round(step_s, 4),
                       "step_overhead_pct": round(100 * bare / step_s, 3)}, f)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=256, help="model weights in MiB (the state is 3x: Adam)")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--dir", default=None, help="scratch folder on the disk to measure (the store lives there; emptied at the end)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    args.dir = args.dir or tempfile.mkdtemp(prefix="bench-distributed-")
    os.environ.update({"SPOTWARP_STORAGE": os.path.join(args.dir, "store"), "SPOTWARP_PROJECT": "bench",
                       "SPOTWARP_KEY": os.environ.get("SPOTWARP_KEY", "bench-key"), "SPOTWARP_EVERY": "1h"})
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = os.path.join(args.dir, "result.json")
    try:
        mp.start_processes(rank_main, args=(args, port, out), nprocs=args.ranks, start_method="fork")
        result = json.loads(Path(out).read_text())
    finally:  # several GB a run (each rep's plain folder and objects): none left on the disk
        for folder in ("store", "plain"):
            shutil.rmtree(os.path.join(args.dir, folder), ignore_errors=True)
        Path(out).unlink(missing_ok=True)
    if args.json:
        print(json.dumps(result))
        return
    print(f"{result['ranks']} ranks, {result['state_mb']} MiB of state (DDP + Adam), median of {result['reps']}:")
    print(f"  save: plain dcp.save {result['plain_save_s']:.3f} s, collective snapshot {result['save_s']:.3f} s "
          f"-> {result['save_ratio']:.2f}x, median of each rep's ratio {result['save_pair_ratio']:.2f}x (goal 1.1x)")
    print(f"  load: plain dcp.load {result['plain_load_s']:.3f} s, collective restore {result['load_s']:.3f} s "
          f"-> {result['load_ratio']:.2f}x, median of each rep's ratio {result['load_pair_ratio']:.2f}x (goal 1.1x)")
    print(f"  cold load (page cache dropped): plain dcp.load {result['plain_cold_load_s']:.3f} s, collective restore "
          f"{result['cold_load_s']:.3f} s -> {result['cold_load_ratio']:.2f}x, median of each rep's ratio "
          f"{result['cold_load_pair_ratio']:.2f}x (goal 1.1x)")
    print(f"  each step: the ranks' agreement {result['agreement_us']:.0f} us, {result['step_overhead_pct']:.2f}% of a "
          f"training step of this model ({result['train_step_s'] * 1e3:.0f} ms)")


if __name__ == "__main__":
    main()
