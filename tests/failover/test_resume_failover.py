"""The unattended resume through `spotwarp launch --provider local --watch`, end to end, nobody touching the winner.

The first holder trains a notebook's `resumable` loop (driven as JupyterLab drives it) and is SIGKILLed with its
kernel, no notice. The watch detects the loss, races, promotes a new holder; once its promotion snapshot is
committed, that host resumes the notebook's kernel and the loop by itself, and the run ends as an uninterrupted one.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from failover_hosts import Launch, attach, cleanup, engine_for, env_for

from spotwarp_jupyter.engine.coordination.heartbeats import read_heartbeat

from new_hosts import (
    LOOP,
    PROJECT_KEY,
    SETUP,
    TOTAL,
    completed,
    finished_on,
    kernel_manifests,
    notebook,
    reference_run,
    resume_entry,
    wait_for,
)

pytestmark = pytest.mark.slow  # a launch, two holders, a kill and a resumed training run


def test_a_promoted_holder_resumes_the_training_loop_by_itself(tmp_path):
    store = str(tmp_path / "store")
    origin = tmp_path / "origin"
    origin.mkdir()
    (origin / "train.ipynb").write_text(json.dumps(notebook([("setup", SETUP), ("loop", LOOP)])))
    engine_for(store, PROJECT_KEY).snapshot_project(str(origin))  # the project's key signs, on every host
    reference = reference_run(tmp_path / "reference")
    launch = Launch(tmp_path, store, "--candidates", "1", "--watch", "--dead-after", "4s",
                    env=env_for(tmp_path, SPOTWARP_KEY=PROJECT_KEY, STEP_PAUSE="0.15", PYTHONHASHSEED="0",
                                OMP_NUM_THREADS="1",
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
        last_on_a = _last_step_seen(nb)  # the steps the first holder printed before it vanished
        entry = finished_on(new, reference)  # nobody connected to it until the cell finished
        assert 0 < completed(entry["positions"]) < TOTAL
        assert entry["seconds_to_running"] > 0 and time.time() - killed < 300
        _check_steps_redone(store, entry, last_on_a - completed(entry["positions"]))
    finally:
        launch.stop()
        cleanup(store, tmp_path)


def _last_step_seen(nb) -> int:
    """The last `step N` the vanished holder's kernel sent to its client before the connection closed."""
    last = 0
    try:
        while True:
            nb.ws.settimeout(30)
            msg = json.loads(nb.ws.recv())
            if msg.get("msg_type") == "stream":
                last = max([last] + [int(line.split()[1]) for line in msg["content"]["text"].splitlines()
                                     if line.startswith("step ")])
    except Exception:  # noqa: BLE001 - the socket closed with its server: every step it sent was read
        return last


def _check_steps_redone(store: str, entry: dict, seen_redone: int) -> None:
    """`spotwarp report` estimates the steps redone from the holder's step rate and its last heartbeat."""
    report = json.loads(subprocess.run([sys.executable, "-m", "spotwarp_jupyter.cli", "report", "--project-id", "fo",
                                        "--storage", store, "--json"], capture_output=True, text=True,
                                       check=True).stdout)
    (row,) = report["resumes"]
    assert row["snapshot"] == entry["snapshot"] and "to its last heartbeat" in row["steps_redone_how"], row
    assert seen_redone >= 0 and abs(row["steps_redone"] - seen_redone) <= 8, (row, seen_redone)


NEW_SETUP = "%load_ext spotwarp\n%spotwarp policy --every 0.2s --no-after-cell\nimport os, time, spotwarp"
NEW_LOOP = """for i in spotwarp.resumable(range(1, 61), name="steps"):
    with open("steps.log", "a") as log:
        log.write(f"step {i}\\n")
    print(f"step {i}", flush=True)
    time.sleep(0.1)
print("done")
"""


def test_a_notebook_created_after_the_last_file_backup_resumes_on_the_promoted_holder(tmp_path):
    store = str(tmp_path / "store")
    origin = tmp_path / "origin"
    origin.mkdir()
    (origin / "data.csv").write_text("a,b\n1,2\n")
    engine_for(store, PROJECT_KEY).snapshot_project(str(origin))  # the project's key signs, on every host
    launch = Launch(tmp_path, store, "--candidates", "1", "--watch", "--dead-after", "4s",
                    env=env_for(tmp_path, SPOTWARP_KEY=PROJECT_KEY, OMP_NUM_THREADS="1",
                                PYTHONPATH=os.environ.get("PYTHONPATH", "")))
    try:
        first = launch.next("promoted")
        holder = attach(first["url"], tmp_path / "first.log")
        wait_for(lambda: any(m.kind == "project" and m.generation == first["generation"]
                             for m in engine_for(store).manifests()), 60, "the promotion snapshot")
        # created after the promotion snapshot, the last file backup (the default interval is 300 s)
        (tmp_path / "candidates" / first["candidate"] / "ws" / "new.ipynb").write_text(json.dumps(notebook([])))
        nb = holder.open_notebook("new.ipynb")
        kernel_pid = int(nb.run("import os as _o; print(_o.getpid())").strip())
        nb.run(NEW_SETUP, cell_id="setup")
        nb.send(NEW_LOOP, cell_id="loop")
        wait_for(lambda: len([m for m in kernel_manifests(store, "fo")
                              if m["kernels"]["new.ipynb"].get("at") == "step"]) >= 3, 120, "snapshots in the loop")
        launch.next("failover_finished")  # the first race's row
        os.killpg(read_heartbeat(engine_for(store).store, first["candidate"])["pid"], signal.SIGKILL)
        os.kill(kernel_pid, signal.SIGKILL)
        second = launch.next("promoted", timeout=120)
        new = attach(second["url"], tmp_path / "second.log")
        ws = tmp_path / "candidates" / second["candidate"] / "ws"
        entry = wait_for(lambda: resume_entry(new, "new.ipynb").get("state") in ("finished", "failed")
                         and resume_entry(new, "new.ipynb"), 180, "the resumed loop to end on the promoted holder")
        assert entry["state"] == "finished" and entry["cell"] == "loop", entry
        cells = {c["id"]: "".join(c["source"]).rstrip() for c in json.loads((ws / "new.ipynb").read_text())["cells"]}
        assert cells == {"setup": NEW_SETUP, "loop": NEW_LOOP.rstrip()}
        assert (ws / "steps.log").read_text() == "".join(f"step {i}\n" for i in range(1, 61))
    finally:
        launch.stop()
        cleanup(store, tmp_path)
