"""A store writer without SPOTWARP_KEY against real `spotwarp start` hosts with the key, on a local store and on S3
(moto), where the writer edits the bucket's objects directly.

Host A commits x = 41, then x = 42, and is SIGKILLed with its kernel. A new host B, in its own folder with an
empty workspace:
- junk (`{not json`) and an unsigned well-formed manifest (its checksum recomputed) named to sort newest are skipped: B resumes x = 42,
  and its status lists both as skipped;
- the newest manifest deleted: B refuses to resume `latest`, naming the missing snapshot; B started with the
  older snapshot's id resumes it (x = 41).
A variable whose object is damaged fails to restore on B; B's next snapshot carries it forward, so the host after
B says in its resume entry that it is not restored.
"""

from __future__ import annotations

import json
import urllib.error
from pathlib import Path

import pytest

from lab_server import LabServer, host_env
from new_hosts import kernel_pids, kill_host, notebook, start_host, unsigned, wait_for
from storage_servers import StorageTarget, make_target

pytestmark = pytest.mark.slow  # real servers and kernels, one host killed

KEY = "store-trust-test-key-not-a-secret"
JUNK = "99991231T235959999Z-zzzzzzzz.json"
UNSIGNED = "99991231T235959998Z-yyyyyyyy.json"


@pytest.fixture(scope="module", params=("local", "s3"))
def lost_host(request, tmp_path_factory) -> tuple[Path, StorageTarget, list[dict]]:
    """Host A's store after two commits (x = 41, then x = 42), A killed; the two manifests, oldest first."""
    tmp_path = tmp_path_factory.mktemp("trust")
    store = make_target(request.param, request, tmp_path)
    a = start_host(tmp_path, "a", store.url, SPOTWARP_KEY=KEY, **store.kernel_env())
    try:
        (a.workspace / "n.ipynb").write_text(json.dumps(notebook([("setup", "%load_ext spotwarp\nx = 41")])))
        socket = a.open_notebook("n.ipynb")
        pid = int(socket.run("import os as _o; print(_o.getpid())").strip())
        socket.run("%load_ext spotwarp\nx = 41", cell_id="setup")
        ids = []
        for message in ("forty-one", "forty-two"):
            if message == "forty-two":
                socket.run("x = 42")
            code, snap = a.request("POST", "spotwarp/api/snapshots", {"message": message})
            assert code == 201, snap
            ids.append(snap["id"])
        kill_host(a, pid)
    finally:
        a.discard()
    names = [n for n in store.names("proj/snapshots") if n.endswith(".json")]
    docs = {json.loads(store.read(f"proj/snapshots/{n}"))["id"]: n for n in names}
    return tmp_path, store, [{"id": i, "name": docs[i]} for i in ids]


def _copy(lost_host, name: str) -> tuple[Path, StorageTarget]:
    """A's store as A left it, at A's path (a signature binds the store's location), and a folder for host `name`."""
    root, store, _ = lost_host
    pristine = store.beside("as-left")
    if not pristine.files():
        store.copy_to(pristine)
    pristine.copy_to(store)
    (root / name).mkdir()
    return root / name, store


def _resumed(server: LabServer) -> dict | None:
    try:
        code, status = server.request("GET", "spotwarp/api/status")
    except (urllib.error.URLError, ConnectionError):
        return None  # not serving yet
    entries = {e["notebook"]: e for e in status.get("resume") or []}
    entry = entries.get("n.ipynb")
    return entry if entry and entry["state"] != "running" else None



