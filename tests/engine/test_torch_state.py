"""torch state through the snapshot engine: tensors out of band, modules, optimizers and schedulers
with their links, gradients, objects saved through state_dict(), NumPy/pandas on the out-of-band route,
and snapshots from a GPU host restored on this CPU-only one (to CPU, with a warning)."""

from __future__ import annotations

import copy

import numpy as np
import pandas as pd
import pytest
import torch

from spotwarp_jupyter.engine import SnapshotEngine, pickling


def _round_trip(engine: SnapshotEngine, namespace: dict) -> tuple[dict, list[str]]:
    engine.snapshot_kernel(namespace)
    fresh: dict = {}
    _manifest, result = engine.restore_kernel("latest", fresh)
    return fresh, result.warnings


def _trained(seed: int = 0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    x, y = torch.randn(16, 4), torch.randn(16, 1)
    for _ in range(3):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        sched.step()
    return model, opt, sched, x, y


def _train_more(model, opt, sched, x, y, steps: int = 4) -> list[float]:
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        sched.step()
        losses.append(loss.item())
    return losses


def _same_tensors(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_model_optimizer_scheduler_continue_identically(engine):
    model, opt, sched, x, y = _trained()
    twin = copy.deepcopy((model, opt, sched))
    ns, warnings = _round_trip(engine, {"model": model, "opt": opt, "sched": sched, "x": x, "y": y})
    assert not any("restored to CPU" in w for w in warnings)
    params = list(ns["model"].parameters())
    assert ns["opt"].param_groups[0]["params"][0] is params[0], "the optimizer must drive the restored model"
    assert ns["sched"].optimizer is ns["opt"]
    assert ns["sched"].get_last_lr() == sched.get_last_lr()
    expected = _train_more(*twin, x, y)
    assert _train_more(ns["model"], ns["opt"], ns["sched"], ns["x"], ns["y"]) == expected
    assert _same_tensors(ns["model"].state_dict(), twin[0].state_dict())


def test_tensors_go_out_of_band():
    weights = torch.randn(256, 256)
    pickled = pickling.dumps({"w": weights, "p": torch.nn.Parameter(torch.ones(1000))})
    assert len(pickled.data) < 2_000
    assert sum(b.nbytes for b in pickled.buffers) == weights.nbytes + 4000


def test_tensor_kinds_round_trip():
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    values = {
        "view": base.t(),  # not contiguous
        "bf16": torch.randn(5).to(torch.bfloat16),
        "empty": torch.empty(0, 3),
        "scalar": torch.tensor(3.5, dtype=torch.float64),
        "ints": torch.arange(10, dtype=torch.int16),
        "bools": torch.tensor([True, False]),
        "leaf": torch.ones(3, requires_grad=True),
    }
    pickled = pickling.dumps(values)
    back = pickling.loads(pickled.codec, pickled.data, [bytearray(b) for b in pickled.buffers])
    for name, value in values.items():
        assert back[name].dtype == value.dtype and back[name].shape == value.shape, name
        assert torch.equal(back[name].detach(), value.detach()), name
    assert back["leaf"].requires_grad and back["leaf"].is_leaf


def test_accumulated_gradients_are_kept(engine):
    model = torch.nn.Linear(3, 1)
    model(torch.ones(2, 3)).sum().backward()  # half of an accumulated step
    ns, _ = _round_trip(engine, {"model": model})
    assert torch.equal(ns["model"].weight.grad, model.weight.grad)
    assert torch.equal(ns["model"].bias.grad, model.bias.grad)


class Counter:
    """A user object whose plain pickle state leaves out what its state_dict() carries."""

    def __init__(self):
        self.count = 0
        self.loaded = False

    def __getstate__(self):
        return {"count": None, "loaded": False}

    def state_dict(self):
        return {"count": self.count}

    def load_state_dict(self, state):
        self.count = state["count"]
        self.loaded = True


def test_objects_with_state_dict_are_saved_through_it(engine):
    counter = Counter()
    counter.count = 41
    ns, _ = _round_trip(engine, {"counter": counter})
    assert ns["counter"].loaded
    assert ns["counter"].count == 41


def test_grad_scaler_through_state_dict(engine):
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0, growth_interval=7)
    scaler._init_scale = 512.0  # what training would have moved
    ns, _ = _round_trip(engine, {"scaler": scaler})
    assert ns["scaler"].state_dict() == scaler.state_dict()


def test_numpy_strided_view_goes_out_of_band():
    big = np.random.rand(300, 400)
    view = big[:, ::2]
    assert not view.flags.c_contiguous and not view.flags.f_contiguous
    pickled = pickling.dumps({"v": view})
    assert len(pickled.data) < 1_000, "the view's bytes must not be copied into the stream"
    assert sum(b.nbytes for b in pickled.buffers) == view.nbytes
    back = pickling.loads(pickled.codec, pickled.data, [bytearray(b) for b in pickled.buffers])["v"]
    assert np.array_equal(back, view)


def test_pandas_numeric_columns_go_out_of_band(engine):
    n = 50_000
    frame = pd.DataFrame({"a": np.random.rand(n), "b": np.arange(n), "c": np.random.rand(n).astype("float32"),
                          "cat": pd.Categorical(np.random.choice(["x", "y"], n)), "s": [f"row{i % 7}" for i in range(n)]})
    pickled = pickling.dumps({"frame": frame})
    numeric = frame[["a", "b", "c"]].memory_usage(index=False).sum()
    assert sum(b.nbytes for b in pickled.buffers) >= numeric
    ns, _ = _round_trip(engine, {"frame": frame})
    pd.testing.assert_frame_equal(ns["frame"], frame)


# -- snapshots from a GPU host --------------------------------------------------------------------

@pytest.fixture
def saved_on_cuda(monkeypatch):
    """Pickle tensors as a GPU host does: the same stream, with device cuda:0 recorded."""
    real = pickling._reduce_tensor

    def as_on_gpu(torch_module, tensor):
        reduced = real(torch_module, tensor)
        if reduced is NotImplemented:
            return reduced
        rebuild, args = reduced
        return rebuild, (*args[:3], "cuda:0", *args[4:])

    monkeypatch.setattr(pickling, "_reduce_tensor", as_on_gpu)
    return monkeypatch


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only host")
def test_gpu_snapshot_restores_to_cpu_with_a_warning(engine, saved_on_cuda):
    model, opt, sched, x, y = _trained(1)
    twin = copy.deepcopy((model, opt, sched))
    engine.snapshot_kernel({"model": model, "opt": opt, "sched": sched, "x": x, "y": y})
    saved_on_cuda.undo()
    ns: dict = {}
    _manifest, result = engine.restore_kernel("latest", ns)
    assert "tensors saved on cuda:0 were restored to CPU: cuda:0 is not available here" in result.warnings
    params = list(ns["model"].parameters())
    assert all(p.device.type == "cpu" for p in params)
    assert all(t.device.type == "cpu" for s in ns["opt"].state.values() for t in s.values() if torch.is_tensor(t))
    assert ns["opt"].param_groups[0]["params"][0] is params[0]
    # training continues on CPU exactly as it would have
    assert _train_more(ns["model"], ns["opt"], ns["sched"], ns["x"], ns["y"]) == _train_more(*twin, x, y)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only host")
def test_device_map_sends_gpu_tensors_where_asked_without_warning(engine, saved_on_cuda):
    engine.snapshot_kernel({"w": torch.arange(4.0)})
    saved_on_cuda.undo()
    ns: dict = {}
    _manifest, result = engine.restore_kernel("latest", ns, device_map={"cuda:0": "cpu"})
    assert torch.equal(ns["w"], torch.arange(4.0))
    assert not any("restored to CPU" in w for w in result.warnings)


def test_tensor_recorded_on_cuda_is_rebuilt_here():
    raw = bytearray(np.arange(3, dtype=np.float32).tobytes())
    with pickling.device_notes() as notes:
        p = pickling._rebuild_tensor(raw, "float32", (3,), "cuda:0", True, True)
    assert isinstance(p, torch.nn.Parameter) and p.requires_grad
    assert torch.equal(p.detach().cpu(), torch.arange(3.0))
    if torch.cuda.is_available():
        assert p.device == torch.device("cuda:0") and notes.moved == set()
    else:
        assert p.device.type == "cpu" and notes.moved == {"cuda:0"}


GPU_HOST = """
%load_ext spotwarp
import torch
from spotwarp_jupyter.engine import pickling as _pickling
_real_reduce = _pickling._reduce_tensor
def _as_on_gpu(torch_module, tensor):  # the stream a GPU host writes: device cuda:0 recorded
    reduced = _real_reduce(torch_module, tensor)
    return reduced if reduced is NotImplemented else (reduced[0], (*reduced[1][:3], "cuda:0", *reduced[1][4:]))
_pickling._reduce_tensor = _as_on_gpu
torch.manual_seed(0)
model = torch.nn.Linear(4, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
model(torch.ones(3, 4)).sum().backward(); opt.step()
"""


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only host")
def test_kernel_restore_of_gpu_snapshot_says_it_moved_to_cpu(start_kernel):
    a = start_kernel("gpu-host")
    a.run(GPU_HOST)
    a.run("%spotwarp snapshot")
    expected = a.value("model.weight.detach().tolist()")
    a.kill()
    b = start_kernel("cpu-host")
    out = b.run("%load_ext spotwarp\n%spotwarp restore latest")
    assert "warning: tensors saved on cuda:0 were restored to CPU: cuda:0 is not available here" in out
    assert b.value("model.weight.detach().tolist()") == expected
    assert b.value("[model.weight.device.type, opt.param_groups[0]['params'][0] is model.weight]") == ["cpu", True]
    b.run("model(torch.ones(3, 4)).sum().backward(); opt.step()")  # training goes on, on CPU


def test_shared_storage_is_written_once_and_small_views_alone_stay_small():
    base = torch.randn(256, 256)
    views = {"base": base, "row": base[3], "col": base[:, 7], "t": base.t(), "half": base[:128]}
    pickled = pickling.dumps(views)
    assert sum(b.nbytes for b in pickled.buffers) == base.nbytes
    back = pickling.loads(pickled.codec, pickled.data, [bytearray(b) for b in pickled.buffers])
    back["base"][3, 7] = 42.0
    assert back["row"][7] == 42.0 and back["col"][3] == 42.0 and back["t"][7, 3] == 42.0 and back["half"][3, 7] == 42.0
    assert [back[k].stride() for k in views] == [v.stride() for v in views.values()]
    assert sum(b.nbytes for b in pickling.dumps({"row": base[3]}).buffers) == 256 * 4
    arr = np.random.rand(100, 100)
    pickled = pickling.dumps({"arr": arr, "v": arr[10:], "t": arr.T})
    assert sum(b.nbytes for b in pickled.buffers) == arr.nbytes


def test_files_reopen_where_they_were_read_and_written(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "big.txt").write_text("".join(f"line {i}\n" for i in range(5000)))
    reader = open("big.txt")  # noqa: SIM115
    [reader.readline() for _ in range(10)]  # the handle has read ahead far beyond line 10
    out = open("out.bin", "wb")  # noqa: SIM115
    out.write(b"abc")
    out.flush()
    pickled = pickling.dumps({"reader": reader, "out": out})
    back = pickling.loads(pickled.codec, pickled.data, pickled.buffers)
    assert back["reader"].readline() == "line 10\n"
    back["out"].write(b"def")
    back["out"].close()
    assert (tmp_path / "out.bin").read_bytes() == b"abcdef"  # reopened for writing, not truncated
    reader.close()
    out.close()
