"""The reference workload (benchmarks/README.md): what a real deep-learning notebook holds.

`build(scale)` returns a namespace: scale 1.0 is about 2 GB, 0.1 about 200 MB.
"""

from __future__ import annotations

import random
from typing import Any


def build(scale: float = 1.0, seed: int = 0) -> dict[str, Any]:
    """A torch model + Adam after one step + scheduler, a NumPy array, a DataFrame, many small objects, code."""
    import numpy as np
    import pandas as pd
    import torch

    torch.manual_seed(seed)
    np.random.seed(seed)
    random.seed(seed)
    width = max(64, int(3_162 * scale ** 0.5))  # 100M parameters at scale 1: 10 layers of width x width
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width, bias=True) for _ in range(10)])
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=10, gamma=0.5)
    x = torch.randn(4, width)
    model(x).square().mean().backward()
    opt.step()
    sched.step()
    opt.zero_grad(set_to_none=True)

    big = np.random.default_rng(seed).random(int(125_000_000 * scale), dtype=np.float32)  # 500 MB at scale 1
    rows = int(2_000_000 * scale)
    frame = pd.DataFrame({
        "a": np.arange(rows, dtype=np.int64),
        "b": np.random.default_rng(seed + 1).random(rows),
        "c": np.random.default_rng(seed + 2).random(rows).astype(np.float32),
        "label": [f"item-{i:09d}-{(i * 7919) % 100_003}" for i in range(rows)],
    })  # ~200 MB at scale 1 (mixed dtypes, a string column)

    class Record:
        def __init__(self, i: int):
            self.i = i
            self.name = f"r{i}"

    records = {f"k{i}": Record(i) for i in range(int(100_000 * max(scale, 0.1)))}

    def loss_fn(out, target):
        return (out - target).square().mean()

    scale_by = lambda v: v * 2  # noqa: E731
    gen = (i for i in range(10))
    return {
        "model": model, "opt": opt, "sched": sched, "big": big, "frame": frame, "records": records,
        "Record": Record, "loss_fn": loss_fn, "scale_by": scale_by, "gen": gen,
    }


def state_bytes(ns: dict[str, Any]) -> int:
    """Approximate bytes of array/tensor state in the workload (the figure ratios are taken against)."""
    import torch

    total = 0
    for p in ns["model"].parameters():
        total += p.numel() * p.element_size()
    for s in ns["opt"].state.values():
        for v in s.values():
            if isinstance(v, torch.Tensor):
                total += v.numel() * v.element_size()
    total += ns["big"].nbytes
    total += int(ns["frame"].memory_usage(deep=True).sum())
    return total
