"""End to end, as a user runs it: `spotwarp start` on host A, a snapshot, host A killed, `spotwarp start` on host B."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from lab_server import LabServer, host_env, kill_kernel, tree

pytestmark = pytest.mark.slow  # real `spotwarp start` processes on two hosts


def make_workspace(root: Path) -> None:
    (root / "data").mkdir(parents=True)
    (root / "data" / "train.csv").write_text("x,y\n" + "".join(f"{i},{i * i}\n" for i in range(20000)))
    (root / "data" / "weights.bin").write_bytes(os.urandom(3 * 1024 * 1024 + 17))
    (root / "configs" / "deep").mkdir(parents=True)
    (root / "configs" / "deep" / "run.yaml").write_text("lr: 0.01\nepochs: 3\n")
    (root / "empty.txt").write_bytes(b"")
    (root / "train.ipynb").write_text(json.dumps({
        "cells": [{"cell_type": "code", "execution_count": None, "id": "c1", "metadata": {}, "outputs": [],
                   "source": ["%load_ext spotwarp\n", "weights = [0.5, 1.5]"]}],
        "metadata": {}, "nbformat": 4, "nbformat_minor": 5}, indent=1))
    (root / ".spotwarpignore").write_text("scratch/\n")
    (root / "scratch").mkdir()
    (root / "scratch" / "tmp.txt").write_text("not backed up")
    (root / ".ipynb_checkpoints").mkdir()
    (root / ".ipynb_checkpoints" / "train-checkpoint.ipynb").write_text("{}")


def test_spotwarp_start_on_a_new_host_brings_files_and_kernel_state_back(tmp_path):
    store = str(tmp_path / "durable-store")  # the one thing both hosts share
    ws_a = tmp_path / "host-a" / "ws"
    make_workspace(ws_a)
    env_a = host_env(tmp_path / "host-a" / "home")
    a = LabServer(ws_a, store, "e2e", env_a, tmp_path / "host-a.log")
    kernel_pid = None
    try:
        a.wait_ready()
        code, status = a.request("GET", "spotwarp/api/status")
        assert status["project"] == "e2e" and status["last_snapshot"] is None
        assert a.request("GET", "spotwarp/api/status", token="wrong")[0] == 403
        nb = a.open_notebook("train.ipynb")
        kernel_pid = nb.value("__import__('os').getpid()")
        nb.run("%load_ext spotwarp\nimport numpy as np\nweights = np.arange(12.0).reshape(3, 4)\n"
               "config = {'lr': 0.01, 'epochs': 3}\nhistory = [0.9, 0.5, 0.25]\nalias = history")
        code, first = a.request("POST", "spotwarp/api/snapshots", {"message": "before preemption"})
        assert code == 201, first
        assert first["notebooks"] == ["train.ipynb"] and {"weights", "config", "history"} <= set(first["variables"])
        # more work, then a snapshot from the command line, which goes through the running server
        nb.run("history.append(0.125)")
        (ws_a / "configs" / "deep" / "run.yaml").write_text("lr: 0.005\nepochs: 4\n")
        out = subprocess.run([sys.executable, "-m", "spotwarp_jupyter.cli", "snapshot", "--project-id", "e2e",
                              "--storage", store, "--workspace-path", str(ws_a), "--json", "-m", "cli"],
                             capture_output=True, text=True, env=env_a, timeout=300)
        assert out.returncode == 0, out.stderr
        second = json.loads(out.stdout)
        # built on the newest snapshot holding files: the first, or a kernel snapshot since (they hold files too)
        assert second["notebooks"] == ["train.ipynb"] and second["parent"] is not None
    finally:
        a.kill()  # host A vanishes: server, and (below) its kernel, with no chance to clean up
        kill_kernel(kernel_pid)

    ws_b = tmp_path / "host-b" / "ws"  # does not exist yet: the new-host path
    # the manual path (docs/resume.md has the automatic one): nothing resumes by itself
    b = LabServer(ws_b, store, "e2e", host_env(tmp_path / "host-b" / "home"), tmp_path / "host-b.log",
                  start_args=("--no-resume",))
    try:
        b.wait_ready()
        assert f"from snapshot {second['id']}" in b.log() and "restored 6 files" in b.log()
        # its first line names the snapshot it resumed from, when it was taken, its age and what came back
        said = re.search(rf"spotwarp: restored snapshot {second['id']} of {re.escape(second['created'])} "
                         r"\([^()]+ old, from [^)]+\): 6 files, ", b.log())
        assert said, b.log()
        expected = {k: v for k, v in tree(ws_a).items() if not k.startswith(("scratch/", ".ipynb_checkpoints/"))}
        assert tree(ws_b) == expected  # byte-identical, ignored files left out
        assert (ws_b / "configs" / "deep" / "run.yaml").read_text() == "lr: 0.005\nepochs: 4\n"

        nb = b.open_notebook("train.ipynb")
        restored = nb.run("%load_ext spotwarp\n%spotwarp restore latest")
        assert f"from {second['id']}" in restored, restored
        assert nb.value("weights.tolist()") == [[float(4 * r + c) for c in range(4)] for r in range(3)]
        assert nb.value("config") == {"lr": 0.01, "epochs": 3}
        assert nb.value("history") == [0.9, 0.5, 0.25, 0.125]
        assert nb.value("alias is history") is True
        code, status = b.request("GET", "spotwarp/api/status")
        (kernel,) = status["kernels"]
        assert kernel["notebook"] == "train.ipynb" and kernel["last_snapshot"] == second["id"]
        assert status["last_snapshot"]["id"] == second["id"]
        nb.close()
    finally:
        b.discard()


@pytest.mark.parametrize("start_args", [(), ("--allow-root",)], ids=["as-is", "allow-root-flag"])
def test_start_serves_as_root_without_jupyters_own_flag(tmp_path, start_args):
    """Spot GPU images run as root: `spotwarp start` (and `spotwarp start --allow-root`) serve there as anywhere."""
    server = LabServer(tmp_path / "ws", str(tmp_path / "store"), "root", host_env(tmp_path / "home"),
                       tmp_path / "server.log", start_args=start_args, allow_root=False)
    try:
        server.wait_ready()
        as_root = "running as root: Jupyter is started with --allow-root" in server.log()
        assert as_root == (os.geteuid() == 0 and not start_args), server.log()
    finally:
        server.discard()


def test_status_without_a_project_shows_the_running_servers_project(tmp_path):
    env = host_env(tmp_path / "home")
    server = LabServer(tmp_path / "ws", str(tmp_path / "store"), "demo", env, tmp_path / "server.log")
    try:
        server.wait_ready()
        out = subprocess.run([sys.executable, "-m", "spotwarp_jupyter.cli", "status"], capture_output=True, text=True,
                             env=env, timeout=120)
        assert out.returncode == 0, out.stderr
        assert out.stdout.startswith(f"project  demo (served at {server.url}") and str(tmp_path / "store") in out.stdout
        named = subprocess.run([sys.executable, "-m", "spotwarp_jupyter.cli", "status", "--project-id", "other",
                                "--storage", str(tmp_path / "store")],
                               capture_output=True, text=True, env=env, timeout=120)
        # a named project is never replaced by the served one; one the store holds nothing of is a typo until
        # proven otherwise
        assert named.returncode == 1 and "project 'other' has no snapshots" in named.stderr, named
        assert "projects there: demo" in named.stderr and "project  demo" not in named.stdout, named
    finally:
        server.discard()


def test_start_usage_errors_are_one_line_and_start_nothing(tmp_path):
    env = host_env(tmp_path / "home")
    (tmp_path / "a-file").write_text("x")
    cases = [
        (["start", "--project-id", "p", "--storage", str(tmp_path / "s")], "needs --workspace-path"),
        (["start", "--project-id", "p", "--storage", str(tmp_path / "s"), "--workspace-path", str(tmp_path / "a-file")],
         "not a folder"),
        (["start", "--project-id", "../p", "--workspace-path", str(tmp_path / "w")], "bad project id"),
        (["start", "--port", "99999", "--workspace-path", str(tmp_path / "w")], "port"),
        (["list", "--project-id", "p", "--", "--no-browser"], "only `start`"),
        (["start", "--workspace-path", str(tmp_path / "w"), "--no-browser"],
         "Jupyter's own flags go after --: spotwarp start ... -- --no-browser"),
    ]
    for args, message in cases:
        out = subprocess.run([sys.executable, "-m", "spotwarp_jupyter.cli", *args], capture_output=True, text=True,
                             env=env, timeout=60)
        assert out.returncode in (1, 2), (args, out)
        assert message in out.stderr and len(out.stderr.strip().splitlines()) == 1, (args, out.stderr)
    assert not (tmp_path / "w").exists()


def test_snapshot_without_a_server_backs_up_files(tmp_path):
    ws = tmp_path / "ws"
    make_workspace(ws)
    env = host_env(tmp_path / "home")
    cmd = [sys.executable, "-m", "spotwarp_jupyter.cli", "snapshot", "--project-id", "solo", "--storage",
           str(tmp_path / "store"), "--workspace-path", str(ws), "--json"]
    first = json.loads(subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120, check=True).stdout)
    assert first["files"] == 6 and first["notebooks"] == [] and first["kind"] == "project"
    target = tmp_path / "restored"
    out = subprocess.run([sys.executable, "-m", "spotwarp_jupyter.cli", "restore", "--project-id", "solo", "--storage",
                          str(tmp_path / "store"), "--workspace-path", str(target)],
                         capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "restored 6 files" in out.stdout and first["id"] in out.stdout
    assert tree(target) == {k: v for k, v in tree(ws).items() if not k.startswith(("scratch/", ".ipynb_checkpoints/"))}


def test_restore_on_a_terminal_draws_a_progress_bar(tmp_path):
    import pty

    ws = tmp_path / "ws"
    make_workspace(ws)
    env = host_env(tmp_path / "home")
    store = str(tmp_path / "store")
    base = [sys.executable, "-m", "spotwarp_jupyter.cli"]
    subprocess.run([*base, "snapshot", "--project-id", "tty", "--storage", store, "--workspace-path", str(ws)],
                   capture_output=True, env=env, timeout=120, check=True)
    master, slave = pty.openpty()
    with os.fdopen(master, "rb", buffering=0) as terminal:
        proc = subprocess.Popen([*base, "restore", "--project-id", "tty", "--storage", store, "--workspace-path",
                                 str(tmp_path / "restored")], stdout=subprocess.PIPE, stderr=slave, env=env)
        os.close(slave)
        drawn = b""
        while True:
            try:
                data = terminal.read(4096)
            except OSError:  # the terminal closes when the command exits
                break
            if not data:
                break
            drawn += data
        stdout = proc.communicate(timeout=120)[0].decode()
    assert proc.returncode == 0
    assert b"100%" in drawn and b"[" + b"#" * 30 + b"]" in drawn, drawn
    assert "restored 6 files" in stdout
