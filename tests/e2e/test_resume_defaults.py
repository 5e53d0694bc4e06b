"""With the settings a new user has, a training loop lost well into its run resumes by itself, bit for bit.

No `%spotwarp policy`, no backup interval, no key set by hand: host A (`spotwarp start`, a notebook driven as
JupyterLab drives it, cells typed and run but never saved) is SIGKILLed with its kernel about 75 s into a `resumable`
loop. Host B (`spotwarp start` on an empty workspace, another folder, HOME and port, the same store) is left alone.
The loop must continue on B by itself, redo at most 60 s of A's training, and end with the weights, losses and draws
of an uninterrupted run.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from kernels import Kernel
from new_hosts import kernel_manifests, kill_host, new_user_host, notebook, resume_entry, wait_for

pytestmark = pytest.mark.slow  # two real servers, one killed 75 s into its loop

EPOCHS, PER_EPOCH = 24, 32
TOTAL = EPOCHS * PER_EPOCH
KILL_AFTER_S = 75.0
MAX_REDO_S = 60.0

SETUP = """%load_ext spotwarp
import os, random, time, numpy as np, torch, spotwarp
torch.use_deterministic_algorithms(True)
random.seed(1); np.random.seed(1); torch.manual_seed(1)
X = torch.randn(256, 8)
Y = X @ torch.randn(8, 1) + 0.1 * torch.randn(256, 1)
shuffle = torch.Generator().manual_seed(3)
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(X, Y), batch_size=8, shuffle=True, generator=shuffle)
model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Dropout(0.2), torch.nn.Linear(32, 1))
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
losses = []
"""

# STEP_PAUSE stands for compute time on host A; STEP_LOG (outside the workspace) is the test's own record of when
# each step ended there, to measure the training a resume redoes
LOOP = f"""for epoch in spotwarp.resumable(range({EPOCHS}), name="epochs"):
    for xb, yb in spotwarp.resumable(loader, name="train"):
        loss = torch.nn.functional.mse_loss(model(xb), yb) + random.random() * 1e-3
        opt.zero_grad(); loss.backward(); opt.step()
        losses.append(loss.item())
        if os.environ.get("STEP_LOG"):
            with open(os.environ["STEP_LOG"], "a") as _f:
                _f.write(f"{{len(losses)}} {{time.time()}}\\n")
        time.sleep(float(os.environ.get("STEP_PAUSE", "0")))
after = [repr(random.random()), repr(float(np.random.rand())), repr(torch.rand(3).tolist())]
print(f"done: {{len(losses)}} steps")
"""

FINGERPRINT = """import hashlib as _h
_d = _h.sha256()
for _t in model.state_dict().values():
    _d.update(_t.detach().contiguous().numpy().tobytes())
_result = {"weights": _d.hexdigest(), "losses": [repr(x) for x in losses], "after": after}
"""


def reference_run(root: Path) -> dict:
    kernel = Kernel(root / "host", {"HOME": str(root / "home"), "SPOTWARP_STORAGE": str(root / "store"),
                                     "SPOTWARP_PROJECT": "ref", "OMP_NUM_THREADS": "1", "PYTHONHASHSEED": "0"})
    try:
        kernel.run(SETUP)
        assert f"done: {TOTAL} steps" in kernel.run(LOOP, timeout=600)
        kernel.run(FINGERPRINT)
        return kernel.value("_result")
    finally:
        kernel.close()


def steps_logged(path: Path) -> list[tuple[int, float]]:
    if not path.exists():
        return []
    rows = [line.split() for line in path.read_text().splitlines()]
    return [(int(step), float(at)) for step, at in rows if step and at]



def test_a_loop_lost_75_s_in_with_default_settings_resumes_by_itself_bit_for_bit(tmp_path, hosts):
    reference = reference_run(tmp_path / "reference")
    store = str(tmp_path / "store")
    log_a = tmp_path / "steps-a.log"
    a = new_user_host(tmp_path, "a", store, PYTHONHASHSEED="0", STEP_PAUSE="0.15", STEP_LOG=str(log_a))
    hosts.append(a)
    # the notebook on disk holds empty cells: what runs is typed in JupyterLab and never saved
    (a.workspace / "train.ipynb").write_text(json.dumps(notebook([("setup", ""), ("loop", "")])))
    nb = a.open_notebook("train.ipynb")
    kernel_pid = int(nb.run("import os as _o; print(_o.getpid())").strip())
    nb.run(SETUP, cell_id="setup")
    nb.send(LOOP, cell_id="loop")
    first = wait_for(lambda: steps_logged(log_a)[:1], 120, "the loop's first step", a)[0][1]
    wait_for(lambda: time.time() - first >= KILL_AFTER_S, KILL_AFTER_S + 30, "75 s of training on host A", a)
    kill_host(a, kernel_pid)
    done_on_a = steps_logged(log_a)
    assert done_on_a[-1][0] < TOTAL - 20, "host A finished before it was lost: nothing left to resume"
    assert any(m["kernels"]["train.ipynb"].get("at") == "step" for m in kernel_manifests(store, "proj"))

    b = new_user_host(tmp_path, "b", store, PYTHONHASHSEED="0")
    hosts.append(b)
    entry = wait_for(lambda: resume_entry(b).get("state") == "finished" and resume_entry(b), 600,
                     "the resumed loop to finish on host B", b)
    assert entry["cell"] == "loop", entry
    restored = entry["positions"].get("epochs", 0) * PER_EPOCH + entry["positions"].get("train", 0)
    when = dict(done_on_a)
    redone_s = done_on_a[-1][1] - when.get(restored, first)
    assert redone_s <= MAX_REDO_S, f"{redone_s:.1f} s of training redone (restored step {restored}, lost at {done_on_a[-1][0]})"
    cells = json.loads((b.workspace / "train.ipynb").read_text())["cells"]
    assert {c["id"]: "".join(c["source"]) for c in cells} == {"setup": SETUP, "loop": LOOP}
    session = b.open_notebook("train.ipynb")
    session.run(FINGERPRINT)
    assert session.value("_result") == reference
