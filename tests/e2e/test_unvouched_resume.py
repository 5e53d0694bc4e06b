"""Nothing runs unattended that no key vouches for (docs/threat-model.md).

A project gets a key at its first `spotwarp start` (mode 0600 in SpotWarp's config folder, never in the store).
A store writer without it edits the newest kernel record: a cell "running at a loop step" whose source leaves a
marker file, or its variables from a pickle whose reducer calls os.system; `created_ts` now, the checksum
recomputed, the signature dropped. A new host given no key restores the files and starts no kernel: the marker
never appears, the notebook never gets the forged source, and one line in `spotwarp start`'s output, the server log and `GET status` says why. Opted in (`--resume-unsigned`), the
same store resumes, with the warning wherever the resume is reported. A host given the project's key resumes;
the key appears in no store file, no log and no process's command line.

Each runs on a local store and on S3 (moto), where the writer edits the bucket's objects directly.
"""

from __future__ import annotations

import json
import os
import pickle
import shlex
import stat
import time
from pathlib import Path

import blake3
import pytest

from lab_server import carried_key
from new_hosts import kernel_pids, kill_host, notebook, start_host, unsigned, wait_for
from storage_servers import StorageTarget, make_target

pytestmark = pytest.mark.slow  # real servers and kernels, host A killed

FORGED = "open({marker!r}, 'w').write('pwned')\n"


@pytest.fixture(scope="module", params=("local", "s3"))
def signed_store(request, tmp_path_factory) -> tuple[Path, StorageTarget, str | None]:
    """Host A, started with no key set by hand, snapshots one notebook's kernel (x = 41) and is killed."""
    root = tmp_path_factory.mktemp("signed")
    store = make_target(request.param, request, root)
    a = start_host(root, "a", store.url, SPOTWARP_KEY="", **store.kernel_env())
    try:
        (a.workspace / "train.ipynb").write_text(json.dumps(notebook([("setup", "%load_ext spotwarp\nx = 41")])))
        nb = a.open_notebook("train.ipynb")
        pid = int(nb.run("import os as _o; print(_o.getpid())").strip())
        nb.run("%load_ext spotwarp\nx = 41", cell_id="setup")
        code, snap = a.request("POST", "spotwarp/api/snapshots", {"message": "x is 41"})
        assert code == 201 and snap["notebooks"] == ["train.ipynb"], snap
        kill_host(a, pid)
    finally:
        a.discard()
    return root, store, carried_key(root / "home-a", project="proj").get("SPOTWARP_KEY")


def test_the_first_start_keeps_a_key_the_user_alone_reads(signed_store):
    root, store, key = signed_store
    (kept,) = (root / "home-a" / ".spotwarp" / "keys").glob("proj@*.key")
    assert key and kept.read_text().strip() == key
    assert stat.S_IMODE(kept.stat().st_mode) == 0o600 and stat.S_IMODE(kept.parent.stat().st_mode) == 0o700
    log = (root / "a.log").read_text()
    assert "created a signing key for project 'proj'" in log and key not in log
    manifests = [json.loads(store.read(f"proj/snapshots/{name}")) for name in _manifest_names(store)]
    assert manifests and all(m.get("signature") for m in manifests)  # signed from the first snapshot on


def _manifest_names(store: StorageTarget) -> list[str]:
    return [name for name in store.names("proj/snapshots") if name.endswith(".json")]


def _running_cell(copy: StorageTarget, doc: dict, marker: Path) -> None:
    """The kernel record says a cell that leaves `marker` was running at a loop step."""
    source = FORGED.format(marker=str(marker))
    doc["kernels"]["train.ipynb"].update(at="step", running={"id": "setup", "source": source},
                                         cells=[{"id": "setup", "source": source}], positions={"train": 3})


class _Runs:
    """Unpickled, runs a shell command (what a forged pickle does)."""

    def __init__(self, command: str):
        self.command = command

    def __reduce__(self):
        return (os.system, (self.command,))


def _reducing_pickle(copy: StorageTarget, doc: dict, marker: Path) -> None:
    """The kernel record's variables come from a new object: a pickle whose reducer calls os.system."""
    data = pickle.dumps({"x": _Runs(f"echo pwned > {shlex.quote(str(marker))}")})
    oid = blake3.blake3(data).hexdigest()  # a content address anyone can compute
    copy.write(f"proj/objects/{oid[:2]}/{oid}", data)
    doc["kernels"]["train.ipynb"]["groups"][0]["pickle"] = {"id": oid, "size": len(data)}
    doc["objects"][oid] = len(data)


def _forged_copy(root: Path, store: StorageTarget, name: str, forge=_running_cell) -> tuple[StorageTarget, Path]:
    """A copy of the store whose newest kernel record a writer without the key rewrote (`forge`); the marker that
    running the forged code makes."""
    copy = store.beside(name)
    store.copy_to(copy)
    marker = root / f"marker-{name}"
    docs = {n: json.loads(copy.read(f"proj/snapshots/{n}")) for n in _manifest_names(copy)}
    newest = max(docs, key=lambda n: docs[n]["created_ts"])
    forge(copy, docs[newest], marker)
    copy.write(f"proj/snapshots/{newest}", unsigned(docs[newest], created_ts=time.time()))
    return copy, marker


def _settled(server) -> dict | None:
    """The status once the resume said what it did for the notebook (no entry still running)."""
    status = server.request("GET", "spotwarp/api/status")[1]
    entries = [e for e in status.get("resume") or [] if e["notebook"] == "train.ipynb"]
    return status if entries and entries[0]["state"] not in ("running",) else None



