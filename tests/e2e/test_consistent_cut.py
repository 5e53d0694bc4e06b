"""A loss before any timed file backup resumes by itself, files and kernel state of one moment.

Host A runs `spotwarp start` with the server's default file backup interval (300 s), so no timed backup runs in
this test. In a notebook saved once empty (as JupyterLab's "New notebook" leaves it), a setup cell and a
`resumable` loop cell are typed and run, never saved; the loop appends a line per step to a file in the
workspace and prints it. A is SIGKILLed with its kernel mid-loop. Host B (`spotwarp start` on an empty
workspace, the same store, nobody touching it) must bring back the notebook with the cells that ran and the loop
cell's outputs up to the snapshot, the log file as it was at the restored step, and continue the loop: the log
and the cell's outputs then hold every step exactly once.
"""

from __future__ import annotations

import json

import pytest

from new_hosts import kernel_manifests, kill_host, new_user_host, notebook, resume_entry, wait_for

pytestmark = pytest.mark.slow  # two real servers, one killed with its kernel

STEPS = 60
SETUP = "%load_ext spotwarp\n%spotwarp policy --every 0.2s --no-after-cell\nimport os, time, spotwarp\n"
LOOP = f"""for i in spotwarp.resumable(range(1, {STEPS + 1}), name="steps"):
    with open("train.log", "a") as log:
        log.write(f"step {{i}}\\n")
    print(f"step {{i}}", flush=True)
    time.sleep(float(os.environ.get("STEP_PAUSE", "0")))
print("done")
"""
EVERY_STEP = "".join(f"step {i}\n" for i in range(1, STEPS + 1))



def test_a_loss_before_any_file_backup_resumes_with_files_of_the_restored_step(tmp_path, hosts):
    store = str(tmp_path / "store")
    a = new_user_host(tmp_path, "a", store, STEP_PAUSE="0.1")
    hosts.append(a)
    (a.workspace / "train.ipynb").write_text(json.dumps(notebook([])))
    nb = a.open_notebook("train.ipynb")
    kernel_pid = int(nb.run("import os as _o; print(_o.getpid())").strip())
    nb.run(SETUP, cell_id="setup")
    nb.send(LOOP, cell_id="loop")
    wait_for(lambda: len([m for m in kernel_manifests(store, "proj")
                          if m["kernels"]["train.ipynb"].get("at") == "step"]) >= 3, 120, "snapshots inside the loop", a)
    kill_host(a, kernel_pid)
    names = [json.loads(p.read_text())["kind"] for p in (tmp_path / "store" / "proj" / "snapshots").glob("*.json")]
    assert "project" not in names  # no timed file backup ran: only kernel snapshots hold the files
    newest = max(kernel_manifests(store, "proj"), key=lambda m: m["created_ts"])["kernels"]["train.ipynb"]
    done_on_a = newest["positions"]["steps"]
    assert 0 < done_on_a < STEPS

    b = new_user_host(tmp_path, "b", store)
    hosts.append(b)
    assert "has no snapshot yet" not in b.log()
    entry = wait_for(lambda: resume_entry(b).get("state") in ("finished", "failed") and resume_entry(b), 180,
                     "the resumed loop to end on B", b)
    assert entry["state"] == "finished" and entry["cell"] == "loop", entry
    restored_at = entry["positions"]["steps"]
    assert restored_at >= done_on_a
    cells = {c["id"]: c for c in json.loads((b.workspace / "train.ipynb").read_text())["cells"]}
    assert {cid: "".join(c["source"]).rstrip() for cid, c in cells.items()} == {"setup": SETUP.rstrip(),
                                                                                 "loop": LOOP.rstrip()}
    # the outputs up to the snapshot came back with the cell; the resumed run's follow them
    printed = "".join("".join(o.get("text", "")) for o in cells["loop"]["outputs"])
    assert printed == EVERY_STEP + "done\n"
    # the log held the restored step's lines: the resumed steps appended to it, none twice, none missing
    assert (b.workspace / "train.log").read_text() == EVERY_STEP
