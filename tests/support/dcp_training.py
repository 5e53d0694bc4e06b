"""A training run over torch.distributed ranks, as a user launches one: `python dcp_training.py CONFIG.json`.

The launcher forks `nprocs` workers with `torch.multiprocessing.start_processes(..., start_method="fork")`; each
joins a gloo process group and trains over `spotwarp.resumable(loader, name="train", state=...)`.

CONFIG keys: `out` (folder for results), `nprocs`, `port` (none: the rendezvous a launcher put in the
environment, `launched` being the function launched), `mode` (`ddp`, or `fsdp`: FSDP2 `fully_shard`),
`epochs`; optional:
- `request_at` ([[epoch, step], ...]): rank 0 asks for a snapshot after those steps (`step` counts the items this
  run's pass has yielded);
- `gate_at` ([epoch, step]): rank 0 writes `out/reached` there and waits until `out/gate` exists;
- `stop_after_request`: after the first requested snapshot, write the full state to `out/full-<nprocs>.pt`, stop;
- `dump_after_request`: the same, and go on;
- `dump_restored`: write the full state as loaded, before any step, to `out/full-<nprocs>.pt`, and stop;
- `die_at` ([rank, n] or [rank, n, where]): that rank SIGKILLs itself inside the snapshot of its n-th
  state_dict() call: there (no `where`), while DCP writes its file (`write`), storing its objects once DCP wrote
  them (`store`: its first `put_object`), or, rank 0, once every rank reported, committing the manifest (`commit`).
Per rank: `out/losses-<rank>.jsonl` (epoch, first sample, loss) and, at the end, `out/result-<rank>.json`
(parameters, the next random draws).
"""

from __future__ import annotations

import json
import os
import random
import signal
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _die(*_args, **_kwargs) -> None:
    os.kill(os.getpid(), signal.SIGKILL)


class Fuse:
    """A value DCP pickles as it writes the rank's file: the rank dies there, its file half written."""

    def __reduce__(self):
        _die()


class Bomb:
    """User state whose n-th state_dict() in one rank kills that rank in that snapshot (a rank lost mid-snapshot)."""

    def __init__(self, rank: int, die_at: list | None):
        self.armed = die_at is not None and die_at[0] == rank
        self.left = die_at[1] if die_at else 0
        self.where = die_at[2] if die_at and len(die_at) > 2 else None

    def state_dict(self) -> dict:
        if self.armed:
            self.left -= 1
            if self.left == 0:
                return self._light()
        return {"bomb": 0}

    def _light(self) -> dict:
        from spotwarp_jupyter.training import collective

        engine = collective.engine()  # the snapshot's: built before the state dicts are taken
        if self.where is None:
            _die()
        elif self.where == "store":
            type(engine.store).put_object = _die
        elif self.where == "commit":
            type(engine).commit_manifest = _die
        return {"bomb": Fuse() if self.where == "write" else 0}

    def load_state_dict(self, state: dict) -> None:
        pass


def full_state(model, opt) -> dict:
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_optimizer_state_dict,
    )

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return {"model": get_model_state_dict(model, options=options),
            "optim": get_optimizer_state_dict(model, opt, options=options)}


def worker(rank: int, cfg: dict) -> None:
    import spotwarp
    from spotwarp_jupyter import safepoints

    out, n = cfg["out"], cfg["nprocs"]
    torch.set_num_threads(1)
    rendezvous = f"tcp://127.0.0.1:{cfg['port']}" if cfg.get("port") else "env://"  # env: a launcher's
    dist.init_process_group("gloo", init_method=rendezvous, rank=rank, world_size=n)
    torch.manual_seed(0)
    random.seed(rank)
    np.random.seed(rank)
    data = torch.Generator().manual_seed(3)
    x = torch.randn(512, 16, generator=data)
    y = x @ torch.randn(16, 1, generator=data)
    dataset = torch.utils.data.TensorDataset(x, y, torch.arange(512))
    sampler = torch.utils.data.DistributedSampler(dataset, shuffle=True, seed=7)
    loader = torch.utils.data.DataLoader(dataset, batch_size=8, sampler=sampler)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Dropout(0.2), torch.nn.Linear(64, 1))
    if cfg["mode"] == "fsdp":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh("cpu", (n,))
        for layer in (model[0], model[3]):
            fully_shard(layer, mesh=mesh)
        model = fully_shard(model, mesh=mesh)
    else:
        model = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=10, gamma=0.9)
    state = {"model": model, "optim": opt, "sched": sched, "bomb": Bomb(rank, cfg.get("die_at"))}
    requested = False
    with open(os.path.join(out, f"losses-{rank}.jsonl"), "a") as log:
        for epoch in range(cfg["epochs"]):
            sampler.set_epoch(epoch)
            for step, (xb, yb, index) in enumerate(spotwarp.resumable(loader, name="train", state=state)):
                stop = cfg.get("dump_restored") or (requested and cfg.get("stop_after_request"))
                if stop or (requested == 1 and cfg.get("dump_after_request")):
                    full = full_state(model, opt)  # collective: every rank takes part, rank 0 holds the result
                    if rank == 0:
                        torch.save(full, os.path.join(out, f"full-{n}.pt"))
                    if stop:
                        return
                    requested = 2  # dumped once
                if rank == 0 and [epoch, step] == cfg.get("gate_at"):
                    open(os.path.join(out, "reached"), "w").close()
                    deadline = time.monotonic() + 120
                    while not os.path.exists(os.path.join(out, "gate")) and time.monotonic() < deadline:
                        time.sleep(0.01)  # held here until the test lets it go (or kills it)
                loss = torch.nn.functional.mse_loss(model(xb), yb)
                opt.zero_grad()
                loss.backward()
                opt.step()
                sched.step()
                log.write(json.dumps([epoch, int(index[0]), loss.item()]) + "\n")
                log.flush()
                if [epoch, step] in cfg.get("request_at", []):
                    if rank == 0:  # one rank asks; all snapshot at the next step
                        safepoints.request("user")
                    requested = requested or 1
    params = full_state(model, opt)["model"]
    result = {"params": {k: v.flatten().tolist() for k, v in params.items()},
              "draws": [torch.rand(3).tolist(), random.random(), float(np.random.rand())]}
    with open(os.path.join(out, f"result-{rank}.json"), "w") as f:
        json.dump(result, f)


def launched(cfg: dict) -> None:
    """The worker as accelerate's `notebook_launcher` starts it: its rank and the rendezvous in the environment."""
    worker(int(os.environ["RANK"]), {**cfg, "port": None})


def main() -> None:
    with open(sys.argv[1]) as f:
        cfg = json.load(f)
    mp.start_processes(worker, args=(cfg,), nprocs=cfg["nprocs"], start_method="fork")


if __name__ == "__main__":
    main()
