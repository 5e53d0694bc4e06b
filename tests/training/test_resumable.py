"""`spotwarp.resumable` through the real snapshot engine: stop a loop at every safe point, snapshot,
restore into a fresh namespace with scrambled random generators, re-run the loop, and compare every
item seen and every random draw with an uninterrupted run.
"""

from __future__ import annotations

import random
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
from torchdata.stateful_dataloader import StatefulDataLoader

from spotwarp_jupyter import safepoints
from spotwarp_jupyter.engine import SnapshotEngine
from spotwarp_jupyter.training import (
    capture_positions,
    pending_positions,
    restore_positions,
    resumable,
    state_providers,
)


class Interrupted(Exception):
    """Stands for the host going away at a safe point."""


class CountingDataset(torch.utils.data.Dataset):
    """A map-style dataset that counts its fetches and draws from torch's RNG (augmentation)."""

    def __init__(self, n: int):
        self.data = torch.arange(n * 2, dtype=torch.float32).reshape(n, 2)
        self.fetched = 0

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int):
        self.fetched += 1
        return self.data[i] + torch.rand(2)


def _draws() -> tuple:
    return (random.random(), float(np.random.rand()), torch.rand(2).tolist())


def _scramble() -> None:
    random.seed(12345)
    np.random.seed(12345)
    torch.manual_seed(12345)



@pytest.fixture(autouse=True)
def clean_state():
    restore_positions({})
    safepoints.set_handler(None)
    safepoints.take_pending()
    yield
    safepoints.set_handler(None)
    restore_positions({})


def _extras() -> dict[str, Any]:
    return {name: capture() for name, (capture, _restore) in state_providers().items()}


def _apply_extras(extras: dict[str, Any]) -> None:
    providers = state_providers()
    for name, state in extras.items():
        providers[name][1](state)


def _run(setup: Callable[[], dict], loop: Callable[[dict], None], engine: SnapshotEngine,
         stop_at: int | None, between: Callable[[dict], None] | None = None) -> tuple[dict, tuple, int]:
    """Run `loop` over the namespace `setup` makes; with `stop_at`, snapshot and stop at that safe point,
    then restore into a fresh namespace, run `between` (what else runs in the kernel before the loop goes on)
    and run the loop again. Returns (namespace, next draws, safe points)."""
    restore_positions({})
    ns = setup()
    seen = [0]

    def handler(where: str, reasons: list[str]) -> None:
        seen[0] += 1
        if seen[0] == stop_at:
            engine.snapshot_kernel(ns, extras=_extras())
            raise Interrupted

    safepoints.set_handler(handler)
    try:
        loop(ns)
    except Interrupted:
        safepoints.set_handler(None)
        restore_positions({})  # the new host knows nothing
        _scramble()
        ns = {}
        _manifest, result = engine.restore_kernel("latest", ns)
        _apply_extras(result.extras)
        if between is not None:
            between(ns)
        loop(ns)
    finally:
        safepoints.set_handler(None)
    return ns, _draws(), seen[0]


def _check_every_stop(setup, loop, engine, key: Callable[[dict], Any], between=None) -> int:
    """Stop at every safe point in turn; every run must end exactly like the uninterrupted one."""
    reference_ns, reference_draws, safe_points = _run(setup, loop, engine, None)
    reference = key(reference_ns)
    assert safe_points > 2
    for stop in range(1, safe_points + 1):
        ns, draws, _ = _run(setup, loop, engine, stop, between)
        assert key(ns) == reference, f"stopped at safe point {stop}"
        assert draws == reference_draws, f"stopped at safe point {stop}: random draws differ"
    return safe_points


def _seeded(make: Callable[[], dict]) -> Callable[[], dict]:
    def setup() -> dict:
        random.seed(0)
        np.random.seed(0)
        torch.manual_seed(0)
        return make()
    return setup


def _record(ns: dict, item: Any) -> None:
    value = item.tolist() if isinstance(item, torch.Tensor) else item
    ns["seen"].append((repr(value), random.random(), float(np.random.rand()), torch.rand(1).item()))


def test_list_resumes_after_last_completed_step(engine):
    def loop(ns):
        for x in resumable(ns["items"], name="items"):
            _record(ns, x)

    points = _check_every_stop(_seeded(lambda: {"items": list(range(7)), "seen": []}), loop, engine,
                               key=lambda ns: ns["seen"])
    assert points == 8  # one safe point before each step, one at the end


