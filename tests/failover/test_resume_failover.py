"""Issue 22 through `spotwarp launch --provider local --watch`, end to end, nobody touching the winner.

The first holder trains a notebook's `resumable` loop (driven as JupyterLab drives it) and is SIGKILLed with its
kernel, no notice. The watch detects the loss, races, promotes a new holder; once its promotion snapshot is
committed, that host resumes the notebook's kernel and the loop by itself, and the run ends as an uninterrupted one.
"""

from __future__ import annotations

import json
import os
import signal
import time

import pytest
from test_failover import Launch, attach, cleanup, engine_for, env_for

from spotwarp_jupyter.engine.coordination.heartbeats import read_heartbeat

from new_hosts import LOOP, SETUP, TOTAL, completed, finished_on, kernel_manifests, notebook, reference_run, wait_for

pytestmark = pytest.mark.slow  # a launch, two holders, a kill and a resumed training run


def test_a_promoted_holder_resumes_the_training_loop_by_itself(tmp_path):
    store = str(tmp_path / "store")
    origin = tmp_path / "origin"
    origin.mkdir()
    (origin / "train.ipynb").write_text(json.dumps(notebook([("setup", SETUP), ("loop", LOOP)])))
    engine_for(store).snapshot_project(str(origin))
    reference = reference_run(tmp_path / "reference")
    launch = Launch(tmp_path, store, "--candidates", "1", "--watch", "--dead-after", "4s",
                    env=env_for(tmp_path, STEP_PAUSE="0.15", PYTHONHASHSEED="0", OMP_NUM_THREADS="1",
                                PYTHONPATH=os.environ.get("PYTHONPATH", "")))
    try:
        first = launch.next("promoted")
        holder = attach(first["url"], tmp_path / "first.log")
        nb = holder.open_notebook("train.ipynb")
        kernel_pid = int(nb.run("import os as _o; print(_o.getpid())").strip())
        nb.run(SETUP, cell_id="setup")
        nb.send(LOOP, cell_id="loop")
        wait_for(lambda: len([m for m in kernel_manifests(store, "fo")
                              if m["kernels"]["train.ipynb"].get("at") == "step"]) >= 3, 120, "snapshots in the loop")
        launch.next("failover_finished")  # the first race's row
        pid = read_heartbeat(engine_for(store).store, first["candidate"])["pid"]
        os.killpg(pid, signal.SIGKILL)  # the host vanishes, no notice
        os.kill(kernel_pid, signal.SIGKILL)
        killed = time.time()
        second = launch.next("promoted", timeout=120)
        assert second["generation"] == 2
        new = attach(second["url"], tmp_path / "second.log")
        new.workspace = tmp_path / "candidates" / second["candidate"] / "ws"
        entry = finished_on(new, reference)  # nobody connected to it until the cell finished
        assert 0 < completed(entry["positions"]) < TOTAL
        assert entry["seconds_to_running"] > 0 and time.time() - killed < 300
    finally:
        launch.stop()
        cleanup(store, tmp_path)
