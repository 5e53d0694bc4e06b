"""A store written before the engine's layout changed still restores, whole, with the new code.

tests/golden/store_v1 holds one kernel snapshot and one project snapshot written by main at 9c7946b (the
single-module engine: its streams name rebuilders `spotwarp_jupyter.engine.pickling.<name>`). expected.json
holds what that kernel computed right after the snapshot: the model's output, Adam's step counts, the
loader's next epoch, the next random draws.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import torch

from spotwarp_jupyter.engine import SnapshotEngine

from engines import UNSIGNED, make_engine

GOLDEN = Path(__file__).parents[1] / "golden" / "store_v1"


def _engine(tmp_path: Path) -> SnapshotEngine:
    store = tmp_path / "store"
    shutil.copytree(GOLDEN, store, ignore=shutil.ignore_patterns("expected.json"))
    return make_engine(store, "golden", key=UNSIGNED, resolved=False)


def test_the_old_kernel_snapshot_restores_and_carries_on(tmp_path):
    expected = json.loads((GOLDEN / "expected.json").read_text())
    engine = _engine(tmp_path)
    assert engine.verify().ok
    ns: dict = {}
    manifest, result = engine.restore_kernel(expected["kernel"], ns, notebook="train.ipynb")
    assert manifest.id == expected["kernel"] and not result.skipped_at_snapshot
    model, opt, x = ns["model"], ns["opt"], ns["x"]
    # the last bits of a forward pass depend on the CPU's kernels (expected.json was written on another machine)
    torch.testing.assert_close(model(x).detach(), torch.tensor(expected["model_out"]), rtol=1e-5, atol=1e-6)
    assert ns["alias"] is model[0].weight  # shared objects come back shared
    assert [p for g in opt.param_groups for p in g["params"]] == list(model.parameters())
    assert [float(opt.state[p]["step"]) for p in model.parameters()] == expected["adam_steps"]
    opt.zero_grad()
    model(x).sum().backward()
    opt.step()  # the restored optimizer still trains the restored model
    assert float(opt.state[model[0].weight]["step"]) == expected["adam_steps"][0] + 1
    assert [b.tolist() for b in ns["loader"]] == expected["loader_epoch"]
    assert torch.rand(3, generator=ns["loader"].generator).tolist() == expected["torch_next"]
    assert ns["rng"].random() == expected["rng_next"]
    assert ns["scale"](2) == 6 and ns["inc"](1) == 3 and ns["counter"].bump() == 2
    assert ns["arr"].dtype == np.int16 and ns["arr"].sum() == 66 and ns["labels"][49] == "row-49"
    assert ns["scaler"].get_scale() == 512.0 and ns["table"] == {"a": [1, 2], "b": (3, "four")}


def test_the_old_project_snapshot_restores_its_files_and_names_the_kernel(tmp_path):
    expected = json.loads((GOLDEN / "expected.json").read_text())
    engine = _engine(tmp_path)
    latest = engine.with_files()
    assert latest is not None and latest.id == expected["project"]
    assert latest.kernels["train.ipynb"] == engine.get(expected["kernel"]).kernels["train.ipynb"]
    report = engine.restore_files(latest, str(tmp_path / "new-host"))
    assert report.files_restored == 2
    assert (tmp_path / "new-host" / "data" / "notes.txt").read_text() == "kept across hosts\n"
    ns: dict = {}
    engine.restore_kernel("latest", ns, notebook="train.ipynb")
    assert ns["scale"](3) == 9
