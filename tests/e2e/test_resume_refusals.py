"""Issue 22: what resuming on a new host must not do.

A cell running outside a `resumable` loop is not run again (it may have side effects): the kernel's state comes
back and the status names the cell. `spotwarp start --no-resume` starts no kernel. A notebook no longer in the
workspace, a kernelspec this host lacks, a notebook whose policy says `--no-resume`, and a damaged newest snapshot
each give one line in the status and the log, and run nothing.
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
    root, store = lost_host
    copy = root / f"store-{name}"
    shutil.copytree(store, copy)
    return root / name, str(copy)


def _settled(server, names: set[str]):
    code, status = server.request("GET", "spotwarp/api/status")
    entries = {e["notebook"]: e for e in status.get("resume") or []}
    return entries if names <= set(entries) and all(e["state"] != "running" for e in entries.values()) else None


@pytest.fixture
def hosts():
    started = []
    yield started
    for server in started:
        server.discard()


def test_only_what_may_be_resumed_is_and_nothing_runs_again(lost_host, hosts):
    folder, store = _copy(lost_host, "b")
    folder.mkdir()
    b = start_host(folder, "b", store)
    hosts.append(b)
    entries = wait_for(lambda: _settled(b, set(NOTEBOOKS)), 120, "every notebook's resume line", b)
    slow = entries["slow.ipynb"]
    assert slow["state"] == "restored" and slow["interrupted_cell"] == "slow", slow
    assert "cell slow was running (outside a resumable loop): not run again" in slow["line"]
    assert entries["gone.ipynb"]["state"] == "skipped" and "not in the workspace" in entries["gone.ipynb"]["line"]
    assert entries["gpu.ipynb"]["state"] == "skipped" and "'py-gpu' is not installed" in entries["gpu.ipynb"]["line"]
    assert entries["optout.ipynb"]["state"] == "skipped" and "--no-resume" in entries["optout.ipynb"]["line"]
    for entry in entries.values():
        assert entry["line"] in b.log() and "\n" not in entry["line"]
    code, sessions = b.request("GET", "api/sessions")
    assert [s["path"] for s in sessions] == ["slow.ipynb"]
    assert not (b.workspace / "side_effect").exists()  # the interrupted cell did not run again
    assert b.open_notebook("slow.ipynb").value("x") == 42  # the state as the snapshot inside the cell had it


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
    assert not (b.workspace / "side_effect").exists()
