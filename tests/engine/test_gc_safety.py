"""gc never deletes what a committed, in-flight or refused snapshot names.

Real stores (a local folder and the GCS emulator), real writers (the kernel's persist writer and the
workspace writer), gc from another engine as another host would run it, and real kernels for `--keep`.
"""

from __future__ import annotations

import json
import os
import posixpath
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from spotwarp_jupyter.engine import SnapshotEngine
from spotwarp_jupyter.engine.pickling import main_namespace
from spotwarp_jupyter.engine.variables.capture import capture_namespace

from engines import UNSIGNED, make_engine
from lab_server import tree
from storage_servers import StorageTarget, make_target

KEY_A, KEY_B = b"team-secret-a", b"another-teams-secret"


@pytest.fixture(params=("local", "gcs"))
def target(request: pytest.FixtureRequest, tmp_path: Path) -> StorageTarget:
    """A local store and one object-store emulator."""
    return make_target(request.param, request, tmp_path)


def make_old(path: Path, seconds: float = 7200) -> None:
    for p in [path, *path.rglob("*")]:
        if p.is_file():
            os.utime(p, (p.stat().st_atime - seconds, p.stat().st_mtime - seconds))


def commit_kernel(engine: SnapshotEngine, namespace: dict, on_written=None):
    """The kernel writer's path (capture, persist, commit), with its hook after each buffer is durable."""
    with main_namespace(namespace):
        image = capture_namespace(namespace, lazy=True)
        return engine.commit_image(image, on_written=on_written)


def check_every_snapshot_restores(target: StorageTarget, tmp_path: Path, files: dict[str, bytes] | None = None) -> None:
    """Verify every snapshot a fresh host sees, restore each one's kernel state and the newest files."""
    reader = make_engine(target, key=UNSIGNED)
    report = reader.verify()
    assert report.ok, report.problems
    for m in reader.manifests():
        if m.kernels:
            ns: dict = {}
            reader.restore_kernel(m.id, ns, notebook=next(iter(m.kernels)))
            assert ns, m.id
    newest_files = reader.with_files()
    if files is not None and newest_files is not None:
        into = tmp_path / f"restored-{newest_files.id}"
        reader.restore_files(newest_files, str(into))
        assert tree(into) == files


# -- item 1: a gc while a writer reuses an old object -----------------------------------------------------


def test_gc_during_a_kernel_snapshot_keeps_the_objects_it_reuses(target, tmp_path):
    kernel, files_writer, collector = [make_engine(target, key=UNSIGNED) for _ in range(3)]
    big = np.arange(100_000.0)
    kernel.snapshot_kernel({"big": big, "step": np.zeros(100)})
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "notes.txt").write_text("notes")
    files_writer.snapshot_project(str(ws))  # newer than the kernel's snapshot, and does not name `big`
    ran = []

    def gc_meanwhile(_view):  # after the writer found `big` stored and reused it, before its commit
        if not ran:
            ran.append(collector.gc(keep=1, grace_s=0))

    made = commit_kernel(kernel, {"big": big, "step": np.ones(100)}, on_written=gc_meanwhile)
    assert ran, "gc did not run while the snapshot was being written"
    reader = make_engine(target, key=UNSIGNED)
    assert reader.verify(made.id).ok, reader.verify(made.id).problems
    ns: dict = {}
    reader.restore_kernel(made.id, ns)
    assert np.array_equal(ns["big"], big) and ns["step"].tolist() == [1.0] * 100
    assert "being written" in (ran[0].objects_left or "")


def test_gc_during_a_workspace_snapshot_keeps_the_chunks_it_reuses(target, tmp_path):
    writer, other_writer, collector = [make_engine(target, key=UNSIGNED) for _ in range(3)]
    ws, ws2 = tmp_path / "ws", tmp_path / "ws2"
    ws.mkdir()
    ws2.mkdir()
    (ws / "data.bin").write_bytes(os.urandom(200_000))
    (ws2 / "other.txt").write_text("another workspace of the project")
    make_old(ws)
    writer.snapshot_project(str(ws))
    ran = []

    def meanwhile(_done, _total, _path):  # the writer has checked data.bin's chunks are stored and reuses them
        if not ran:
            ran.append(other_writer.snapshot_project(str(ws2)))  # a newer snapshot not naming them
            ran.append(collector.gc(keep=1, grace_s=0))

    made = writer.snapshot_project(str(ws), progress=meanwhile)
    assert ran and made.stats["files_reused"] == 1
    reader = make_engine(target, key=UNSIGNED)
    assert reader.verify(made.id).ok, reader.verify(made.id).problems
    reader.restore_files(reader.get(made.id), str(tmp_path / "restored"))
    assert tree(tmp_path / "restored") == tree(ws)


