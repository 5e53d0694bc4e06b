"""What resuming on a new host must not do.

A cell running outside a `resumable` loop is not run again (it may have side effects): the kernel's state comes
back and the status names the cell. `spotwarp start --no-resume` starts no kernel. A kernelspec this host lacks, a
notebook whose policy says `--no-resume`, and a damaged newest snapshot each give one line in the status and the
log, and run nothing. A notebook absent from the workspace comes back rebuilt from the cells its kernel ran.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from new_hosts import kill_host, notebook, start_host, wait_for

pytestmark = pytest.mark.slow  # real servers and kernels, one host killed

SLOW = "open('side_effect', 'a').write('ran\\n')\nx += 1\nspotwarp.snapshot()\nimport time\ntime.sleep(600)\n"
NOTEBOOKS = {  # notebook -> (its file's cells, or None when the file is not in the workspace; kernelspec; code run)
    "slow.ipynb": ("python3", "%load_ext spotwarp\nimport spotwarp\nx = 41"),
    "gone.ipynb": (None, "%load_ext spotwarp\ny = 1"),
    "gpu.ipynb": ("py-gpu", "%load_ext spotwarp\nz = 1"),
    "optout.ipynb": ("python3", "%load_ext spotwarp\n%spotwarp policy --no-resume\nw = 1"),
}


@pytest.fixture(scope="module")
def lost_host(tmp_path_factory) -> tuple[Path, str]:
    """Host A, four notebooks' kernels; `slow.ipynb` runs a cell outside any loop when A is killed."""
    tmp_path = tmp_path_factory.mktemp("lost")
    store = str(tmp_path / "store")
    a = start_host(tmp_path, "a", store)
    try:
        pids, sockets = [], {}
        for name, (spec, code) in NOTEBOOKS.items():
            if spec is not None:
                (a.workspace / name).write_text(json.dumps(notebook([("setup", code), ("slow", SLOW)], spec)))
            sockets[name] = a.open_notebook(name)
            pids.append(int(sockets[name].run("import os as _o; print(_o.getpid())").strip()))
            sockets[name].run(code, cell_id="setup")
        code, snap = a.request("POST", "spotwarp/api/snapshots", {"message": "every notebook"})
        assert code == 201 and sorted(snap["notebooks"]) == sorted(NOTEBOOKS), snap
        sockets["slow.ipynb"].send(SLOW, cell_id="slow")
        wait_for(lambda: (a.workspace / "side_effect").exists() and _newest(store, "slow.ipynb").get("at") == "call",
                 60, "the snapshot taken inside the slow cell", a)
        kill_host(a, *pids)
    finally:
        a.discard()
    return tmp_path, store


def _newest(store: str, name: str) -> dict:
    docs = [json.loads(p.read_text()) for p in (Path(store) / "proj" / "snapshots").glob("*.json")]
    docs = [d for d in docs if name in d["kernels"]]
    return max(docs, key=lambda d: d["created_ts"])["kernels"][name] if docs else {}


def _copy(lost_host, name: str) -> tuple[Path, str]:
    """The store as host A left it, back at its own location (signed snapshots are valid only where they were
    made), for host `name`; the first call keeps A's store aside, later ones put it back."""
    root, store = lost_host
    kept = root / "store-as-left"
    if not kept.exists():
        shutil.copytree(store, kept)
    shutil.rmtree(store)
    shutil.copytree(kept, store)
    return root / name, store


def _settled(server, names: set[str]):
    code, status = server.request("GET", "spotwarp/api/status")
    entries = {e["notebook"]: e for e in status.get("resume") or []}
    return entries if names <= set(entries) and all(e["state"] != "running" for e in entries.values()) else None



def test_only_what_may_be_resumed_is_and_nothing_runs_again(lost_host, hosts):
    folder, store = _copy(lost_host, "b")
    folder.mkdir()
    b = start_host(folder, "b", store)
    hosts.append(b)
    entries = wait_for(lambda: _settled(b, set(NOTEBOOKS)), 120, "every notebook's resume line", b)
    slow = entries["slow.ipynb"]
    assert slow["state"] == "restored" and slow["interrupted_cell"] == "slow", slow
    assert "cell slow was running (outside a resumable loop): not run again" in slow["line"]
    # its file never was in the workspace: rebuilt from the cell its kernel ran, its state restored
    assert entries["gone.ipynb"]["state"] == "restored" and "no cell was running" in entries["gone.ipynb"]["line"]
    assert [c["id"] for c in json.loads((b.workspace / "gone.ipynb").read_text())["cells"]] == ["setup"]
    assert entries["gpu.ipynb"]["state"] == "skipped" and "'py-gpu' is not installed" in entries["gpu.ipynb"]["line"]
    assert entries["optout.ipynb"]["state"] == "skipped" and "--no-resume" in entries["optout.ipynb"]["line"]
    for entry in entries.values():
        assert entry["line"] in b.log() and "\n" not in entry["line"]
    code, sessions = b.request("GET", "api/sessions")
    assert sorted(s["path"] for s in sessions) == ["gone.ipynb", "slow.ipynb"]
    # as the snapshot inside the cell found it: the interrupted cell did not run again
    assert (b.workspace / "side_effect").read_text() == "ran\n"
    assert b.open_notebook("slow.ipynb").value("x") == 42  # the state as the snapshot inside the cell had it
    assert b.request("DELETE", f"api/kernels/{slow['kernel_id']}")[0] == 204
    code, answer = b.request("POST", "spotwarp/api/resume/run", {"notebook": "slow.ipynb"})
    assert code == 409 and "its resumed kernel" in answer["message"] and "is gone" in answer["message"], answer