def test_a_forged_running_cell_runs_nothing_on_a_host_without_the_key(signed_store, hosts):
    root, store, _key = signed_store
    forged, marker = _forged_copy(root, store, "nokey")
    (root / "nokey").mkdir()
    b = start_host(root / "nokey", "b", forged.url, SPOTWARP_KEY="", **forged.kernel_env())
    hosts.append(b)
    status = wait_for(lambda: _settled(b), 120, "the resume's entry for train.ipynb", b)
    (entry,) = [e for e in status["resume"] if e["notebook"] == "train.ipynb"]
    assert entry["state"] == "skipped" and "no kernel is resumed" in entry["line"], entry
    assert "this host has no key" in entry["line"] and "SPOTWARP_KEY" in entry["line"]
    assert status["trust"]["vouched"] is False and status["trust"]["allowed"] is False
    assert "no key" in status["trust"]["line"]
    log = b.log()
    assert "spotwarp: project 'proj' has unsigned snapshots" in log  # start's own output: the forged one
    assert "SpotWarp resume: project 'proj'" in log  # the server log
    assert not marker.exists() and kernel_pids(b.workspace) == []
    assert "pwned" not in (b.workspace / "train.ipynb").read_text()  # the forged source is not in the notebook
    assert (b.workspace / "train.ipynb").exists()  # the files came back
    # a kernel the user opens here says it too: `%spotwarp status` and the widget's line
    nb = b.open_notebook("train.ipynb")
    said = nb.run("%load_ext spotwarp\n%spotwarp status")
    assert "key       project 'proj' is signed, and this host has no key for it" in said, said
    widget_line = nb.value("__import__('spotwarp_jupyter.widget.status', fromlist=['_']).protection("
                           "__import__('spotwarp_jupyter.kernel.session', fromlist=['_']).current().status())[1]")
    assert "this host has no key for it" in widget_line, widget_line
    assert not marker.exists()


def test_a_forged_pickle_unpickles_nothing_on_a_host_without_the_key(signed_store, hosts):
    root, store, _key = signed_store
    forged, marker = _forged_copy(root, store, "pickle", _reducing_pickle)
    (root / "pickle").mkdir()
    b = start_host(root / "pickle", "b", forged.url, SPOTWARP_KEY="", **forged.kernel_env())
    hosts.append(b)
    status = wait_for(lambda: _settled(b), 120, "the resume's entry for train.ipynb", b)
    (entry,) = [e for e in status["resume"] if e["notebook"] == "train.ipynb"]
    assert not marker.exists(), entry  # nothing was unpickled
    assert entry["state"] == "skipped" and "no kernel is resumed" in entry["line"], entry
    assert "this host has no key" in entry["line"] and status["trust"]["allowed"] is False
    assert kernel_pids(b.workspace) == []
    assert (b.workspace / "train.ipynb").exists()  # the files came back


def test_opted_in_the_same_store_resumes_with_the_warning(signed_store, hosts):
    root, store, _key = signed_store
    forged, marker = _forged_copy(root, store, "optin")
    (root / "optin").mkdir()
    b = start_host(root / "optin", "b", forged.url, "--resume-unsigned", SPOTWARP_KEY="", **forged.kernel_env())
    hosts.append(b)
    status = wait_for(lambda: _settled(b), 180, "the resume's entry for train.ipynb", b)
    (entry,) = [e for e in status["resume"] if e["notebook"] == "train.ipynb"]
    assert "no key vouches for" in entry["warning"] and "WARNING" in entry["line"], entry
    assert status["trust"]["allowed"] is True and status["trust"]["vouched"] is False
    assert "spotwarp: WARNING: resuming kernels from snapshot" in b.log()
    wait_for(marker.exists, 60, "the forged cell's marker (the risk accepted)", b)
    # the resumed kernel's own line, in the widget and `%spotwarp status`, carries the warning too
    nb = b.open_notebook("train.ipynb")
    assert nb.kernel_id == entry["kernel_id"]
    widget_line = nb.value("__import__('spotwarp_jupyter.widget.status', fromlist=['_']).protection("
                           "__import__('spotwarp_jupyter.kernel.session', fromlist=['_']).current().status())[1]")
    assert widget_line.startswith("protected: resumed") and "WARNING: " in widget_line, widget_line
    assert "no key vouches for" in widget_line and "no kernel is resumed" not in widget_line, widget_line


def test_a_host_given_the_key_resumes_and_the_key_never_leaves_the_host(signed_store, hosts):
    root, store, key = signed_store
    assert key, "host A kept no key"
    (root / "keyed").mkdir()
    b = start_host(root / "keyed", "b", store.url, **store.kernel_env(), **carried_key(root / "home-a", project="proj"))
    hosts.append(b)
    status = wait_for(lambda: _settled(b), 180, "the resume's entry for train.ipynb", b)
    (entry,) = [e for e in status["resume"] if e["notebook"] == "train.ipynb"]
    assert entry["state"] == "restored", entry
    assert status["trust"]["vouched"] is True and status["trust"]["line"] is None
    # in no store file, no log, no command line of the server or its kernels
    secret = key.encode()
    for name in store.files():
        assert secret not in store.read(name), name
    assert key not in b.log() and key not in (root / "a.log").read_text()
    pids = [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()]
    for pid in pids:
        try:
            assert secret not in Path(f"/proc/{pid}/cmdline").read_bytes(), pid
        except OSError:
            continue
    assert kernel_pids(b.workspace)  # the resumed kernel was running while its command line was read
