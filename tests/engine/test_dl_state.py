"""Deep-learning state across hosts: kernel A snapshots and is SIGKILLed, kernel B in another
folder restores, and each check is of behaviour (what the restored objects still do), not only of values.
"""

from __future__ import annotations

import ast

import pytest

pytestmark = pytest.mark.slow  # real kernels, each test ~20-40 s


def _report(kernel, code: str) -> dict:
    """Run `code` that prints one `@@{...}` line; return that dict."""
    out = kernel.run(code)
    line = [ln for ln in out.splitlines() if ln.startswith("@@")][-1]
    return ast.literal_eval(line[2:])


def _move(start_kernel, work: str, checks: str, env: dict | None = None) -> tuple[dict, dict, str]:
    """`work` in kernel A, snapshot, `checks` there; SIGKILL; restore in kernel B, `checks` again.

    Returns (A's report, B's report, B's restore output)."""
    a = start_kernel("hostA", **(env or {}))
    a.run("%load_ext spotwarp\n" + work)
    a.run("%spotwarp snapshot\n%spotwarp off")  # no later snapshot: B restores this one
    on_a = _report(a, checks)
    a.kill()
    b = start_kernel("hostB", **(env or {}))
    restored = b.run("%load_ext spotwarp\n%spotwarp restore latest")
    return on_a, _report(b, checks), restored


# -- item 1: nothing about one variable fails a snapshot ---------------------------------------------

ODD_WORK = r'''
import warnings
warnings.simplefilter("ignore")
import torch
coo = torch.sparse_coo_tensor(torch.tensor([[0, 1, 1], [2, 0, 2]]), torch.tensor([3., 4., 5.]), (2, 3))
unc = torch.sparse_coo_tensor(torch.tensor([[0, 0, 2]]), torch.tensor([1., 2., 5.]), (3,))  # not coalesced
csr = coo.to_sparse_csr()
class Unsized:
    @property
    def nbytes(self):
        raise ValueError("size unknown")
class Faceless:
    @property
    def __class__(self):
        raise RuntimeError("no class today")
unsized, faceless = Unsized(), Faceless()
w = torch.arange(4.0)
'''

ODD_CHECKS = r'''
print("@@" + repr({
    "coo": [str(coo.layout), coo.is_coalesced(), coo.to_dense().tolist()],
    "unc": [unc.is_coalesced(), unc._indices().tolist(), unc._values().tolist(), unc.to_dense().tolist()],
    "csr": [str(csr.layout), csr.crow_indices().tolist(), (csr @ torch.ones(3, 1)).tolist()],
    "w": w.tolist(),
}))
'''


def test_sparse_tensors_are_saved_and_an_odd_variable_skips_only_itself(start_kernel):
    a = start_kernel("hostA")
    a.run("%load_ext spotwarp\n" + ODD_WORK)
    out = a.run("%spotwarp snapshot")
    assert "SpotWarp snapshot" in out, out
    status = a.run("%spotwarp status")
    assert "unsized" in status and "size unknown" in status, status
    assert "faceless" in status and "no class today" in status, status
    on_a = _report(a, ODD_CHECKS)
    a.kill()
    b = start_kernel("hostB")
    restored = b.run("%load_ext spotwarp\n%spotwarp restore latest")
    assert "restored 6 variables" in restored and "not in the snapshot: faceless" in restored, restored
    assert _report(b, ODD_CHECKS) == on_a
    assert b.value("[n in globals() for n in ('unsized', 'faceless')]") == [False, False]


# -- item 2: an unpicklable member of an alias group ----------------------------------------------

GROUP_WORK = r'''
import socket, warnings
warnings.simplefilter("ignore")
import torch
g = torch.Generator().manual_seed(3)
loader = torch.utils.data.DataLoader(list(range(10)), batch_size=3, shuffle=True, generator=g)
it = iter(loader)  # a live iterator over the loader, drawing its order from the same generator
first = next(it)
torch.manual_seed(0)
model = torch.nn.utils.weight_norm(torch.nn.Linear(3, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.5)
logger = {"model": model, "conn": socket.socket()}  # shares the model, holds a socket: cannot be saved
x = torch.ones(4, 3)
'''

