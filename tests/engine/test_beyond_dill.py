"""Training objects plain pickling refuses come back working: kernel A snapshots and dies (SIGKILL), kernel B in
another folder restores, and each object is checked by what it does there against what it did in A.

One kernel pair runs every kind: a compiled model and function (the user's backend and options, parameters shared
with the optimizer), parametrized modules trained through their original tensors, a live DataLoader iterator, a
tqdm bar, a TensorBoard writer, an extension's submodule, optimizer param groups in their key order, and a running
thread refused with its reason while what shares its alias group comes back.
"""

from __future__ import annotations

import ast
import os
import shutil

import pytest

from kernels import Kernel

pytestmark = pytest.mark.process  # every test here starts a process (a kernel, server or command)

KERNELS = pytest.mark.slow  # one kernel pair for the module: ~25 s

WORK = r'''
%load_ext spotwarp
import threading
import torch, torch.nn as nn
from torch.nn.utils import parametrize
from torch.nn.utils.parametrizations import orthogonal, weight_norm
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.tensorboard import SummaryWriter
from tqdm import tqdm

compiles = []
def counting(gm, example_inputs):  # a backend of the user's: records each compilation, runs the graph as is
    compiles.append(len(example_inputs))
    return gm.forward

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.l = nn.Linear(4, 3)
    def forward(self, x):
        return self.l(x).relu()

class Symmetric(nn.Module):
    def forward(self, X):
        return X.triu() + X.triu(1).transpose(-1, -2)

torch.manual_seed(0)
x = torch.randn(5, 4)
model = Net()
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
model = torch.compile(model, backend=counting, fullgraph=True)
model(x).sum().backward(); opt.step(); opt.zero_grad()

@torch.compile(backend=counting, dynamic=False)
def affine(t):
    return t * 2 + 1

affine(x)

sym = nn.Linear(3, 3)
parametrize.register_parametrization(sym, "weight", Symmetric())
wn = weight_norm(nn.Linear(3, 3))
orth = orthogonal(nn.Linear(3, 3))
popt = torch.optim.Adam([*sym.parameters(), *wn.parameters(), *orth.parameters()], lr=0.01)
y = torch.randn(2, 3)
(sym(y).sum() + wn(y).sum() + orth(y).sum()).backward(); popt.step(); popt.zero_grad()

loader = DataLoader(TensorDataset(torch.arange(40.)), batch_size=4, shuffle=True)
it = iter(loader)
first = next(it)
bar = tqdm(total=50, desc="epoch 3", unit="batch")
bar.update(7)
writer = SummaryWriter("runs/exp1", flush_secs=1)
writer.add_scalar("loss", 0.5, 1)
writer.flush()

from fasttokenizers import trainers

stop = threading.Event()
worker = threading.Thread(target=stop.wait, daemon=True)
worker.start()
%spotwarp snapshot -m "beyond dill"
'''

# run in A after the snapshot and in B after the restore: what each object does next
NEXT = r'''
import sys
from torch.nn.utils import parametrize
from torch._dynamo.eval_frame import OptimizedModule

def _compiled():
    before = len(compiles)
    seen = {"compiled": isinstance(model, OptimizedModule),
            "model_params_in_opt": all(any(p is q for q in opt.param_groups[0]["params"]) for p in model.parameters()),
            "out": model(x).tolist()}
    seen["model_compiles"] = len(compiles) - before  # by the user's backend, on the first call in a new process
    model(x).sum().backward(); opt.step()
    seen["model_step"] = model._orig_mod.l.weight.tolist()
    before = len(compiles)
    seen["affine"] = affine(x).tolist()
    seen["affine_compiles"] = len(compiles) - before
    return seen

def _keys():
    return {"opt_keys": list(opt.param_groups[0]), "popt_keys": list(popt.param_groups[0])}

def _parametrized():
    originals = [sym.parametrizations.weight.original, wn.parametrizations.weight.original0,
                 wn.parametrizations.weight.original1, orth.parametrizations.weight.original]
    seen = {"parametrized": [parametrize.is_parametrized(m, "weight") for m in (sym, wn, orth)],
            "originals_in_popt": all(any(p is q for q in popt.param_groups[0]["params"]) for p in originals),
            "symmetric": bool(torch.equal(sym.weight, sym.weight.T))}
    (sym(y).sum() + wn(y).sum() + orth(y).sum()).backward(); popt.step()
    seen["param_step"] = [m.weight.tolist() for m in (sym, wn, orth)]
    return seen

def _iterator():
    return {"next_batch": next(it)[0].tolist(), "batches_left": len(list(it))}

def _module():
    return {"module": [trainers.__name__, trainers.BpeTrainer.kind, trainers is sys.modules["fasttokenizers"].trainers]}

def _writer():
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    writer.add_scalar("loss", 0.25, 2)
    writer.flush()
    run = EventAccumulator("runs/exp1")
    run.Reload()
    return {"writer": [writer.log_dir, [(e.step, e.value) for e in run.Scalars("loss")]]}

def _bar():
    seen = {"bar": [bar.n, bar.total, bar.desc, bar.unit]}
    bar.update(1)
    seen["bar_after"] = bar.n
    return seen

_seen = {}
for _part in (_keys, _compiled, _parametrized, _iterator, _module, _bar, _writer):  # each on its own: one missing name fails one part
    try:
        _seen.update(_part())
    except Exception as _exc:
        _seen[_part.__name__] = f"{type(_exc).__name__}: {_exc}"
print("@@" + repr(_seen))
'''


