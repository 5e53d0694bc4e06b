"""End to end, as a user meets a preemption: SIGTERM to `spotwarp start` mid-training, a new host, the loop resumes.

Host A: `spotwarp start` (a subprocess), a notebook kernel in a `resumable` loop whose last periodic snapshot
is far behind, then SIGTERM to the server (what Kubernetes, RunPod and most clouds' shutdowns send). The server
takes the final snapshot and exits within its grace period. Host B: `spotwarp start` on an empty workspace
restores the files, the notebook's kernel restores its state, and re-running the loop continues right after
the final snapshot's step. `spotwarp report` then counts one preemption survived.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from spotwarp_jupyter.engine.journal.events import (
    FINAL_SNAPSHOT_COMMITTED,
    NOTICE_SEEN,
    RESTORE_FINISHED,
    RESTORE_STARTED,
    TRAINING_RESUMED,
    Journal,
)

from engines import make_engine
from lab_server import Execution, LabServer, host_env, kill_kernel
from metadata_servers import WATCHER_ENV_OFF
from waiting import read_progress, wait_for

pytestmark = pytest.mark.slow  # real `spotwarp start` processes, SIGTERM mid-training, a second host

GRACE_S = 15
SETUP = "%load_ext spotwarp\n%spotwarp policy --every 1h --no-after-cell\nimport pathlib\n" \
        "progress, stop = pathlib.Path({progress!r}), pathlib.Path({stop!r})"
LOOP = """
import time, spotwarp
from spotwarp_jupyter import safepoints
first = None
for step in spotwarp.resumable(range(100000), name="train"):
    if first is None:
        first = step
    done = step + 1
    progress.write_text(str(done))
    if step == 5:
        safepoints.request("timer")  # the last periodic snapshot
    if stop.exists():
        break
    time.sleep(0.02)
"""


def test_sigterm_mid_loop_final_snapshot_then_the_loop_resumes_on_a_new_host(tmp_path):
    store = str(tmp_path / "durable-store")
    engine = make_engine(store, "pre")
    ws_a = tmp_path / "host-a" / "ws"
    ws_a.mkdir(parents=True)
    (ws_a / "train.ipynb").write_text(json.dumps({"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    (ws_a / "config.yaml").write_text("lr: 0.01\n")
    watchers = {**WATCHER_ENV_OFF, "SPOTWARP_WATCHERS": "signals", "SPOTWARP_SHUTDOWN_GRACE": str(GRACE_S)}
    a = LabServer(ws_a, store, "pre", host_env(tmp_path / "host-a" / "home", **watchers), tmp_path / "host-a.log")
    progress_a, stop_a = tmp_path / "a-progress", tmp_path / "a-stop"
    kernel_pid = None
    try:
        a.wait_ready()
        _code, status = a.request("GET", "spotwarp/api/status")
        (signals,) = status["watchers"]
        assert signals["name"] == "signals" and signals["state"].startswith("watching"), signals
        nb = a.open_notebook("train.ipynb")
        kernel_pid = nb.value("__import__('os').getpid()")
        nb.run(SETUP.format(progress=str(progress_a), stop=str(stop_a)))
        nb.ws.send(Execution(LOOP).request)  # the training cell: runs until the host goes
        periodic = wait_for(lambda: next((m for m in engine.manifests("train.ipynb")
                                          if m.message == "requested: timer"), None), "the periodic snapshot")
        wait_for(lambda: read_progress(progress_a) >= 40, "training progress")
        at_sigterm = read_progress(progress_a)
        sent = time.monotonic()
        os.kill(a.proc.pid, signal.SIGTERM)
        code = a.proc.wait(timeout=GRACE_S + 30)
        exited_after = time.monotonic() - sent
    finally:
        a.kill()
        kill_kernel(kernel_pid)
    log_a = a.log()
    assert code == 0 and exited_after < GRACE_S, (code, exited_after, log_a[-3000:])
    final = next(m for m in engine.manifests() if m.kind == "project")
    assert final.message == "final snapshot: SIGTERM notice from signals", log_a[-3000:]
    assert final.stats["kernels_fresh"] == ["train.ipynb"] and "config.yaml" in final.files["entries"]
    namespace: dict = {}
    _m, restored = engine.restore_kernel(final.id, namespace, "train.ipynb")
    final_position = restored.extras["resumables"]["train"]["position"]
    assert namespace["done"] == final_position >= at_sigterm > 6 + 30  # the work since the periodic snapshot
    assert engine.restore_kernel(periodic.id, {}, "train.ipynb")[1].extras["resumables"]["train"]["position"] == 6

    # host B: an empty workspace elsewhere
    ws_b = tmp_path / "host-b" / "ws"
    # the manual path (docs/resume.md has the automatic one): nothing resumes by itself
    b = LabServer(ws_b, store, "pre", host_env(tmp_path / "host-b" / "home", **watchers), tmp_path / "host-b.log",
                  start_args=("--no-resume",))
    progress_b, stop_b = tmp_path / "b-progress", tmp_path / "b-stop"
    try:
        b.wait_ready()
        assert f"from snapshot {final.id}" in b.log()
        assert (ws_b / "config.yaml").read_text() == "lr: 0.01\n"
        nb = b.open_notebook("train.ipynb")
        assert f"from {final.id}" in nb.run("%load_ext spotwarp\n%spotwarp restore latest")
        nb.run(SETUP.format(progress=str(progress_b), stop=str(stop_b)))  # this host's paths
        stop_b.write_text("stop")  # run one step, then stop
        nb.run(LOOP)
        assert nb.value("first") == final_position  # continues right after the final snapshot's last step
        assert nb.value("done") == final_position + 1
        nb.close()
    finally:
        b.discard()

    def journaled():  # the kernel writes its event from a background thread
        events = Journal(engine.store).events()
        return events if any(e.event == TRAINING_RESUMED for e in events) else None

    events = wait_for(journaled, "the training_resumed event", timeout=10)
    kinds = [e.event for e in events]
    assert kinds.count(NOTICE_SEEN) == 1 and kinds.count(FINAL_SNAPSHOT_COMMITTED) == 1
    assert kinds.index(RESTORE_STARTED) < kinds.index(RESTORE_FINISHED) < kinds.index(TRAINING_RESUMED)
    resumed = next(e for e in events if e.event == TRAINING_RESUMED)
    assert resumed.snapshot == final.id and resumed.details["position"] == final_position
    assert resumed.notebook == "train.ipynb"

    out = subprocess.run([sys.executable, "-m", "spotwarp_jupyter.cli", "report", "--project-id", "pre", "--storage",
                          store, "--json"], capture_output=True, text=True, timeout=60, check=False,
                         env=host_env(tmp_path / "reader"))
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["preemptions"] == 1 and report["preemptions_survived"] == 1
    (row,) = report["events"]
    assert row["source"] == "signals" and row["final_snapshot"] == final.id and row["restored_snapshot"] == final.id
    assert 0 <= row["work_lost_s"] < GRACE_S and row["resume_s"] > 0 and row["compute_saved_s"] > 0
    assert row["resumed_at_step"] == final_position
    out = subprocess.run([sys.executable, "-m", "spotwarp_jupyter.cli", "status", "--project-id", "pre", "--storage",
                          store], capture_output=True, text=True, timeout=60, check=False,
                         env=host_env(tmp_path / "reader"))
    assert out.returncode == 0 and "training_resumed" in out.stdout and "final_snapshot_committed" in out.stdout