GROUP_CHECKS = r'''
opt.zero_grad(); model(x).sum().backward(); opt.step()
print("@@" + repr({
    "drives_model": all(p is q for p, q in zip(opt.param_groups[0]["params"], model.parameters())),
    "after_step": model(x).detach().tolist(),
    "loader_uses_g": loader.generator is g,
    "next_epoch": [b.tolist() for b in loader],
    "then_g": torch.rand(2, generator=g).tolist(),
}))
'''


def test_an_unpicklable_member_is_left_out_and_the_rest_stays_together(start_kernel):
    on_a, on_b, restored = _move(start_kernel, GROUP_WORK, GROUP_CHECKS)
    assert on_a["drives_model"] and on_a["loader_uses_g"]
    assert on_b == on_a, restored
    assert "logger (" in restored and "it (" not in restored, restored  # the socket's holder only is left out


# -- item 3: tensor and array layouts, shared storage, attributes ---------------------------------

LAYOUT_WORK = r'''
import numpy as np
import torch
base = torch.arange(24.).reshape(4, 6)
row, col, tr = base[1], base[:, 2], base.t()
conv = torch.nn.Conv2d(3, 4, 3).to(memory_format=torch.channels_last)
img = torch.randn(2, 3, 8, 8).to(memory_format=torch.channels_last)
p = torch.nn.Parameter(torch.ones(3))
p.no_decay = True
flagged = torch.zeros(2)
flagged.tag = "ema"
arr = np.arange(12.).reshape(3, 4)
arr_view, arr_t = arr[1:, ::2], arr.T
'''

LAYOUT_CHECKS = r'''
row[0] = 100.0
arr_view[0, 0] = -5.0
print("@@" + repr({
    "writes_through": [base[1, 0].item(), tr[0, 1].item(), col[1].item()],
    "layout": [base.stride(), row.stride(), row.storage_offset(), col.stride(), col.storage_offset(), tr.stride()],
    "one_storage": len({t.untyped_storage().data_ptr() for t in (base, row, col, tr)}),
    "channels_last": [conv.weight.is_contiguous(memory_format=torch.channels_last), img.stride()],
    "conv_out": conv(img).sum().round(decimals=3).item(),
    "attrs": [type(p).__name__, getattr(p, "no_decay", None), getattr(flagged, "tag", None)],
    "numpy": [float(arr[1, 0]), float(arr_t[0, 1]), arr_view.strides, bool(np.shares_memory(arr_view, arr))],
}))
'''


def test_layouts_shared_storage_and_attributes_come_back(start_kernel):
    on_a, on_b, restored = _move(start_kernel, LAYOUT_WORK, LAYOUT_CHECKS)
    assert on_a["writes_through"] == [100.0, 100.0, 8.0] and on_a["one_storage"] == 1
    assert on_b == on_a, restored


# -- item 4: references through weakrefs and bound methods --------------------------------------

HOOK_WORK = r'''
import random
import torch
r = random.Random(7)
draw = r.random  # bound to r: one stream of draws
model = torch.nn.Linear(3, 2)
calls = []
def hook(module, inputs, output):
    calls.append(len(calls))
h = model.register_forward_hook(hook)  # the handle reaches model's hooks through a weakref
'''

HOOK_CHECKS = r'''
model(torch.ones(1, 3))
seen = len(calls)
h.remove()
model(torch.ones(1, 3))
print("@@" + repr({
    "draws": [draw(), r.random(), draw()],
    "bound": draw.__self__ is r,
    "hook_ran": seen,
    "after_remove": [len(calls), len(model._forward_hooks)],
}))
'''