def test_junk_and_unsigned_newest_manifests_are_skipped(lost_host, hosts):
    folder, store = _copy(lost_host, "b")
    store.write(f"proj/snapshots/{JUNK}", "{not json")
    newer = lost_host[2][1]
    store.write(f"proj/snapshots/{UNSIGNED}", unsigned(json.loads(store.read(f"proj/snapshots/{newer['name']}")),
                                                         id="yyyyyyyy"))
    b = start_host(folder, "b", store.url, SPOTWARP_KEY=KEY, **store.kernel_env())
    hosts.append(b)
    entry = wait_for(lambda: _resumed(b), 120, "the resume line", b)
    assert entry["state"] == "restored" and f"snapshot {newer['id']}" in entry["line"], entry
    code, status = b.request("GET", "spotwarp/api/status")
    rejected = status["rejected"]
    assert sorted(rejected) == sorted([JUNK, UNSIGNED]) and all(r.startswith("skipped: ") for r in rejected.values())
    assert "is unsigned, but SPOTWARP_KEY is set here" in rejected[UNSIGNED], rejected
    assert b.open_notebook("n.ipynb").value("x") == 42


def test_a_deleted_newest_manifest_is_detected_and_an_explicit_id_still_restores(lost_host, hosts):
    folder, store = _copy(lost_host, "c")
    older, newer = lost_host[2]
    store.delete(f"proj/snapshots/{newer['name']}")
    (folder / "home-c").mkdir()
    c = LabServer(folder / "ws-c", store.url, "proj", host_env(folder / "home-c", SPOTWARP_KEY=KEY,
                                                                SPOTWARP_BACKUP_INTERVAL="0", **store.kernel_env()),
                  folder / "c.log")
    hosts.append(c)
    wait_for(lambda: c.proc.poll() is not None or _resumed(c), 120, "start to refuse or resume", c)
    assert c.proc.poll() not in (None, 0), c.log()
    assert f"snapshot {newer['id']}" in c.log() and "rolled back" in c.log(), c.log()
    assert not (folder / "ws-c" / "n.ipynb").exists()  # nothing restored
    d = start_host(folder, "d", store.url, "--snapshot", older["id"], SPOTWARP_KEY=KEY, **store.kernel_env())
    hosts.append(d)
    entry = wait_for(lambda: _resumed(d), 120, "the resume line", d)
    assert entry["state"] == "restored", entry
    assert d.open_notebook("n.ipynb").value("x") == 41


BIG = "%load_ext spotwarp\nimport numpy as np\nn = 5\nbig = np.arange(5_000_000, dtype=np.float64)"


def test_a_variable_that_failed_to_restore_is_named_by_the_next_hosts_resume(tmp_path, hosts):
    store = str(tmp_path / "store")
    a = start_host(tmp_path, "a", store, SPOTWARP_KEY=KEY)
    hosts.append(a)
    (a.workspace / "n.ipynb").write_text(json.dumps(notebook([("setup", BIG)])))
    a.open_notebook("n.ipynb").run(BIG, cell_id="setup")
    assert a.request("POST", "spotwarp/api/snapshots", {"message": "big"})[0] == 201
    kill_host(a, *kernel_pids(a.workspace))
    victim = max((p for p in (Path(store) / "proj" / "objects").rglob("*") if p.is_file()),
                 key=lambda p: p.stat().st_size)
    data = bytearray(victim.read_bytes())
    data[4096] ^= 0xFF
    victim.write_bytes(bytes(data))
    b = start_host(tmp_path, "b", store, SPOTWARP_KEY=KEY)
    hosts.append(b)
    assert wait_for(lambda: _resumed(b), 120, "the resume line", b)["state"] == "restored"
    kernel = b.open_notebook("n.ipynb")  # the resumed kernel: the session exists
    assert "could not restore big" in kernel.run("try:\n    big\nexcept NameError:\n    print('no big')")
    kernel.run("n = 6")
    assert b.request("POST", "spotwarp/api/snapshots", {"message": "after the failed restore"})[0] == 201
    kill_host(b, *kernel_pids(b.workspace))
    c = start_host(tmp_path, "c", store, SPOTWARP_KEY=KEY)
    hosts.append(c)
    entry = wait_for(lambda: _resumed(c), 120, "the resume line", c)
    assert entry["state"] == "restored" and "without big" in entry["line"], entry
    assert entry["line"] in c.log()
    assert c.open_notebook("n.ipynb").value("n") == 6