# an extension's submodule as PyO3 makes it (tokenizers.trainers): named without its package, not in sys.modules
FASTTOKENIZERS = '''
import types
trainers = types.ModuleType("trainers")
trainers.BpeTrainer = type("BpeTrainer", (), {"kind": "bpe"})
'''


def _seen(kernel: Kernel) -> dict:
    out = kernel.run(NEXT)
    line = [ln for ln in out.splitlines() if "@@" in ln][-1]  # the bar draws on the same output
    return ast.literal_eval(line[line.index("@@") + 2:])


@pytest.fixture(scope="module")
def hosts(tmp_path_factory: pytest.TempPathFactory):
    """(what A saw next, A's status, B's restore text, kernel B): one snapshot of every kind, restored once."""
    root = tmp_path_factory.mktemp("beyond")
    (root / "home").mkdir()
    (root / "site" / "fasttokenizers").mkdir(parents=True)  # a package installed on both hosts
    (root / "site" / "fasttokenizers" / "__init__.py").write_text(FASTTOKENIZERS)
    path = os.pathsep.join(p for p in (str(root / "site"), os.environ.get("PYTHONPATH")) if p)
    env = {"SPOTWARP_STORAGE": str(root / "store"), "SPOTWARP_PROJECT": "proj", "HOME": str(root / "home"),
           "PYTHONHASHSEED": "0", "PYTHONPATH": path}
    a = Kernel(root / "hostA", env)
    b = None
    try:
        assert "SpotWarp snapshot" in a.run(WORK)
        status = a.run("%spotwarp status")
        shutil.copytree(root / "hostA" / "runs", root / "hostB" / "runs")  # the workspace's files, as restored
        expected = _seen(a)
        a.kill()
        b = Kernel(root / "hostB", env)
        restored = b.run("%load_ext spotwarp\n%spotwarp restore latest")
        yield expected, status, restored, b
    finally:
        for kernel in (a, b):
            if kernel is not None:
                kernel.close()


@pytest.fixture(scope="module")
def seen(hosts) -> tuple[dict, dict]:
    expected, _status, _restored, b = hosts
    return expected, _seen(b)


@KERNELS
def test_compiled_models_and_functions_come_back_compiled_sharing_the_optimizers_parameters(seen):
    expected, got = seen
    assert "_compiled" not in got, got["_compiled"]
    assert got["compiled"] and got["model_params_in_opt"]
    assert (expected["model_compiles"], got["model_compiles"]) == (0, 1)  # compiled again, by the user's backend
    assert (expected["affine_compiles"], got["affine_compiles"]) == (0, 1)
    assert (got["out"], got["model_step"], got["affine"]) == (expected["out"], expected["model_step"],
                                                              expected["affine"])


@KERNELS
def test_parametrized_modules_train_their_original_tensors(seen):
    expected, got = seen
    assert "_parametrized" not in got, got["_parametrized"]
    assert got["parametrized"] == [True, True, True]
    assert got["originals_in_popt"] and got["symmetric"]
    assert got["param_step"] == expected["param_step"]


@KERNELS
def test_a_live_dataloader_iterator_yields_the_batch_the_old_one_would_have(seen):
    expected, got = seen
    assert "_iterator" not in got, got["_iterator"]
    assert got["next_batch"] == expected["next_batch"]
    assert got["batches_left"] == expected["batches_left"] == 8


@KERNELS
def test_a_tqdm_bar_continues_from_its_count(seen):
    expected, got = seen
    assert "_bar" not in got, got["_bar"]
    assert got["bar"] == expected["bar"] == [7, 50, "epoch 3", "batch"]
    assert got["bar_after"] == 8


@KERNELS
def test_an_extension_submodule_is_imported_by_its_real_path(hosts, seen):
    expected, got = seen
    _expected, status, restored, _b = hosts
    assert "trainers (fasttokenizers.trainers)" in status, status
    assert "not importable" not in restored, restored
    assert got["module"] == expected["module"] == ["trainers", "bpe", True]


@KERNELS
def test_a_summary_writer_appends_to_the_same_run(seen):
    expected, got = seen
    assert "_writer" not in got, got["_writer"]
    assert got["writer"] == expected["writer"] == ["runs/exp1", [(1, 0.5), (2, 0.25)]]


@KERNELS
def test_optimizer_param_groups_keep_their_key_order(seen):
    expected, got = seen
    assert got["opt_keys"][0] == got["popt_keys"][0] == "params"
    assert (got["opt_keys"], got["popt_keys"]) == (expected["opt_keys"], expected["popt_keys"])


@KERNELS
def test_a_running_thread_is_refused_with_its_reason_and_its_alias_group_comes_back(hosts):
    _expected, status, restored, b = hosts
    reason = "a thread cannot be saved"
    assert "worker" in status and reason in status
    assert "worker" in restored and reason in restored
    assert b.value("['worker' in globals(), type(stop).__name__, stop.is_set()]") == [False, "Event", False]


def test_what_cannot_come_back_is_refused_with_its_reason():
    import torch
    from tqdm import tqdm

    from spotwarp_jupyter.engine.variables.capture import capture_namespace

    loader = torch.utils.data.DataLoader(list(range(8)), batch_size=2, num_workers=1)
    workers = iter(loader)
    bar = tqdm(range(3), disable=True)
    try:
        image = capture_namespace({"workers": workers, "bar": bar, "loader": loader})
    finally:
        workers._shutdown_workers()
    assert "with worker processes cannot be saved" in image.skipped["workers"]
    assert "a bar wrapping an iterable cannot be saved" in image.skipped["bar"]
    assert [g.names for g in image.groups] == [["loader"]]
