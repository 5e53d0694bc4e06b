"""A snapshot starts writing large buffers before it has worked out its groups.

`shared_groups` walks every object of the namespace before any group is pickled: 0.3 s at 4 GB with the
disk idle. The buffers pickling will hand over (arrays, tensors, module parameters and gradients, optimizer
state) are the same memory whichever group saves them, so a snapshot into a local folder names them first
and writes them meanwhile. These tests take real snapshots into a real folder and look at the files there.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import torch

from spotwarp_jupyter.engine import timings

from engines import UNSIGNED, make_engine


def _files(folder: Path) -> set[str]:
    return {name for _dir, _subdirs, names in os.walk(folder) for name in names}


class _Probe:
    """Pickled in a stream before that stream's large array: counts the files under `objects` then, waiting
    up to a deadline for one to appear (restored as that count)."""

    def __init__(self, objects: Path, deadline_s: float = 20.0):
        self.objects, self.deadline_s = objects, deadline_s

    def __reduce__(self):
        deadline = time.monotonic() + self.deadline_s
        while not _files(self.objects) and time.monotonic() < deadline:
            time.sleep(0.01)  # polls a condition with a deadline: the writer works in its own thread
        return (int, (len(_files(self.objects)),))


def test_a_large_buffer_is_being_written_before_its_group_is_pickled(tmp_path: Path) -> None:
    store = tmp_path / "store"
    engine = make_engine(store, "early", key=UNSIGNED)
    big = np.random.default_rng(0).random(4_000_000)  # 32 MB: one chunk
    # the probe comes first in the one stream that holds `big`: before the early writes, nothing of this
    # snapshot had reached the folder while its only group was being pickled
    ns = {"holder": {"probe": _Probe(store / "early" / "objects"), "big": big}}
    engine.snapshot_kernel(ns)
    out: dict = {}
    engine.restore_kernel("latest", out)
    assert out["holder"]["probe"] >= 1, "no file was written before the group holding the array was pickled"
    assert np.array_equal(out["holder"]["big"], big)


def test_what_is_written_early_is_named_once_and_hashed_once(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 512))
    opt = torch.optim.Adam(model.parameters())
    model(torch.randn(8, 512)).sum().backward()
    opt.step()  # gradients and Adam's moments: module and optimizer state, all announced
    root = np.random.default_rng(1).random(1_000_000)
    frozen = np.random.default_rng(2).random(300_000)
    frozen.flags.writeable = False  # read-only: not announced, saved the usual way
    wide = torch.randn(600_000)
    ns = {"model": model, "opt": opt, "most": root[:900_000], "slice": torch.randn(1_000_000)[:10],
          "wide": wide[:400_000], "frozen": frozen, "state": {"w": torch.randn(300_000), "n": 3}}
    engine = make_engine(tmp_path / "store", "early", key=UNSIGNED)
    with timings.collecting() as phases:
        manifest = engine.snapshot_kernel(ns)
    # each object hashed once: announced chunks are known again by address, not hashed twice
    assert phases.as_dict()["hash"]["bytes"] == manifest.stats["bytes_total"]
    assert _files(tmp_path / "store" / "early" / "objects") == set(manifest.objects)
    out: dict = {}
    engine.restore_kernel("latest", out)
    for (name, a), b in zip(model.state_dict().items(), out["model"].state_dict().values()):
        assert torch.equal(a, b), name
    assert all(torch.equal(p.grad, q.grad) for p, q in zip(model.parameters(), out["model"].parameters()))
    got = out["opt"].state_dict()["state"]
    for key, state in opt.state_dict()["state"].items():
        assert torch.equal(state["exp_avg"], got[key]["exp_avg"]) and torch.equal(state["exp_avg_sq"], got[key]["exp_avg_sq"])
    assert np.array_equal(out["most"], root[:900_000]) and np.array_equal(out["frozen"], frozen)
    assert torch.equal(out["slice"], ns["slice"]) and torch.equal(out["wide"], wide[:400_000])
    assert torch.equal(out["state"]["w"], ns["state"]["w"]) and out["state"]["n"] == 3


def test_a_buffer_written_early_for_a_variable_that_then_fails_to_pickle_leaves_nothing_behind(tmp_path: Path) -> None:
    big = np.random.default_rng(3).random(3_000_000)
    ns = {"bad": [big, (i for i in range(3))], "ok": np.arange(10)}  # the generator cannot be pickled
    engine = make_engine(tmp_path / "store", "early", key=UNSIGNED)
    manifest = engine.snapshot_kernel(ns)
    record = manifest.kernels["default"]
    assert "generator" in record["skipped"]["bad"] and "ok" in record["variables"]
    # the array's object was written while the groups were worked out, then taken back: no stray object,
    # no temporary, and the stats count only what the manifest names
    assert _files(tmp_path / "store" / "early" / "objects") == set(manifest.objects)
    assert manifest.stats["bytes_written"] == sum(manifest.objects.values())
    # the same array named by another variable later is stored whole
    ns["good"] = big
    second = engine.snapshot_kernel(ns)
    out: dict = {}
    engine.restore_kernel(second.id, out)
    assert np.array_equal(out["good"], big)


class _Refusing(torch.nn.Linear):
    """A module whose `parameters()` raises (a user's override gone wrong); pickling never calls it."""

    def parameters(self, recurse: bool = True):
        raise RuntimeError("not now")


def test_a_value_that_raises_when_looked_at_early_is_still_saved(tmp_path: Path) -> None:
    torch.manual_seed(1)
    odd = _Refusing(512, 1024)  # 2 MB of weights: large enough to be looked for
    engine = make_engine(tmp_path / "store", "early", key=UNSIGNED)
    manifest = engine.snapshot_kernel({"odd": odd, "big": np.arange(1_000_000.0)})
    assert set(manifest.kernels["default"]["variables"]) == {"odd", "big"}
    out: dict = {}
    engine.restore_kernel("latest", out)
    assert torch.equal(out["odd"].weight, odd.weight) and np.array_equal(out["big"], np.arange(1_000_000.0))
