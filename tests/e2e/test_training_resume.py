"""The reason SpotWarp exists: a training loop killed (SIGKILL) at a random moment continues on another host.

Kernel A trains with `spotwarp.resumable`, snapshotting at safe points; it is killed at a random moment
mid-loop. Kernel B, a new process in another folder sharing only the store, restores the latest snapshot
and re-runs the same cell. Weights, optimizer state, loss history and the next random draws must be
bit-for-bit those of an uninterrupted run.
"""

from __future__ import annotations

import os
import random
import threading
import time
from pathlib import Path

import pytest

from kernels import Kernel

pytestmark = pytest.mark.slow  # real kernels SIGKILLed at random moments and resumed

EPOCHS, STEPS_PER_EPOCH = 3, 32
TOTAL_STEPS = EPOCHS * STEPS_PER_EPOCH

SETUP = """
import random, numpy as np, torch, spotwarp
torch.use_deterministic_algorithms(True)
random.seed(1); np.random.seed(1); torch.manual_seed(1)
X = torch.randn(256, 8)
Y = X @ torch.randn(8, 1) + 0.1 * torch.randn(256, 1)
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(X, Y), batch_size=8, shuffle=True)
model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Dropout(0.2), torch.nn.Linear(32, 1))
opt = torch.optim.Adam(model.parameters(), lr=1e-2)
sched = torch.optim.lr_scheduler.StepLR(opt, step_size=10, gamma=0.9)
losses = []
"""

# the pause stands for the accelerator's compute time in kernel A, so that snapshots are taken while the
# loop runs and the kill lands among them; it comes from the process environment, not from the snapshot
LOOP = """
import os as _os, time as _time
_pause = float(_os.environ.get("STEP_PAUSE", "0"))
for epoch in spotwarp.resumable(range(3), name="epochs"):
    for xb, yb in spotwarp.resumable(loader, name="train"):
        noise = float(np.random.rand()) * 1e-3 + random.random() * 1e-3
        loss = torch.nn.functional.mse_loss(model(xb), yb) + noise
        opt.zero_grad(); loss.backward(); opt.step(); sched.step()
        losses.append(loss.item())
        _time.sleep(_pause)
        with open("progress.tmp", "w") as _f:
            _f.write(str(len(losses)))
        _os.replace("progress.tmp", "progress")
"""

FINGERPRINT = """
import hashlib as _h
def _digest(tensors):
    d = _h.sha256()
    for t in tensors:
        d.update(t.detach().contiguous().numpy().tobytes())
    return d.hexdigest()
_opt_tensors = [v for s in opt.state_dict()["state"].values() for v in s.values() if torch.is_tensor(v)]
_result = {
    "weights": _digest(model.state_dict().values()),
    "optimizer": _digest(_opt_tensors),
    "lr": opt.param_groups[0]["lr"],
    "scheduler_epoch": sched.last_epoch,
    "losses": [repr(x) for x in losses],
    "next_random": repr(random.random()),
    "next_numpy": repr(float(np.random.rand())),
    "next_torch": [repr(x) for x in torch.rand(3).tolist()],
}
"""


def _final_state(kernel) -> dict:
    kernel.run(FINGERPRINT)
    return kernel.value("_result")


def _read_progress(folder: Path) -> int:
    try:
        return int((folder / "progress").read_text() or 0)
    except (FileNotFoundError, ValueError):
        return 0


def _manifests(store: str, project: str) -> int:
    folder = Path(store) / project / "snapshots"
    return len(list(folder.glob("*.json"))) if folder.is_dir() else 0


def _wait_for(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.005)
    raise AssertionError(f"timed out waiting for {what}")


