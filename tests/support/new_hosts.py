"""Hosts for the resume tests: `spotwarp start` servers sharing a store, notebooks, waiting, killing."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import time
from pathlib import Path

from kernels import Kernel
from lab_server import LabServer, host_env

EPOCHS, STEPS = 2, 16
PROJECT_KEY = "the-project-key-every-host-of-a-resume-test-is-given"
TOTAL = EPOCHS * STEPS

SETUP = """%load_ext spotwarp
%spotwarp policy --every 0.2s --no-after-cell
import random, numpy as np, torch, spotwarp
torch.use_deterministic_algorithms(True)
random.seed(1); np.random.seed(1); torch.manual_seed(1)
X = torch.randn(128, 8)
Y = X @ torch.randn(8, 1) + 0.1 * torch.randn(128, 1)
shuffle = torch.Generator().manual_seed(3)
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(X, Y), batch_size=8, shuffle=True, generator=shuffle)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Dropout(0.2), torch.nn.Linear(16, 1))
opt = torch.optim.Adam(model.parameters(), lr=1e-2)
losses = []
"""

# the pause stands for compute time on host A (from the environment, not from the snapshot); the draws after the
# loop are taken in the same cell: a client connecting later draws from `random` itself (kernel_info_request)
LOOP = """import os as _os, time as _time
for epoch in spotwarp.resumable(range(2), name="epochs"):
    for xb, yb in spotwarp.resumable(loader, name="train"):
        noise = float(np.random.rand()) * 1e-3 + random.random() * 1e-3
        loss = torch.nn.functional.mse_loss(model(xb), yb) + noise
        opt.zero_grad(); loss.backward(); opt.step()
        losses.append(loss.item())
        print(f"step {len(losses)}", flush=True)
        _time.sleep(float(_os.environ.get("STEP_PAUSE", "0")))
after = [repr(random.random()), repr(float(np.random.rand())), repr(torch.rand(3).tolist()),
         repr(torch.rand(2, generator=shuffle).tolist())]
print(f"done: {len(losses)} steps, final loss {losses[-1]:.6f}")
"""

FINGERPRINT = """import hashlib as _h
_d = _h.sha256()
for _t in model.state_dict().values():
    _d.update(_t.detach().contiguous().numpy().tobytes())
_result = {"weights": _d.hexdigest(), "losses": [repr(x) for x in losses], "after": after}
"""


def notebook(cells: list[tuple[str, str]], kernelspec: str = "python3") -> dict:
    return {"cells": [{"cell_type": "code", "execution_count": None, "id": cid, "metadata": {}, "outputs": [],
                       "source": src} for cid, src in cells],
            "metadata": {"kernelspec": {"name": kernelspec, "language": "python",
                                        "display_name": "Python 3 (ipykernel)" if kernelspec == "python3" else kernelspec}},
            "nbformat": 4, "nbformat_minor": 5}


def unsigned(manifest: dict, **changes) -> str:
    """`manifest` with `changes`, as a store writer without the key writes it: no signature, and the checksum
    recomputed (anyone can), so that only the missing signature tells it from one the project wrote."""
    doc = {k: v for k, v in manifest.items() if k not in ("checksum", "signature", "key_id")}
    doc.update(changes)
    payload = json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
    return json.dumps({**doc, "checksum": hashlib.sha256(payload).hexdigest()}, sort_keys=True, indent=1)


def wait_for(condition, timeout: float, what: str, server: LabServer | None = None):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.05)  # poll interval of a deadline-bounded wait
    raise AssertionError(f"timed out waiting for {what}" + (f"\n{server.log()[-4000:]}" if server else ""))


def kernel_manifests(store: str, project: str) -> list[dict]:
    folder = Path(store) / project / "snapshots"
    docs = [json.loads(p.read_text()) for p in folder.glob("*.json")] if folder.is_dir() else []
    return [d for d in docs if d.get("kind") == "kernel"]


def cell_outputs(path: Path, cell_id: str) -> str:
    try:
        document = json.loads(path.read_text())
    except (OSError, ValueError):
        return ""  # not there yet, or being replaced
    cell = next((c for c in document["cells"] if c.get("id") == cell_id), None)
    return "" if cell is None else "".join("".join(o.get("text", "")) for o in cell.get("outputs", []))


def kill_host(server: LabServer, *kernel_pids: int) -> None:
    """The host vanishes: the server's process group and its kernels (which jupyter starts in their own session)."""
    for pid in kernel_pids:
        os.kill(pid, signal.SIGKILL)
    server.kill()


def start_host(tmp_path: Path, name: str, store: str, *start_args: str, **env: str) -> LabServer:
    """A host whose timed file backup is off: the files it commits are those its snapshots take."""
    return new_user_host(tmp_path, name, store, *start_args, SPOTWARP_BACKUP_INTERVAL="0", **env)


def new_user_host(tmp_path: Path, name: str, store: str, *start_args: str, **env: str) -> LabServer:
    """`spotwarp start` as a new user runs it: nothing configured but the project, its key (the same on every
    host, as `spotwarp key` tells a user to carry it; `SPOTWARP_KEY=""` in `env`: a host given no key) and `env`."""
    home = tmp_path / f"home-{name}"
    home.mkdir()
    env = {"SPOTWARP_KEY": PROJECT_KEY, **env}
    server = LabServer(tmp_path / f"ws-{name}", store, "proj",
                       host_env(home, PYTHONPATH=os.environ.get("PYTHONPATH", ""), OMP_NUM_THREADS="1", **env),
                       tmp_path / f"{name}.log", start_args=start_args)
    server.wait_ready()
    return server