def test_range_nested_in_resumable_epochs(engine):
    def loop(ns):
        for epoch in resumable(range(3), name="epochs"):
            for x in resumable(range(4), name="steps"):
                _record(ns, (epoch, x))

    _check_every_stop(_seeded(lambda: {"seen": []}), loop, engine, key=lambda ns: ns["seen"])


def test_shuffled_dataloader_order_and_worker_seeds_reproduced(engine):
    def make():
        dataset = CountingDataset(10)
        return {"loader": torch.utils.data.DataLoader(dataset, batch_size=3, shuffle=True), "seen": []}

    def loop(ns):
        for epoch in resumable(range(2), name="epochs"):
            for batch in resumable(ns["loader"], name="train"):
                _record(ns, batch)

    _check_every_stop(_seeded(make), loop, engine,
                      key=lambda ns: (ns["seen"], ns["loader"].dataset.fetched))


def test_dataloader_with_its_own_generator(engine):
    def make():
        generator = torch.Generator().manual_seed(7)
        dataset = torch.utils.data.TensorDataset(torch.arange(12.0))
        return {"loader": torch.utils.data.DataLoader(dataset, batch_size=4, shuffle=True, generator=generator),
                "seen": []}

    def loop(ns):
        for epoch in resumable(range(2), name="epochs"):
            for (batch,) in resumable(ns["loader"], name="train"):
                _record(ns, batch)

    _check_every_stop(_seeded(make), loop, engine, key=lambda ns: ns["seen"])


def test_draws_between_the_restore_and_the_rerun_change_nothing(engine):
    """IPython draws from `random` on every kernel_info_request (a client connecting), and
    anything may run between the restore and the continuation: the loop goes on from the global streams as they
    were at its safe point (Python, NumPy, torch; the loader's generator was already set to its state there)."""
    def make():
        generator = torch.Generator().manual_seed(7)
        dataset = torch.utils.data.TensorDataset(torch.arange(12.0))
        return {"loader": torch.utils.data.DataLoader(dataset, batch_size=4, shuffle=True, generator=generator),
                "seen": []}

    def loop(ns):
        for epoch in resumable(range(2), name="epochs"):
            for (batch,) in resumable(ns["loader"], name="train"):
                _record(ns, batch)

    def between(ns):
        random.random(), np.random.rand(), torch.rand(3)

    _check_every_stop(_seeded(make), loop, engine, key=lambda ns: ns["seen"], between=between)


def test_skipped_batches_are_not_fetched_again(engine):
    def make():
        return {"loader": torch.utils.data.DataLoader(CountingDataset(12), batch_size=2, shuffle=True), "seen": []}

    def loop(ns):
        for batch in resumable(ns["loader"], name="train"):
            _record(ns, batch)

    ns, _, _ = _run(_seeded(make), loop, engine, 4)
    assert len(ns["seen"]) == 6
    assert ns["loader"].dataset.fetched == 12  # 3 batches before the stop, 3 after: none fetched twice


