"""The session resumes by itself on the new host, nobody at the keyboard.

Host A (`spotwarp start`, a notebook session driven as JupyterLab drives it: execute requests carrying the cell id)
runs a setup cell and a `resumable` DataLoader loop (shuffled, seeded generator) and is SIGKILLed mid-loop with its
kernel. Host B (`spotwarp start` on an empty workspace: another folder, HOME and port, the same store) is left
alone: no client connects to it. The loop must continue at the next batch and finish; the weights, the loss
history and the draws after the loop must equal those of an uninterrupted run; the notebook on B's disk must hold
the cell's final output; B's session for the notebook must hold the trained state.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

import pytest

from new_hosts import (
    LOOP,
    SETUP,
    TOTAL,
    completed,
    finished_on,
    kernel_manifests,
    kernel_pids,
    kill_host,
    notebook,
    reference_run,
    restart_host,
    resume_entry,
    start_host,
    wait_for,
)

pytestmark = pytest.mark.slow  # real servers and kernels, one killed

DRAFT = "for epoch in range(2):\n    pass  # an older draft of the loop cell\n"


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> dict:
    """The same notebook run without interruption."""
    return reference_run(tmp_path_factory.mktemp("reference"))


def lose_host_a(tmp_path, hosts: list, store: str) -> int:
    """Host A sets up, trains, and is SIGKILLed mid-loop with its kernel; the steps its newest snapshot completed."""
    a = start_host(tmp_path, "a", store, STEP_PAUSE="0.15", PYTHONHASHSEED="0")
    hosts.append(a)
    # the file holds an older draft of the loop cell: what ran (and must run again) is LOOP, sent with its id
    (a.workspace / "train.ipynb").write_text(json.dumps(notebook([("setup", SETUP), ("loop", DRAFT)])))
    nb = a.open_notebook("train.ipynb")
    kernel_pid = int(nb.run("import os as _o; print(_o.getpid())").strip())
    # the files and the notebook; before the setup cell: asking a kernel connects a client, which draws from
    # `random` (kernel_info_request), and the reference run has no such client
    code, _ = a.request("POST", "spotwarp/api/snapshots", {"message": "the notebook"})
    assert code == 201
    nb.run(SETUP, cell_id="setup")
    nb.send(LOOP, cell_id="loop")
    wait_for(lambda: len([m for m in kernel_manifests(store, "proj")
                          if m["kernels"]["train.ipynb"].get("at") == "step"]) >= 3, 120, "snapshots inside the loop", a)
    kill_host(a, kernel_pid)
    newest = _newest_record(store)
    assert newest["at"] == "step" and (newest["running"]["id"], newest["running"]["source"]) == ("loop", LOOP)
    done_on_a = completed(newest["positions"])
    assert 0 < done_on_a < TOTAL - 12, newest["positions"]  # B has steps left to run
    return done_on_a


def _newest_record(store: str, after: float = 0.0) -> dict:
    docs = [m for m in kernel_manifests(store, "proj") if m["created_ts"] > after]
    return max(docs, key=lambda m: m["created_ts"])["kernels"]["train.ipynb"] if docs else {}


def test_the_interrupted_loop_continues_on_a_new_host_with_nobody_at_the_keyboard(tmp_path, hosts, reference):
    store = str(tmp_path / "store")
    done_on_a = lose_host_a(tmp_path, hosts, store)
    # an empty workspace; nobody connects to it; its steps take a while (compute), long enough to see them land
    b = start_host(tmp_path, "b", store, PYTHONHASHSEED="0", STEP_PAUSE="0.3")
    hosts.append(b)
    entry = finished_on(b, reference, partial_seen=True)
    assert completed(entry["positions"]) >= done_on_a
    report = json.loads(subprocess.run([sys.executable, "-m", "spotwarp_jupyter.cli", "report", "--project-id", "proj",
                                        "--storage", store, "--json"], capture_output=True, text=True, check=True).stdout)
    (row,) = report["resumes"]
    assert (row["notebook"], row["snapshot"], row["cell"]) == ("train.ipynb", entry["snapshot"], "loop")
    assert row["positions"] == entry["positions"] and row["start_to_running_s"] == entry["seconds_to_running"] > 0
    # A left no notice: B's resume found its last heartbeat in the store, counted the loss, and estimated up to it
    assert row["steps_redone"] >= 0 and "to its last heartbeat" in row["steps_redone_how"], row
    assert row["steps_redone_upper_bound"] is False
    (loss,) = report["events"]
    assert loss["with_notice"] is False and loss["survived"] is True and loss["restored_on"], loss
    assert (report["preemptions"], report["preemptions_survived"]) == (1, 1)
    # the file held an older draft; the restored notebook holds the source that ran, which runs again
    assert "differs from what ran" not in entry["line"]
    cells = json.loads((b.workspace / "train.ipynb").read_text())["cells"]
    assert ["".join(c["source"]) for c in cells if c["id"] == "loop"] == [LOOP]  # the cell shows what ran, with its outputs


def test_a_second_loss_during_the_resumed_run_resumes_again_on_a_third_host(tmp_path, hosts, reference):
    store = str(tmp_path / "store")
    lose_host_a(tmp_path, hosts, store)
    started_b = time.time()
    b = start_host(tmp_path, "b", store, PYTHONHASHSEED="0", STEP_PAUSE="0.3")
    hosts.append(b)
    # B's own snapshots of the resumed run, taken inside the loop: they name the cell it re-ran
    wait_for(lambda: len([m for m in kernel_manifests(store, "proj") if m["created_ts"] > started_b
                          and m["kernels"]["train.ipynb"].get("at") == "step"]) >= 3, 120, "B's snapshots in the loop", b)
    kill_host(b, *kernel_pids(b.workspace))
    newest = _newest_record(store, after=started_b)
    assert (newest["running"]["id"], newest["running"]["source"]) == ("loop", LOOP)
    c = start_host(tmp_path, "c", store, PYTHONHASHSEED="0")
    hosts.append(c)
    entry = finished_on(c, reference)
    assert completed(entry["positions"]) >= completed(newest["positions"])  # from B's newest, not A's
    report = json.loads(subprocess.run([sys.executable, "-m", "spotwarp_jupyter.cli", "report", "--project-id", "proj",
                                        "--storage", store, "--json"], capture_output=True, text=True, check=True).stdout)
    # two losses without notice, each found by the resume after it
    assert [(e["with_notice"], e["survived"]) for e in report["events"]] == [(False, True), (False, True)], report


def test_a_server_restarted_on_its_kept_workspace_resumes_by_itself(tmp_path, hosts, reference):
    """The home outlived the server (a kept volume): its files stay as they are, and the kernel still resumes from
    the newest snapshot, the interrupted cell continuing at the next batch."""
    store = str(tmp_path / "store")
    done_on_a = lose_host_a(tmp_path, hosts, store)
    workspace = hosts[0].workspace
    (workspace / "notes.md").write_text("written after the last snapshot\n")  # newer than any snapshot
    b = restart_host(tmp_path, hosts[0], "a-again", store, PYTHONHASHSEED="0")
    hosts.append(b)
    entry = wait_for(lambda: resume_entry(b), 90, "a resume entry for the notebook", b)
    assert entry["state"] in ("running", "finished"), entry
    assert "the notebook on disk kept as it is" in entry["line"], entry["line"]
    entry = finished_on(b, reference)
    assert completed(entry["positions"]) >= done_on_a
    assert (workspace / "notes.md").read_text() == "written after the last snapshot\n"
    start = b.request("GET", "spotwarp/api/status")[1]["start_restore"]
    assert start["restored"] is True and start["kept"] is True, start
    assert "already holds files: kept as they are" in start["line"], start
    # the decisions are lines of the server's own log, with their time and level
    assert re.search(r"\[I \d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+ ServerApp\] SpotWarp start restore: the workspace .* "
                     r"already holds files", b.log()), b.log()[-3000:]
    assert re.search(r"\[I [\d: .-]+ ServerApp\] SpotWarp resume: train.ipynb: .*kept as it is; re-running cell loop",
                     b.log()), b.log()[-3000:]


def test_a_kept_notebook_that_lost_the_running_cell_gets_the_state_and_runs_nothing(tmp_path, hosts):
    """The kept notebook was edited after the snapshot and no longer holds the interrupted cell: the notebook as its
    user left it wins; the kernel gets the snapshot's state, nothing runs, and the entry says why in one line."""
    store = str(tmp_path / "store")
    lose_host_a(tmp_path, hosts, store)
    path = hosts[0].workspace / "train.ipynb"
    edited = notebook([("setup", SETUP), ("plot", "print('a new cell')\n")])
    path.write_text(json.dumps(edited))
    saved = max(m["created_ts"] for m in kernel_manifests(store, "proj")) + 20.0
    os.utime(path, (saved, saved))  # saved 20 s after the newest snapshot, as a user's edit would be
    b = restart_host(tmp_path, hosts[0], "a-again", store, PYTHONHASHSEED="0")
    hosts.append(b)
    entry = wait_for(lambda: resume_entry(b).get("state") in ("restored", "running", "failed") and resume_entry(b), 90,
                     "a resume entry for the notebook", b)
    assert entry["state"] == "restored" and entry["interrupted_cell"] == "loop", entry
    assert re.search(r"the notebook on disk, kept as it is, was saved (19\.\d|20\.\d) s after that snapshot: the kernel holds the "
                     r"snapshot's state, the newest stored; cell loop was running, and the notebook on disk no longer "
                     r"holds it: not run again", entry["line"]), entry["line"]
    assert json.loads(path.read_text()) == edited  # the user's notebook as they left it
    session = b.open_notebook("train.ipynb")  # attaches to the resumed kernel: the snapshot's state, nothing run
    assert session.kernel_id == entry["kernel_id"]
    assert session.value("len(losses)") == completed(entry["positions"])
