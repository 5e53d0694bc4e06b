"""Write tests/golden/store_v1: one kernel snapshot and one project snapshot made by the engine in the v1 store layout.

Run against the old layout, in a clean environment (manifests record the environment):
    git worktree add /tmp/oldmain 9c7946b
    env -i PATH=/usr/bin:/bin HOME=/tmp/golden-home LANG=C.UTF-8 PYTHONPATH=/tmp/oldmain \
        .venv/bin/python tests/golden/make_store_v1.py /tmp/store_v1
It imports `spotwarp_jupyter.engine.project`, which no longer exists: it documents how the files were made.
"""
import json
import random
import shutil
import sys
from pathlib import Path

import numpy as np
import torch

from spotwarp_jupyter.engine import Settings, SnapshotEngine
from spotwarp_jupyter.engine.project import snapshot_project

out = Path(sys.argv[1])
shutil.rmtree(out, ignore_errors=True)
torch.manual_seed(7)
model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))
opt = torch.optim.Adam(model.parameters(), lr=0.01)
x = torch.arange(20, dtype=torch.float32).reshape(5, 4)
for _ in range(2):
    opt.zero_grad()
    model(x).sum().backward()
    opt.step()


def scale(v):
    return v * 3


class Counter:
    def __init__(self):
        self.n = 0

    def bump(self):
        self.n += 1
        return self.n


gen = torch.Generator().manual_seed(11)
loader = torch.utils.data.DataLoader(list(range(10)), batch_size=3, shuffle=True, generator=gen)
counter = Counter()
counter.bump()
ns = {
    "model": model, "opt": opt, "x": x,
    "arr": np.arange(12, dtype=np.int16).reshape(3, 4), "labels": np.array([f"row-{i}" for i in range(50)]),
    "scale": scale, "inc": lambda v: v + 2, "counter": counter, "loader": loader, "alias": model[0].weight,
    "scaler": torch.amp.GradScaler("cpu", init_scale=512.0), "table": {"a": [1, 2], "b": (3, "four")},
    "rng": random.Random(5),
}
engine = SnapshotEngine(Settings(project="golden", storage=str(out)), key=b"")
kernel = engine.snapshot_kernel(ns, notebook="train.ipynb", message="golden kernel")
ws = out.parent / "golden-ws"
shutil.rmtree(ws, ignore_errors=True)
(ws / "data").mkdir(parents=True)
(ws / "train.ipynb").write_text('{"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}\n')
(ws / "data" / "notes.txt").write_text("kept across hosts\n")
project = snapshot_project(engine, str(ws), kernels={"train.ipynb": kernel.kernels["train.ipynb"]}, message="golden project")
shutil.rmtree(ws)
print(kernel.id, project.id)
expected = {
    "kernel": kernel.id, "project": project.id,
    "model_out": model(x).detach().tolist(),
    "adam_steps": [float(opt.state[p]["step"]) for p in model.parameters()],
    "loader_epoch": [b.tolist() for b in loader],
    "rng_next": ns["rng"].random(),
    "torch_next": torch.rand(3, generator=gen).tolist(),
}
(out / "expected.json").write_text(json.dumps(expected, indent=1) + "\n")