def restart_host(tmp_path: Path, lost: LabServer, name: str, store: str, **env: str) -> LabServer:
    """`spotwarp start` again on the workspace and home a lost host left (a kept home volume): the same folder,
    another process and port, timed file backup off."""
    home = Path(lost.env["HOME"])
    env = {"SPOTWARP_KEY": PROJECT_KEY, "SPOTWARP_BACKUP_INTERVAL": "0", **env}
    server = LabServer(lost.workspace, store, "proj",
                       host_env(home, PYTHONPATH=os.environ.get("PYTHONPATH", ""), OMP_NUM_THREADS="1", **env),
                       tmp_path / f"{name}.log")
    server.wait_ready()
    return server


def kernel_pids(workspace: Path) -> list[int]:
    """The kernels running in `workspace` (found without connecting a client to them)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            cwd = os.readlink(entry / "cwd")
        except OSError:
            continue
        if b"ipykernel_launcher" in cmdline and cwd == os.path.realpath(workspace):
            pids.append(int(entry.name))
    return pids


def reference_run(root: Path) -> dict:
    """The notebook run without interruption, in a plain kernel: the fingerprint every resumed run must equal."""
    kernel = Kernel(root / "host", {"HOME": str(root / "home"), "SPOTWARP_STORAGE": str(root / "store"),
                                     "SPOTWARP_PROJECT": "ref", "OMP_NUM_THREADS": "1", "PYTHONHASHSEED": "0"})
    try:
        kernel.run(SETUP)
        assert f"done: {TOTAL} steps" in kernel.run(LOOP)
        kernel.run(FINGERPRINT)
        return kernel.value("_result")
    finally:
        kernel.close()


def completed(positions: dict) -> int:
    return positions.get("epochs", 0) * STEPS + positions.get("train", 0)


def resume_entry(server: LabServer, name: str = "train.ipynb") -> dict:
    """The notebook's resume entry in the server's status ({} while there is none)."""
    return next((e for e in server.request("GET", "spotwarp/api/status")[1].get("resume") or []
                 if e["notebook"] == name), {})


def lose_host_in_its_loop(start_lab, tmp_path: Path, setup: str, loop: str) -> None:
    """In a browser, host A runs the notebook's setup and `loop` cells, snapshots inside the loop, and is
    SIGKILLed with its kernel (the browser tests' host A)."""
    ws_a = tmp_path / "host-a" / "workspace"
    ws_a.mkdir(parents=True)
    (ws_a / "train.ipynb").write_text(json.dumps(notebook([("setup", setup), ("loop", loop)])))
    a = start_lab("host-a", ws_a)
    nb = a.open_notebook("train.ipynb")
    pid = int(nb.run("import os as _o; print(_o.getpid())").strip())
    assert a.request("POST", "spotwarp/api/snapshots", {"message": "the notebook"})[0] == 201
    nb.run(setup, cell_id="setup")
    nb.send(loop, cell_id="loop")
    store = tmp_path / "store" / "browser" / "snapshots"
    wait_for(lambda: sum(1 for p in store.glob("*.json") if json.loads(p.read_text()).get("kind") == "kernel"
                         and json.loads(p.read_text())["kernels"]["train.ipynb"].get("at") == "step") >= 3,
             60, "snapshots inside the loop", a)
    os.kill(pid, signal.SIGKILL)
    a.kill()


def finished_on(server: LabServer, reference: dict, partial_seen: bool = False) -> dict:
    """Wait for the resumed cell to finish on `server` (no client connected until then), check what it did and that
    its session holds the uninterrupted run's state; its resume entry."""
    on_disk = server.workspace / "train.ipynb"
    if partial_seen:
        partial = wait_for(lambda: "step " in cell_outputs(on_disk, "loop") and cell_outputs(on_disk, "loop"), 300,
                           "the resumed cell's first outputs in the notebook file", server)
        assert "done:" not in partial  # written as they come, not only at the end
    outputs = wait_for(lambda: "done:" in cell_outputs(on_disk, "loop") and cell_outputs(on_disk, "loop"), 300,
                       "the resumed cell's final output in the notebook file", server)
    assert f"done: {TOTAL} steps" in outputs
    # the final output can reach the file (the shared document's save) before the cell's run has ended
    entry = wait_for(lambda: resume_entry(server).get("state") == "finished" and resume_entry(server), 60,
                     "the resume entry to say finished", server)
    assert entry["cell"] == "loop", entry
    steps = [int(line.split()[1]) for line in outputs.splitlines() if line.startswith("step ")]
    # the outputs up to the snapshot came back with the cell, and the loop continued at the next batch: the batches
    # done before the snapshot were not run again
    assert steps == list(range(1, TOTAL + 1)), (steps[:3], entry)
    code, sessions = server.request("GET", "api/sessions")
    assert [s["path"] for s in sessions] == ["train.ipynb"]
    session = server.open_notebook("train.ipynb")  # as JupyterLab opening the notebook: it attaches to that kernel
    assert session.kernel_id == sessions[0]["kernel"]["id"]
    session.run(FINGERPRINT)
    assert session.value("_result") == reference
    assert session.value("len(losses)") == TOTAL
    return entry