def test_gc_running_alongside_both_writers_never_breaks_a_snapshot(target, tmp_path):
    """gc in a loop while the kernel writer and the workspace writer commit, many times over."""
    kernel, files_writer, collector = [make_engine(target, key=UNSIGNED) for _ in range(3)]
    big = np.arange(50_000.0)  # reused by every kernel snapshot
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "kept.bin").write_bytes(os.urandom(100_000))  # reused by every workspace snapshot
    make_old(ws)
    kernel.snapshot_kernel({"big": big, "i": -1})
    files_writer.snapshot_project(str(ws))
    failures: list[BaseException] = []

    def guarded(fn, *args, **kwargs):
        try:
            fn(*args, **kwargs)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            failures.append(exc)

    for i in range(12 if target.kind == "local" else 6):
        stop = threading.Event()

        def collect(stop: threading.Event = stop) -> None:
            while not stop.is_set():
                collector.gc(keep=1, grace_s=0)

        gc_thread = threading.Thread(target=guarded, args=(collect,))
        gc_thread.start()
        (ws / "changing.txt").write_text(f"step {i}")
        kernel_thread = threading.Thread(target=guarded, args=(kernel.snapshot_kernel, {"big": big, "i": i}))
        kernel_thread.start()
        guarded(files_writer.snapshot_project, str(ws))
        kernel_thread.join()
        stop.set()
        gc_thread.join()
        assert not failures, failures
        check_every_snapshot_restores(target, tmp_path, tree(ws))


# -- item 1: the kernel's --keep policy with two notebooks ----------------------------------------------------


def test_keep_policy_of_one_kernel_keeps_the_other_notebooks_newest_snapshot(start_kernel, store_url):
    a, b = start_kernel("host-a", JPY_SESSION_NAME="a.ipynb"), start_kernel("host-b", JPY_SESSION_NAME="b.ipynb")
    for k in (a, b):
        k.run("%load_ext spotwarp\n%spotwarp off\n%spotwarp policy --keep 1")
    b.run("mine = 'b-state'\n%spotwarp snapshot")
    for i in range(3):
        a.run(f"mine = 'a-{i}'\n%spotwarp snapshot")
    for k in (a, b):  # pruning runs after each commit, in a thread of its own
        k.run("assert __import__('spotwarp_jupyter.kernel.session', fromlist=['x']).current().pruner.wait(60)")
    engine = make_engine(store_url, key=UNSIGNED)
    notebooks = {nb for m in engine.manifests() for nb in m.kernels}
    assert len(notebooks) == 2, notebooks  # each kernel's newest state survives the other's gc
    b.run("mine = 'changed'\n%spotwarp restore latest")
    assert b.value("mine") == "b-state"
    assert engine.verify().ok


# -- item 2: gc keeps what every manifest present names ----------------------------------------------------


def _objects_of(engine: SnapshotEngine, name: str) -> set[str]:
    return set(json.loads(engine.store.read_manifest(name))["objects"])


@pytest.mark.parametrize("first_key", [b"", KEY_B], ids=["unsigned", "other-key"])
def test_gc_with_a_new_key_keeps_the_snapshots_it_refuses(target, first_key):
    old = make_engine(target, key=first_key).snapshot_kernel({"weights": np.arange(1000.0), "note": "before signing"})
    signed = make_engine(target, key=KEY_A)
    signed.snapshot_kernel({"other": np.ones(10)})
    report = signed.gc(keep=1, grace_s=0)
    assert old.id not in report.dropped
    ns: dict = {}
    make_engine(target, key=first_key).restore_kernel(old.id, ns)
    assert ns["note"] == "before signing" and ns["weights"].tolist() == list(np.arange(1000.0))


def test_gc_keeps_the_objects_of_a_damaged_but_readable_manifest(target):
    engine = make_engine(target, key=UNSIGNED)
    old = engine.snapshot_kernel({"weights": np.arange(1000.0)})
    path = posixpath.join(engine.store.snapshots_dir, old.name)
    doc = json.loads(engine.store.fs.cat_file(path))
    doc["message"] = "edited"  # checksum no longer matches: the manifest is refused
    engine.store.fs.pipe_file(path, json.dumps(doc).encode())
    named = _objects_of(engine, old.name)
    engine.snapshot_kernel({"other": np.ones(10)})
    make_engine(target, key=UNSIGNED).gc(keep=1, grace_s=0)
    assert engine.store.present(named) == named