class Augmented(torch.utils.data.Dataset):
    """Random augmentation drawn in the worker process, from the seed the loader handed it."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int):
        return torch.rand(1) + i


@pytest.mark.process
def test_worker_processes_get_the_same_seeds(engine):
    def make():
        return {"loader": torch.utils.data.DataLoader(Augmented(), batch_size=2, shuffle=True, num_workers=1),
                "seen": []}

    def loop(ns):
        for batch in resumable(ns["loader"], name="train"):
            _record(ns, batch)

    reference_ns, reference_draws, _ = _run(_seeded(make), loop, engine, None)
    ns, draws, _ = _run(_seeded(make), loop, engine, 3)
    assert ns["seen"] == reference_ns["seen"]
    assert draws == reference_draws


def test_stateful_dataloader_resumes_through_its_state_dict(engine):
    def make():
        dataset = torch.utils.data.TensorDataset(torch.arange(14.0))
        return {"loader": StatefulDataLoader(dataset, batch_size=3, shuffle=True), "seen": []}

    def loop(ns):
        for epoch in resumable(range(2), name="epochs"):
            for (batch,) in resumable(ns["loader"], name="train"):
                _record(ns, batch)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torchdata's own deprecation notices
        _check_every_stop(_seeded(make), loop, engine, key=lambda ns: ns["seen"])


def test_stateful_dataloader_alone_keeps_its_position(engine):
    """Without resumable, a StatefulDataLoader saved mid-epoch continues where it was."""
    torch.manual_seed(0)
    loader = StatefulDataLoader(torch.utils.data.TensorDataset(torch.arange(10.0)), batch_size=2, shuffle=True)
    it = iter(loader)
    first = [next(it)[0].tolist() for _ in range(2)]
    rest = [b[0].tolist() for b in it]
    torch.manual_seed(0)
    loader = StatefulDataLoader(torch.utils.data.TensorDataset(torch.arange(10.0)), batch_size=2, shuffle=True)
    it = iter(loader)
    assert [next(it)[0].tolist() for _ in range(2)] == first
    engine.snapshot_kernel({"loader": loader})
    ns: dict = {}
    engine.restore_kernel("latest", ns)
    assert [b[0].tolist() for b in ns["loader"]] == rest


def test_generator_iterable_is_advanced_by_drawing(engine):
    def loop(ns):
        for x in resumable((i * i for i in range(6)), name="squares"):
            _record(ns, x)

    _check_every_stop(_seeded(lambda: {"seen": []}), loop, engine, key=lambda ns: ns["seen"])


def test_interrupted_step_is_repeated():
    """A snapshot taken while a step is running (after an error in the body) counts only finished steps."""
    seen = []
    with pytest.raises(KeyError):
        for x in resumable([10, 20, 30], name="body-fails"):
            seen.append(x)
            if x == 20:
                raise KeyError("stop")
    state = capture_positions()["body-fails"]
    assert state["position"] == 1
    restore_positions({"body-fails": state})
    assert list(resumable([10, 20, 30], name="body-fails")) == [20, 30]


def test_restored_position_is_used_once():
    restore_positions({"once": {"position": 2, "parent": None, "rng": capture_positions_rng()}})
    assert pending_positions() == {"once": 2}
    assert list(resumable(range(5), name="once")) == [2, 3, 4]
    assert pending_positions() == {}
    assert list(resumable(range(5), name="once")) == [0, 1, 2, 3, 4]


def test_inner_position_waits_for_its_outer_step():
    rng = capture_positions_rng()
    restore_positions({
        "epochs": {"position": 1, "parent": None, "rng": rng},
        "inner": {"position": 2, "parent": ("epochs", 1), "rng": rng},
    })
    out = [(e, x) for e in resumable(range(3), name="epochs") for x in resumable(range(3), name="inner")]
    assert out == [(1, 2), (2, 0), (2, 1), (2, 2)]


def test_finished_loop_leaves_no_position():
    list(resumable(range(3), name="done"))
    assert "done" not in capture_positions()


def test_default_name_comes_from_the_calling_line():
    def make():
        return resumable([1])

    first, second = make(), make()
    other = resumable([1])
    assert first.name == second.name
    assert first.name != other.name
    outer, inner = resumable([1]), resumable([2])  # one line, two loops
    assert outer.name != inner.name
    assert [(a, b) for a in resumable(range(2)) for b in resumable(range(2))] == [(0, 0), (0, 1), (1, 0), (1, 1)]


def test_len_and_rewrap():
    wrapped = resumable([1, 2, 3], name="len")
    assert len(wrapped) == 3
    assert resumable(wrapped, name="again").iterable == [1, 2, 3]


@pytest.mark.parametrize("bad", ["", "   ", 3])
def test_bad_name_is_a_clear_error(bad):
    with pytest.raises(ValueError, match="non-empty string"):
        resumable([1], name=bad)


def capture_positions_rng():
    from spotwarp_jupyter.training import capture_rng

    return capture_rng()


def test_module_container_is_not_treated_as_a_loader():
    layers = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU())
    assert [type(m).__name__ for m in resumable(layers, name="layers")] == ["Linear", "ReLU"]
    restore_positions({})
    it = iter(resumable(layers, name="layers"))
    next(it)
    state = capture_positions()["layers"]
    assert "loader" not in state and state["position"] == 0  # the first step is still running