def test_a_hook_handle_still_removes_its_hook_and_a_bound_method_stays_bound(start_kernel):
    on_a, on_b, restored = _move(start_kernel, HOOK_WORK, HOOK_CHECKS)
    assert on_a["bound"] and on_a["after_remove"] == [1, 0]
    assert on_b == on_a, restored


# -- item 5: optimizers rebuilt through state_dict, loaders with persistent workers ----------------

LBFGS_WORK = r'''
import torch
torch.manual_seed(0)
net = torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
xs, ys = torch.randn(32, 3), torch.randn(32, 1)
lbfgs = torch.optim.LBFGS(net.parameters(), lr=0.1, history_size=4, max_iter=3)
def closure():
    lbfgs.zero_grad()
    loss = torch.nn.functional.mse_loss(net(xs), ys)
    loss.backward()
    return loss
lbfgs.step(closure)
'''

LBFGS_CHECKS = r'''
losses = [round(lbfgs.step(closure).item(), 6) for _ in range(3)]
print("@@" + repr({
    "drives_net": lbfgs.param_groups[0]["params"][0] is net[0].weight,
    "losses": losses,
    "weights": [round(v, 6) for v in net[0].weight.flatten().tolist()],
}))
'''


def test_a_restored_lbfgs_still_trains_the_restored_model(start_kernel):
    on_a, on_b, restored = _move(start_kernel, LBFGS_WORK, LBFGS_CHECKS)
    assert on_a["drives_net"] and len(set(on_a["losses"])) > 1
    assert on_b == on_a, restored


LOADER_WORK = r'''
import torch
g = torch.Generator().manual_seed(5)
loader = torch.utils.data.DataLoader(list(range(12)), batch_size=4, shuffle=True, generator=g,
                                     num_workers=2, persistent_workers=True)
epoch1 = [b.tolist() for b in loader]  # the iterator and its workers stay for the next epoch
'''

LOADER_CHECKS = r'''
print("@@" + repr({"next_epochs": [[b.tolist() for b in loader] for _ in range(3)],
                   "then_g": torch.rand(2, generator=g).tolist()}))
'''


def test_persistent_workers_shuffle_the_next_epochs_as_the_uninterrupted_run(start_kernel):
    on_a, on_b, restored = _move(start_kernel, LOADER_WORK, LOADER_CHECKS)
    assert on_b == on_a, restored


# -- item 6: memory-mapped arrays -----------------------------------------------------------------

MEMMAP_WORK = r'''
import numpy as np
made = np.memmap("data.bin", dtype="float32", mode="w+", shape=(4, 5))
made[:] = np.arange(20, dtype="float32").reshape(4, 5)
made.flush()
rw = np.memmap("data.bin", dtype="float32", mode="r+", shape=(4, 5))
ro = np.memmap("data.bin", dtype="float32", mode="r", shape=(2, 5), offset=40)
window = rw[2:]
'''

MEMMAP_CHECKS = r'''
import os
rw[2, 0] = 99.0
rw.flush()
print("@@" + repr({
    "types": [type(v).__name__ for v in (rw, ro)],
    "files": [os.path.relpath(v.filename) for v in (rw, ro)],
    "read_only": [ro.flags.writeable, ro.mode, ro.offset],
    "file_sees_write": float(np.fromfile("data.bin", dtype="float32")[10]),
    "window_sees_write": float(window[0, 0]),
    "ro": ro.tolist(),
}))
'''


def test_a_memmap_is_reopened_when_its_file_came_back(start_kernel, tmp_path):
    a = start_kernel("hostA")
    a.run("%load_ext spotwarp\n" + MEMMAP_WORK)
    a.run("%spotwarp snapshot\n%spotwarp off")
    (tmp_path / "hostB").mkdir()  # the workspace's file comes back with it, as `spotwarp restore` writes it
    (tmp_path / "hostB" / "data.bin").write_bytes((tmp_path / "hostA" / "data.bin").read_bytes())
    on_a = _report(a, MEMMAP_CHECKS)
    a.kill()
    (tmp_path / "hostA" / "data.bin").unlink()  # host A is gone
    b = start_kernel("hostB")
    restored = b.run("%load_ext spotwarp\n%spotwarp restore latest")
    assert "in-memory copy" not in restored, restored
    assert _report(b, MEMMAP_CHECKS) == on_a


