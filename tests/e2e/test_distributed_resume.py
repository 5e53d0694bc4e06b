"""A notebook whose cell launches training ranks resumes on a new host by itself, bit for bit.

Host A (`spotwarp start`) runs a notebook: a setup cell, then a cell launching 2 ranks with
`torch.multiprocessing.start_processes(..., start_method="fork")`, each training a DDP model over
`spotwarp.resumable(loader, name="train", state=...)` (tests/support/dcp_training.py, a file of the workspace).
After their collective snapshot, host A is SIGKILLed: server, kernel and ranks. Host B (`spotwarp start` on an
empty workspace, the same store) is left alone: it must run the launching cell again, the ranks continuing after
the snapshot's step, and end with what an uninterrupted run ends with.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from new_hosts import PROJECT_KEY, kill_host, notebook, resume_entry, start_host, wait_for
from storage_servers import free_port

pytestmark = pytest.mark.slow  # real servers and kernels, ranks forked and killed

PROGRAM = Path(__file__).resolve().parents[1] / "support" / "dcp_training.py"
SETUP = "%load_ext spotwarp\nimport dcp_training\nimport torch.multiprocessing as mp\ncfg = {cfg!r}\n"
# the number of ranks comes from the host (what a cell reading torch.cuda.device_count() does)
LAUNCH = """import json, os
ranks = {**cfg, **json.loads(os.environ.get("RANKS", "{}"))}
mp.start_processes(dcp_training.worker, args=(ranks,), nprocs=ranks["nprocs"], start_method="fork")
print("launch done")
"""



def _lines(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


def lose_host_a(tmp_path: Path, hosts: list, store: str, cfg: dict) -> None:
    """Host A runs the notebook, its ranks commit a collective snapshot after step 6; then A is SIGKILLed."""
    out = Path(cfg["out"])
    a = start_host(tmp_path, "a", store, PYTHONHASHSEED="0", SPOTWARP_EVERY="1h")
    hosts.append(a)
    shutil.copy(PROGRAM, a.workspace / "dcp_training.py")
    (a.workspace / "train.ipynb").write_text(json.dumps(notebook([("setup", SETUP.format(cfg=cfg)), ("launch", LAUNCH)])))
    nb = a.open_notebook("train.ipynb")
    kernel_pid = int(nb.run("import os as _o; print(_o.getpid())").strip())
    assert a.request("POST", "spotwarp/api/snapshots", {"message": "the notebook"})[0] == 201
    nb.run(SETUP.format(cfg=cfg), cell_id="setup")
    nb.send(LAUNCH, cell_id="launch")
    wait_for(lambda: (out / "reached").exists(), 180, "rank 0 held at epoch 1 step 3", a)
    docs = [json.loads(p.read_text()) for p in (Path(store) / "proj" / "snapshots").glob("*.json")]
    [ranks] = [d for d in docs if d["kind"] == "collective"]
    assert (ranks["collective"]["pass"], ranks["collective"]["step"], ranks["collective"]["world_size"]) == (0, 6, 2)
    newest = max((d for d in docs if d["kind"] == "kernel"), key=lambda d: d["created_ts"])["kernels"]["train.ipynb"]
    assert newest["at"] == "step" and newest["running"]["id"] == "launch"
    os.killpg(os.getpgid(kernel_pid), signal.SIGKILL)  # the kernel and the ranks it forked
    kill_host(a)
    (out / "gate").touch()  # the gate held host A's rank 0; a run on B passes it


def test_a_cell_launching_ranks_resumes_on_a_new_host(tmp_path: Path, hosts: list) -> None:
    store, out = str(tmp_path / "store"), tmp_path / "out"
    out.mkdir()
    cfg = {"out": str(out), "nprocs": 2, "port": free_port(), "mode": "ddp", "epochs": 2, "request_at": [[0, 5]],
           "gate_at": [1, 3]}
    lose_host_a(tmp_path, hosts, store, cfg)
    before = _lines(out / "losses-0.jsonl")

    b = start_host(tmp_path, "b", store, PYTHONHASHSEED="0", SPOTWARP_EVERY="1h")
    hosts.append(b)
    wait_for(lambda: (out / "result-0.json").exists() and (out / "result-1.json").exists(), 300,
             "the ranks on host B to finish", b)
    entry = wait_for(lambda: resume_entry(b).get("state") == "finished" and resume_entry(b), 120,
                     "the resume entry to say finished", b)
    assert entry["cell"] == "launch", entry
    assert _lines(out / "losses-0.jsonl") - before == 2 * 32 - 6  # continued after step 6, not from the start

    reference = tmp_path / "reference"
    reference.mkdir()
    config = tmp_path / "reference.json"
    config.write_text(json.dumps({**cfg, "out": str(reference), "port": free_port(), "request_at": [], "gate_at": None}))
    env = {**os.environ, "SPOTWARP_STORAGE": str(tmp_path / "reference-store"), "SPOTWARP_PROJECT": "ref",
           "SPOTWARP_KEY": PROJECT_KEY, "SPOTWARP_EVERY": "1h", "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run([sys.executable, str(PROGRAM), str(config)], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    for rank in range(2):
        assert json.loads((out / f"result-{rank}.json").read_text()) == json.loads((reference / f"result-{rank}.json").read_text())
        lines = [json.loads(line) for line in (out / f"losses-{rank}.jsonl").read_text().splitlines()]
        expected = [json.loads(line) for line in (reference / f"losses-{rank}.jsonl").read_text().splitlines()]
        assert {(e, i): loss for e, i, loss in lines} == {(e, i): loss for e, i, loss in expected}


def test_fsdp2_ranks_resume_on_a_host_with_fewer(tmp_path: Path, hosts: list) -> None:
    """2 FSDP2 ranks on host A; host B launches 1 (its cell reads the count from the host): the state resharded."""
    store, out = str(tmp_path / "store"), tmp_path / "out"
    out.mkdir()
    cfg = {"out": str(out), "nprocs": 2, "port": free_port(), "mode": "fsdp", "epochs": 2, "request_at": [[0, 5]],
           "gate_at": [1, 3], "dump_after_request": True}
    lose_host_a(tmp_path, hosts, store, cfg)
    saved = torch.load(out / "full-2.pt")
    b = start_host(tmp_path, "b", store, PYTHONHASHSEED="0", SPOTWARP_EVERY="1h",
                   RANKS=json.dumps({"nprocs": 1, "dump_restored": True}))
    hosts.append(b)
    entry = wait_for(lambda: resume_entry(b).get("state") == "finished" and resume_entry(b), 300,
                     "the resume entry to say finished", b)
    assert entry["cell"] == "launch", entry
    restored = torch.load(out / "full-1.pt")
    assert set(restored["model"]) == set(saved["model"])
    for name, tensor in saved["model"].items():
        assert torch.equal(restored["model"][name], tensor), name
    for fqn, values in saved["optim"]["state"].items():
        for key, value in values.items():
            assert torch.equal(torch.as_tensor(restored["optim"]["state"][fqn][key]), torch.as_tensor(value)), (fqn, key)
