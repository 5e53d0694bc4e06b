"""`spotwarp launch` carries the project's key to its candidates, and nowhere else (docs/threat-model.md).

A first host's `spotwarp start` created the project's key in its user's home; `spotwarp launch`, run by that user
with no SPOTWARP_KEY set by hand, gives it to the local provider's candidate through its environment: the
promoted candidate resumes the notebook's kernel from the signed snapshot. The key is in no store file, no file
the launch or its candidates wrote (their logs, the candidate folders), neither output of the launch, and on no
process's command line (`ps`).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from failover_hosts import attach

from spotwarp_jupyter.engine.coordination.heartbeats import read_heartbeats

from engines import UNSIGNED, make_engine
from lab_server import TOKEN, carried_key, host_env
from new_hosts import kill_host, notebook, resume_entry, start_host, wait_for

pytestmark = pytest.mark.slow  # a host, a launch and a promoted candidate


def test_launch_carries_the_key_to_its_candidates_and_nowhere_else(tmp_path):
    store = str(tmp_path / "store")
    a = start_host(tmp_path, "a", store, SPOTWARP_KEY="")  # the project's first start: its key is made here
    try:
        (a.workspace / "train.ipynb").write_text(json.dumps(notebook([("setup", "%load_ext spotwarp\nx = 41")])))
        nb = a.open_notebook("train.ipynb")
        pid = int(nb.run("import os as _o; print(_o.getpid())").strip())
        nb.run("%load_ext spotwarp\nx = 41", cell_id="setup")
        assert a.request("POST", "spotwarp/api/snapshots", {"message": "x is 41"})[0] == 201
        kill_host(a, pid)
    finally:
        a.discard()
    key = carried_key(tmp_path / "home-a", project="proj").get("SPOTWARP_KEY")
    assert key, "the first start kept no key"
    # the same user launches: HOME holds the key, SPOTWARP_KEY is not set
    env = host_env(tmp_path / "home-a", SPOTWARP_WATCHERS="signals", SPOTWARP_HEARTBEAT_INTERVAL="1",
                   PYTHONPATH=os.environ.get("PYTHONPATH", ""), OMP_NUM_THREADS="1")
    argv = [sys.executable, "-m", "spotwarp_jupyter.cli", "launch", "--project-id", "proj", "--storage", store,
            "--provider", "local", "--provider-option", f"root={tmp_path / 'candidates'}", "--provider-option",
            f"token={TOKEN}", "--candidates", "1", "--json"]
    stderr = tmp_path / "launch.stderr"
    with open(stderr, "wb") as err:
        launch = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=err, env=env, text=True, start_new_session=True)
    seen: list[str] = []
    try:
        for line in launch.stdout:
            seen.append(line)
            if json.loads(line)["event"] in ("promoted", "failover_failed"):
                break
        promoted = json.loads(seen[-1])
        assert promoted["event"] == "promoted", (seen, stderr.read_text())
        holder = attach(promoted["url"], tmp_path / "holder.log")
        entry = wait_for(lambda: resume_entry(holder).get("state") not in (None, "running") and resume_entry(holder),
                         180, "the promoted candidate's resume of train.ipynb")
        assert entry["state"] == "restored", entry  # vouched for: the candidate has the key
        status = holder.request("GET", "spotwarp/api/status")[1]
        assert status["trust"]["vouched"] is True and status["trust"]["key_id"]
        secret = key.encode()
        commands = []
        for proc in Path("/proc").iterdir():
            if proc.name.isdigit():
                try:
                    commands.append((proc.name, (proc / "cmdline").read_bytes()))
                except OSError:
                    continue
        # the candidate's server and its resumed kernel were running when ps was read
        assert any(b"jupyterlab" in c and str(tmp_path / "candidates").encode() in c for _, c in commands)
        assert any(b"ipykernel" in c and str(tmp_path / "candidates").encode() in c for _, c in commands)
        assert [pid for pid, c in commands if secret in c] == []
        written = [p for p in [*Path(store).rglob("*"), *(tmp_path / "candidates").rglob("*"), stderr]
                   if p.is_file() and not p.is_symlink()]
        assert [p for p in written if secret in p.read_bytes()] == []
        assert not [line for line in seen if key in line]
    finally:
        os.killpg(launch.pid, signal.SIGTERM)
        launch.wait(timeout=120)
        engine = make_engine(store, key=UNSIGNED)
        for doc in read_heartbeats(engine.store):  # the promoted candidate serves on: its group goes down
            try:
                os.killpg(int(doc["pid"]), signal.SIGKILL)
            except (ProcessLookupError, PermissionError, KeyError, ValueError):
                pass
        for proc in Path("/proc").iterdir():  # and its kernels, which Jupyter starts in sessions of their own
            try:
                if proc.name.isdigit() and str(tmp_path).encode() in (proc / "cmdline").read_bytes():
                    os.kill(int(proc.name), signal.SIGKILL)
            except (OSError, ProcessLookupError):
                pass