@pytest.mark.process
def test_gc_deletes_no_object_while_a_manifest_cannot_be_read(target, tmp_path):
    engine = make_engine(target, key=UNSIGNED)
    engine.snapshot_kernel({"weights": np.arange(1000.0)})
    orphan, _ = engine.store.put_object(b"an object no manifest names")
    garbled = engine.snapshot_kernel({"x": 1})
    path = posixpath.join(engine.store.snapshots_dir, garbled.name)
    engine.store.fs.pipe_file(path, engine.store.fs.cat_file(path)[:40])  # half-written: not JSON
    report = make_engine(target, key=UNSIGNED).gc(keep=1, grace_s=0)
    assert report.objects_deleted == 0 and engine.store.has_object(orphan)
    assert garbled.name in report.objects_left and "\n" not in report.objects_left
    if target.kind == "local":
        cli = subprocess.run([sys.executable, "-m", "spotwarp_jupyter.cli", "gc", "--keep", "1", "--project-id", "proj",
                              "--storage", target.url], capture_output=True, text=True, timeout=120)
        assert cli.returncode == 0, cli.stderr
        assert f"no object deleted: snapshot manifest {garbled.name} cannot be read" in cli.stdout
        assert engine.store.has_object(orphan)


# -- leases of dead processes ---------------------------------------------------------------------------


def test_locks_of_dead_processes_block_neither_writers_nor_gc(tmp_path, monkeypatch):
    monkeypatch.setenv("SPOTWARP_GC_WAIT_S", "5")  # a writer waiting on the dead gc would fail, not hang
    engine = make_engine(tmp_path / "store", key=UNSIGNED)
    locks = Path(engine.store.locks_dir)
    locks.mkdir(parents=True, exist_ok=True)
    dead_gc, dead_writer = locks / "gc-otherhost-1-aaaa.json", locks / "write-otherhost-2-bbbb.json"
    for lock in (dead_gc, dead_writer):
        lock.write_text("{}")
        os.utime(lock, (time.time() - 7200, time.time() - 7200))
    engine.snapshot_kernel({"x": np.arange(10)})
    orphan, _ = engine.store.put_object(b"left by an interrupted snapshot")
    report = engine.gc(keep=1, grace_s=0)
    assert report.objects_deleted == 1 and not engine.store.has_object(orphan)
    assert not dead_gc.exists() and not dead_writer.exists()
    live_writer = locks / "write-otherhost-3-cccc.json"  # refreshed just now: a snapshot in progress elsewhere
    live_writer.write_text("{}")
    orphan, _ = engine.store.put_object(b"another leftover")
    report = engine.gc(keep=1, grace_s=0)
    assert report.objects_deleted == 0 and engine.store.has_object(orphan)
    assert "1 snapshot(s) being written" in report.objects_left


@pytest.mark.process
def test_gc_says_what_the_grace_period_kept_and_grace_0s_frees_it(tmp_path):
    """`gc --keep 1` on objects all younger than the grace period deletes none, and says why and how to free them
    safely; with `--grace 0s` (no writer live) it frees them."""
    store = str(tmp_path / "store")
    engine = make_engine(store, key=UNSIGNED)
    engine.snapshot_kernel({"weights": np.arange(200_000.0)})
    engine.snapshot_kernel({"weights": np.zeros(10)})
    base = [sys.executable, "-m", "spotwarp_jupyter.cli", "gc", "--keep", "1", "--project-id", "proj", "--storage", store]
    first = subprocess.run(base, capture_output=True, text=True, timeout=120)
    assert first.returncode == 0, first.stderr
    assert "deleted 0 objects" in first.stdout and "younger than the grace period (1h)" in first.stdout, first.stdout
    assert "--grace 0s" in first.stdout, first.stdout
    second = subprocess.run([*base, "--grace", "0s"], capture_output=True, text=True, timeout=120)
    assert second.returncode == 0, second.stderr
    freed = second.stdout.split("deleted ", 1)[1]
    assert not freed.startswith("0 objects") and "grace" not in second.stdout, second.stdout