def test_a_memmap_whose_file_is_missing_comes_back_as_a_copy_and_says_so(start_kernel, tmp_path):
    a = start_kernel("hostA")
    a.run("%load_ext spotwarp\n" + MEMMAP_WORK)
    a.run("%spotwarp snapshot")
    a.kill()
    (tmp_path / "hostA" / "data.bin").unlink()
    b = start_kernel("hostB")
    restored = b.run("%load_ext spotwarp\n%spotwarp restore latest")
    assert "numpy.memmap of data.bin was restored as an in-memory copy" in restored, restored
    assert b.value("[type(rw).__name__, rw.flags.writeable, ro.flags.writeable, ro.tolist(), window.tolist()]") == [
        "ndarray", True, False, [[10.0 + i for i in range(5)], [15.0 + i for i in range(5)]],
        [[10.0 + i for i in range(5)], [15.0 + i for i in range(5)]]]


# -- item 7: files reopened, locks recreated, modules under their import path ---------------------

EXTPKG = '''
import types
# as a compiled extension's submodule (tokenizers.trainers): named without its package, not in sys.modules
trainers = types.ModuleType("trainers")
trainers.BpeTrainer = type("BpeTrainer", (), {"kind": "bpe"})
'''

HANDLES_WORK = r'''
import threading
log = open("train.log", "a")
log.write("epoch 1\n")
log.flush()
notes = open("notes.txt", "w")
notes.write("first ")
notes.flush()
reader = open("train.log")
reader.readline()
old = open("train.log")
old.close()
free, held = threading.Lock(), threading.Lock()
held.acquire()
from extpkg import trainers
'''

HANDLES_CHECKS = r'''
log.write("epoch 2\n")
log.flush()
notes.write("second")
notes.flush()
print("@@" + repr({
    "log": [log.mode, log.closed, open("train.log").read()],
    "notes": [notes.mode, open("notes.txt").read()],
    "reader": [reader.readline(), reader.tell()],
    "old": [old.closed, os.path.basename(old.name)],
    "locks": [free.locked(), held.locked(), free.acquire(blocking=False), held.acquire(blocking=False)],
    "module": [trainers.__name__, trainers.BpeTrainer.kind],
}))
'''


def test_files_locks_and_extension_submodules_come_back(start_kernel, tmp_path):
    for host in ("hostA", "hostB"):  # the package, installed on both hosts
        (tmp_path / host / "extpkg").mkdir(parents=True)
        (tmp_path / host / "extpkg" / "__init__.py").write_text(EXTPKG)
    a = start_kernel("hostA")
    a.run("%load_ext spotwarp\nimport os\n" + HANDLES_WORK)
    a.run("%spotwarp snapshot\n%spotwarp off")
    status = a.run("%spotwarp status")
    assert "trainers (extpkg.trainers)" in status and "skipped" not in status, status
    for name in ("train.log", "notes.txt"):  # the workspace's files come back with it
        (tmp_path / "hostB" / name).write_bytes((tmp_path / "hostA" / name).read_bytes())
    on_a = _report(a, HANDLES_CHECKS)
    assert on_a["log"][2] == "epoch 1\nepoch 2\n" and on_a["notes"][1] == "first second"
    a.kill()
    b = start_kernel("hostB")
    restored = b.run("%load_ext spotwarp\n%spotwarp restore latest")
    assert "not in the snapshot" not in restored and "not importable" not in restored, restored
    assert _report(b, HANDLES_CHECKS) == on_a
