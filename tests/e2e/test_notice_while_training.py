"""The notice path while a cell trains, on a real `spotwarp start` server with a real kernel in a `resumable` loop.

A snapshot request (the panel's Snapshot now, the Kubernetes preStop hook) reaches the busy kernel through its
control channel and is answered with a kernel snapshot taken at the loop's next step, while the cell goes on.
Then SIGTERM with a request still in flight: the final snapshot commits within the grace period, and no project
snapshot, the final one included, names older training state than one committed before it.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from spotwarp_jupyter.engine import SnapshotEngine

from engines import make_engine
from lab_server import TOKEN, Execution, LabServer, host_env, kill_kernel
from metadata_servers import WATCHER_ENV_OFF
from waiting import read_progress, wait_for

pytestmark = pytest.mark.slow  # a real `spotwarp start` process, a training cell, SIGTERM

GRACE_S = 10
SETUP = "%load_ext spotwarp\n%spotwarp policy --every 2s --no-after-cell\nimport pathlib\n" \
        "progress, ended = pathlib.Path({progress!r}), pathlib.Path({ended!r})"
LOOP = """
import time, spotwarp
for step in spotwarp.resumable(range(100000), name="train"):
    done = step + 1
    progress.write_text(str(done))
    time.sleep(0.02)
ended.write_text(str(done))
"""


def _position(manifest) -> int:
    return manifest.kernels["train.ipynb"]["positions"]["train"]


def _story(engine: SnapshotEngine) -> str:
    """The store's snapshots, oldest first, for a failure's message."""
    return "\n".join(f"{m.id} {m.kind} {m.message!r} {(m.kernels.get('train.ipynb') or {}).get('positions')} "
                     f"{m.requests} {m.stats.get('kernels_fresh')} {m.stats.get('kernels_missing')}"
                     for m in reversed(engine.manifests()))


def test_snapshot_requests_reach_a_training_cell_and_sigterm_commits_the_newest_state(tmp_path):
    store = str(tmp_path / "store")
    engine = make_engine(store, "busy")
    ws = tmp_path / "host-a" / "ws"
    ws.mkdir(parents=True)
    (ws / "train.ipynb").write_text(json.dumps({"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    env = host_env(tmp_path / "host-a" / "home", **WATCHER_ENV_OFF, SPOTWARP_WATCHERS="signals",
                   SPOTWARP_SHUTDOWN_GRACE=str(GRACE_S))
    a = LabServer(ws, store, "busy", env, tmp_path / "host-a.log")
    progress, ended = tmp_path / "progress", tmp_path / "ended"
    kernel_pid = None
    try:
        a.wait_ready()
        nb = a.open_notebook("train.ipynb")
        kernel_pid = nb.value("__import__('os').getpid()")
        nb.run(SETUP.format(progress=str(progress), ended=str(ended)))
        nb.ws.send(Execution(LOOP).request)  # the training cell: runs until the host goes
        wait_for(lambda: read_progress(progress) >= 20, "training progress")

        # the panel's Snapshot now: a kernel snapshot at the loop's next step, before the cell ends
        at_request = read_progress(progress)
        code, body = a.request("POST", "spotwarp/api/snapshots", {"message": "Snapshot now"})
        assert code == 201, body
        assert not ended.exists()
        now = engine.get(body["id"])
        assert now.stats["kernels_fresh"] == ["train.ipynb"], now.stats
        assert _position(now) >= at_request > 0

        # the preStop hook, as deploy/values.yaml runs it in the pod
        hook_env = {**env, "JUPYTERHUB_SERVICE_URL": a.url, "JUPYTERHUB_API_TOKEN": TOKEN}
        hook = subprocess.run([sys.executable, "-m", "spotwarp_jupyter.server.hub", "prestop", "--timeout", "5"],
                              env=hook_env, capture_output=True, text=True, timeout=60, check=False)
        assert hook.returncode == 0, (hook.stderr, _story(engine), a.log()[-3000:])
        hooked = next(m for m in engine.manifests() if m.kind == "project")
        assert f"snapshot {hooked.id} committed" in hook.stdout
        assert hooked.stats["kernels_fresh"] == ["train.ipynb"] and _position(hooked) > _position(now)
        assert not ended.exists()

        # another request in flight, then SIGTERM: the final snapshot does not wait for it
        wait_for(lambda: read_progress(progress) > _position(hooked) + 20, "training progress")
        in_flight = http.client.HTTPConnection("127.0.0.1", a.port, timeout=60)
        in_flight.request("POST", "/spotwarp/api/snapshots", body=json.dumps({"message": "preStop"}),
                          headers={"Authorization": f"token {TOKEN}", "Content-Type": "application/json"})
        at_sigterm = read_progress(progress)
        sent = time.monotonic()
        os.kill(a.proc.pid, signal.SIGTERM)
        code = a.proc.wait(timeout=GRACE_S + 30)
        exited_after = time.monotonic() - sent
        in_flight.close()
    finally:
        a.kill()
        kill_kernel(kernel_pid)
    log = a.log()
    assert code == 0 and exited_after < GRACE_S, (code, exited_after, log[-3000:])
    assert "another snapshot or restore is still running" not in log  # the request in flight held nothing up
    project = [m for m in engine.manifests() if m.kind == "project"]
    final = next((m for m in project if m.message == "final snapshot: SIGTERM notice from signals"), None)
    assert final is not None, log[-3000:]
    assert final.stats["kernels_fresh"] == ["train.ipynb"], (_story(engine), log[-3000:])
    assert _position(final) >= at_sigterm
    # not older than any kernel state committed before it, and `latest` never moved back in training
    committed = [_position(m) for m in engine.manifests("train.ipynb") if m.created <= final.created]
    assert _position(final) >= max(committed), _story(engine)
    positions = [_position(m) for m in reversed(project) if "train.ipynb" in m.kernels]
    assert positions == sorted(positions), positions