def _kill_mid_loop(kernel, folder: Path, store: str, project: str, delay: float) -> int:
    """Run the loop, SIGKILL the kernel `delay` s after a snapshot committed mid-loop; returns steps done."""
    kernel.run("%load_ext spotwarp\n%spotwarp policy --every 0.2s --no-after-cell")
    kernel.run(SETUP)
    errors: list[BaseException] = []

    def run_loop() -> None:
        try:
            kernel.run(LOOP, timeout=120)
        except BaseException as exc:  # noqa: BLE001 - the kill ends this call one way or another
            errors.append(exc)

    runner = threading.Thread(target=run_loop, daemon=True)
    runner.start()
    _wait_for(lambda: _read_progress(folder) >= 1, 60, "the training loop to start")
    # the first snapshot is taken at the first step; wait for a later one, so the restore lands mid-loop
    _wait_for(lambda: _manifests(store, project) >= 2 or _read_progress(folder) >= TOTAL_STEPS, 60,
              "a snapshot taken inside the loop")
    time.sleep(delay)  # the random kill moment itself, not a synchronisation
    kernel.kill()  # the loop's thread is left waiting for a reply that never comes; it is a daemon
    done = _read_progress(folder)
    assert done < TOTAL_STEPS, f"the loop finished before the kill ({done} steps); the kill must land mid-loop"
    return done


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> dict:
    """The uninterrupted run, once per module."""
    root = tmp_path_factory.mktemp("reference")
    kernel = Kernel(root / "host", {"HOME": str(root / "home"), "SPOTWARP_STORAGE": str(root / "store"),
                                     "OMP_NUM_THREADS": "1", "PYTHONHASHSEED": "0"})
    try:
        kernel.run(SETUP)
        kernel.run(LOOP, timeout=120)
        state = _final_state(kernel)
    finally:
        kernel.close()
    assert len(state["losses"]) == TOTAL_STEPS
    return state


@pytest.mark.parametrize("round_", range(int(os.environ.get("SPOTWARP_KILL_ROUNDS", "3"))))
def test_random_sigkill_resumes_bit_identical(round_, start_kernel, reference, store_url, tmp_path: Path):
    seed = os.environ.get("SPOTWARP_KILL_SEED")
    delay = random.Random(f"{seed}-{round_}" if seed else None).uniform(0.0, 0.8)
    a = start_kernel("host-a", OMP_NUM_THREADS="1", STEP_PAUSE="0.08")
    done = _kill_mid_loop(a, tmp_path / "host-a", store_url, "proj", delay)

    b = start_kernel("host-b", OMP_NUM_THREADS="1")
    b.run("import torch; torch.use_deterministic_algorithms(True)")
    out = b.run("%load_ext spotwarp\n%spotwarp restore latest")
    assert "restored" in out, out
    assert "re-run the training cell to continue its loops" in out, out
    positions = b.value("__import__('spotwarp_jupyter.training', fromlist=['x']).pending_positions()")
    completed = b.value("len(losses)")
    # the saved position is the number of completed steps, taken between two steps
    assert positions, f"the snapshot holds no loop position: {out}"
    assert completed == positions["epochs"] * STEPS_PER_EPOCH + positions.get("train", 0), (positions, completed)
    assert 0 < completed <= done < TOTAL_STEPS, (completed, done)
    b.run(LOOP, timeout=120)
    state = _final_state(b)
    assert state == reference, f"killed after {done} steps (delay {delay:.3f}s), resumed at {completed}"


def test_demo_notebook_runs_end_to_end(tmp_path: Path, store_url: str, monkeypatch):
    nbformat = pytest.importorskip("nbformat")
    from nbclient import NotebookClient

    for name, value in {"SPOTWARP_STORAGE": store_url, "SPOTWARP_PROJECT": "demo", "HOME": str(tmp_path / "home"),
                        "OMP_NUM_THREADS": "1"}.items():
        monkeypatch.setenv(name, value)
    (tmp_path / "home").mkdir()
    source = Path(__file__).parents[2] / "notebooks" / "train_resumable.ipynb"
    notebook = nbformat.read(source, as_version=4)
    NotebookClient(notebook, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    text = "\n".join(
        output.get("text", "") for cell in notebook.cells if cell.cell_type == "code" for output in cell.get("outputs", [])
    )
    assert "epoch 3: last loss" in text
    assert "64 steps, final loss" in text
    assert "after training" in text  # %spotwarp list shows the snapshot
    assert "SpotWarp restored" in text and "restored 64 completed steps" in text
    assert _manifests(store_url, "demo") >= 1