def test_no_resume_starts_no_kernel(lost_host, hosts):
    folder, store = _copy(lost_host, "c")
    folder.mkdir()
    b = start_host(folder, "c", store, "--no-resume")
    hosts.append(b)
    entries = wait_for(lambda: _settled(b, {"*"}), 60, "the resume line", b)
    assert entries["*"]["state"] == "off" and "--no-resume" in entries["*"]["line"]
    assert b.request("GET", "api/sessions")[1] == []
    assert (b.workspace / "slow.ipynb").exists()  # the files are back all the same


def test_a_damaged_newest_snapshot_restores_nothing_and_runs_nothing(lost_host, hosts):
    folder, store = _copy(lost_host, "d")
    folder.mkdir()
    record = _newest(store, "slow.ipynb")
    for group in record["groups"]:  # every object of the newest state of slow.ipynb loses a byte
        for path in (Path(store) / "proj" / "objects").glob(f"*/{group['pickle']['id']}"):
            path.write_bytes(path.read_bytes()[:-1])
    b = start_host(folder, "d", store)
    hosts.append(b)
    entries = wait_for(lambda: _settled(b, set(NOTEBOOKS)), 120, "every notebook's resume line", b)
    slow = entries["slow.ipynb"]
    assert slow["state"] == "failed" and "state not restored, nothing run" in slow["line"], slow
    assert slow["line"] in b.log() and "\n" not in slow["line"]
    assert (b.workspace / "side_effect").read_text() == "ran\n"


def test_the_interrupted_cell_runs_in_its_resumed_kernel_once_asked(lost_host, hosts):
    folder, store = _copy(lost_host, "e")
    folder.mkdir()
    b = start_host(folder, "e", store)
    hosts.append(b)
    entries = wait_for(lambda: _settled(b, set(NOTEBOOKS)), 120, "every notebook's resume line", b)
    for body, want, words in (({"notebook": "nope.ipynb"}, 404, "nope.ipynb: not resumed on this host"),
                              ({"notebook": "gone.ipynb"}, 409, "gone.ipynb: no interrupted cell waits to run"),
                              ({}, 400, "notebook must be the notebook's path"),
                              ({"notebook": "slow.ipynb", "cell": "x"}, 400, "unknown field(s) cell")):
        code, answer = b.request("POST", "spotwarp/api/resume/run", body)
        assert (code, "\n" in answer["message"]) == (want, False) and words in answer["message"], (body, answer)
    assert b.request("POST", "spotwarp/api/resume/run", {"notebook": "slow.ipynb"}, token=None)[0] == 403
    assert (b.workspace / "side_effect").read_text() == "ran\n"
    code, answer = b.request("POST", "spotwarp/api/resume/run", {"notebook": "slow.ipynb"})
    assert code == 202 and answer["state"] == "running" and answer["cell"] == "slow", answer
    assert "interrupted_cell" not in answer and answer["kernel_id"] == entries["slow.ipynb"]["kernel_id"]
    wait_for(lambda: (b.workspace / "side_effect").read_text() == "ran\nran\n", 60, "the interrupted cell running again",
             b)
    code, answer = b.request("POST", "spotwarp/api/resume/run", {"notebook": "slow.ipynb"})
    assert code == 409 and "no interrupted cell waits to run (state running)" in answer["message"], answer
    assert b.request("POST", f"api/kernels/{entries['slow.ipynb']['kernel_id']}/interrupt")[0] == 204
    slow = wait_for(lambda: (_settled(b, set(NOTEBOOKS)) or {}).get("slow.ipynb"), 60, "the cell's end", b)
    assert slow["state"] == "failed" and "ran again, as asked, and ended: KeyboardInterrupt" in slow["line"], slow
    assert slow["line"] in b.log()
    document = json.loads((b.workspace / "slow.ipynb").read_text())
    cell = next(c for c in document["cells"] if c["id"] == "slow")
    assert [o["ename"] for o in cell["outputs"] if o["output_type"] == "error"] == ["KeyboardInterrupt"], cell
    assert b.open_notebook("slow.ipynb").value("x") == 43  # in the resumed kernel: 42 restored, + 1
