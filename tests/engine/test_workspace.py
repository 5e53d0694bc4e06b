"""Workspace file backup and restore: content-addressed chunks, ignore rules, links, changing files, path safety."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from spotwarp_jupyter.engine import ManifestError, SnapshotEngine, SpotWarpError
from spotwarp_jupyter.engine.errors import DamagedObjectError
from spotwarp_jupyter.engine.files.backup import backup_workspace
from spotwarp_jupyter.engine.files.ignore import IgnoreRules
from spotwarp_jupyter.engine.files.restore import UnsafePathError, restore_files

from engines import make_engine
from lab_server import tree

CHUNK = 64 * 1024


def age(root: Path, seconds: float = 60) -> None:
    """Make every file look older than the racy-write window (as files are between two real snapshots)."""
    for p in root.rglob("*"):
        if not p.is_symlink():
            st = p.stat()
            os.utime(p, (st.st_atime - seconds, st.st_mtime - seconds))


@pytest.fixture
def engine(tmp_path: Path) -> SnapshotEngine:
    return make_engine(tmp_path / "store", "ws")


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    (root / "data").mkdir(parents=True)
    (root / "data" / "train.csv").write_text("a,b\n" + "1,2\n" * 5000)
    (root / "configs").mkdir()
    (root / "configs" / "run.yaml").write_text("lr: 0.001\n")
    (root / "notebook.ipynb").write_text(json.dumps({"cells": [], "nbformat": 4, "nbformat_minor": 5}))
    (root / "run.sh").write_text("#!/bin/sh\necho hi\n")
    (root / "run.sh").chmod(0o755)
    (root / "empty.txt").write_bytes(b"")
    (root / "big.bin").write_bytes(os.urandom(10 * CHUNK + 123))
    for ignored in (".git/objects", "__pycache__", ".ipynb_checkpoints", "checkpoints", "sub/__pycache__"):
        (root / ignored).mkdir(parents=True, exist_ok=True)
        (root / ignored / "x").write_text("ignored")
    (root / "mod.pyc").write_bytes(b"\0")
    return root


def test_backup_and_restore_byte_identical_with_modes_and_times(engine, ws, tmp_path):
    files, objects, stats = backup_workspace(engine.store, str(ws), chunk_size=CHUNK)
    assert set(files["entries"]) == {"data/train.csv", "configs/run.yaml", "notebook.ipynb", "run.sh",
                                     "empty.txt", "big.bin"}
    assert len(files["entries"]["big.bin"]["chunks"]) == 11
    assert sum(objects.values()) == sum(len(b) for b in tree(ws).values() if b != b"ignored") - 1  # mod.pyc
    target = tmp_path / "new-host"
    report = restore_files(engine.store, files, str(target))
    expected = {k: v for k, v in tree(ws).items() if k in files["entries"]}
    assert tree(target) == expected
    assert report.files_restored == 6 and report.bytes_restored == sum(len(v) for v in expected.values())
    assert os.stat(target / "run.sh").st_mode & 0o777 == 0o755
    assert os.stat(target / "big.bin").st_mtime_ns == os.stat(ws / "big.bin").st_mtime_ns
    # a second restore finds everything in place and rewrites nothing
    again = restore_files(engine.store, files, str(target))
    assert again.files_restored == 0 and again.files_unchanged == 6


def test_spotwarpignore_gitignore_syntax_and_local_store_inside_workspace(tmp_path, ws):
    (ws / ".spotwarpignore").write_text("*.csv\n!keep.csv\noutputs/\n# comment\n!checkpoints/\n")
    (ws / "keep.csv").write_text("kept")
    (ws / "outputs").mkdir()
    (ws / "outputs" / "log.txt").write_text("x")
    engine = make_engine(ws / "store", "p")
    files, _objects, _stats = backup_workspace(engine.store, str(ws), rules=IgnoreRules.for_workspace(
        str(ws), [engine.store.base]), chunk_size=CHUNK)
    names = set(files["entries"])
    assert "keep.csv" in names and ".spotwarpignore" in names
    assert "data/train.csv" not in names and "outputs/log.txt" not in names
    assert "checkpoints/x" in names  # brought back by `!checkpoints/`
    assert not any(n.startswith(("store/", ".git/", "__pycache__/", ".ipynb_checkpoints/", "sub/")) for n in names)
    assert "mod.pyc" not in names


def test_collaboration_files_of_the_host_are_not_backed_up(engine, ws):
    """jupyter-collaboration's document history and session ids belong to the host that wrote them."""
    (ws / ".jupyter_ystore.db").write_bytes(b"SQLite format 3\0")
    (ws / ".jupyter_ystore.db-journal").write_bytes(b"\0")
    (ws / ".jupyter").mkdir()
    (ws / ".jupyter" / "collaboration_sessions.json").write_text("{}")
    (ws / ".jupyter" / "kept.json").write_text("{}")
    files, _objects, _stats = backup_workspace(engine.store, str(ws), chunk_size=CHUNK)
    names = set(files["entries"])
    assert ".jupyter/kept.json" in names
    assert not names & {".jupyter_ystore.db", ".jupyter_ystore.db-journal", ".jupyter/collaboration_sessions.json"}


def test_a_servers_own_state_is_never_backed_up_nor_restored_over_its_copy(engine, ws, tmp_path):
    """Jupyter's file-id database (under the home's data folder when the workspace is the home) is held open by the
    running server: never stored, and where a store holds it all the same, never written by a restore."""
    data = ws / ".local" / "share" / "jupyter"
    data.mkdir(parents=True)
    for name in ("file_id_manager.db", "file_id_manager.db-wal", "nbsignatures.db"):
        (data / name).write_bytes(b"SQLite format 3\0 of the lost server")
    names = set(backup_workspace(engine.store, str(ws), chunk_size=CHUNK)[0]["entries"])
    assert not any("file_id_manager" in n or "nbsignatures" in n for n in names), sorted(names)
    # a store that holds them (an older version's backup, or `!file_id_manager.db*` in .spotwarpignore)
    (ws / ".spotwarpignore").write_text("!file_id_manager.db*\n")
    held = engine.snapshot_project(str(ws))
    assert ".local/share/jupyter/file_id_manager.db" in held.files["entries"]
    new = tmp_path / "new-home"
    (new / ".local" / "share" / "jupyter").mkdir(parents=True)
    running = new / ".local" / "share" / "jupyter" / "file_id_manager.db"
    running.write_bytes(b"SQLite format 3\0 of the running server")
    inode = running.stat().st_ino
    report = engine.restore_files(held, str(new))
    assert running.read_bytes() == b"SQLite format 3\0 of the running server" and running.stat().st_ino == inode
    assert not (new / ".local" / "share" / "jupyter" / "file_id_manager.db-wal").exists()
    assert report.server_state_skipped == [".local/share/jupyter/file_id_manager.db",
                                           ".local/share/jupyter/file_id_manager.db-wal"]
    assert (new / "data" / "train.csv").read_bytes() == (ws / "data" / "train.csv").read_bytes()


def test_a_kept_workspace_keeps_its_files_and_gets_back_only_missing_ones(engine, ws, tmp_path):
    taken = engine.snapshot_project(str(ws))
    (ws / "configs" / "run.yaml").write_text("lr: 0.1  # edited after the snapshot\n")
    (ws / "run.sh").unlink()
    (ws / "data").rename(ws / "data-moved")
    (ws / "data").write_text("a file where the snapshot had a folder\n")
    report = engine.restore_files(taken, str(ws), keep_existing=True)
    assert (ws / "configs" / "run.yaml").read_text() == "lr: 0.1  # edited after the snapshot\n"
    assert (ws / "run.sh").read_text() == "#!/bin/sh\necho hi\n"  # missing: back
    assert (ws / "data").read_text() == "a file where the snapshot had a folder\n"
    assert report.files_restored == 1 and report.files_kept == len(taken.files["entries"]) - 1, report


def test_unchanged_files_are_not_read_and_a_changed_chunk_is_the_only_upload(engine, ws):
    age(ws)
    first, _o, s1 = backup_workspace(engine.store, str(ws), chunk_size=CHUNK)
    assert s1.files_read == 6 and s1.bytes_written > 10 * CHUNK
    second, _o, s2 = backup_workspace(engine.store, str(ws), first, chunk_size=CHUNK)
    assert s2.files_read == 0 and s2.bytes_read == 0 and s2.bytes_written == 0
    assert second["entries"] == first["entries"]
    # change 10 bytes in the middle of the big file: one chunk re-uploaded, the file re-read
    with open(ws / "big.bin", "r+b") as f:
        f.seek(5 * CHUNK + 7)
        f.write(b"0123456789")
    third, _o, s3 = backup_workspace(engine.store, str(ws), second, chunk_size=CHUNK)
    assert s3.files_read == 1 and s3.bytes_written == CHUNK and s3.objects_written == 1
    old, new = second["entries"]["big.bin"]["chunks"], third["entries"]["big.bin"]["chunks"]
    assert [c["id"] for c in old] != [c["id"] for c in new]
    assert sum(a["id"] != b["id"] for a, b in zip(old, new)) == 1


def test_identical_content_is_stored_once(engine, tmp_path):
    root = tmp_path / "dups"
    root.mkdir()
    blob = os.urandom(3 * CHUNK)
    for name in ("a.bin", "b.bin", "c/d.bin"):
        (root / name).parent.mkdir(exist_ok=True)
        (root / name).write_bytes(blob)
    files, objects, stats = backup_workspace(engine.store, str(root), chunk_size=CHUNK)
    assert len(files["entries"]) == 3
    assert stats.objects_written == 3 and stats.bytes_written == len(blob) and len(objects) == 3


def test_a_file_deleted_object_is_uploaded_again(engine, ws):
    """After a gc dropped what only old snapshots named, stat-clean files are written again, not named blindly."""
    age(ws)
    first, objects, _ = backup_workspace(engine.store, str(ws), chunk_size=CHUNK)
    victim = first["entries"]["configs/run.yaml"]["chunks"][0]["id"]
    engine.store.delete_object(victim)
    second, _, stats = backup_workspace(engine.store, str(ws), first, chunk_size=CHUNK)
    assert engine.store.has_object(victim) and stats.files_read == 1


def test_symlinks_are_recorded_never_followed_out_of_the_workspace(engine, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("do not back up")
    root = tmp_path / "links"
    (root / "real").mkdir(parents=True)
    (root / "real" / "f.txt").write_text("inside")
    (root / "to-inside").symlink_to("real/f.txt")
    (root / "dir-inside").symlink_to("real")
    (root / "to-outside").symlink_to(outside / "secret.txt")
    (root / "dir-outside").symlink_to(outside)
    files, objects, stats = backup_workspace(engine.store, str(root), chunk_size=CHUNK)
    entries = files["entries"]
    assert entries["to-inside"] == {"link": "real/f.txt", "size": 0}
    assert entries["dir-inside"] == {"link": "real", "size": 0}
    assert "to-outside" not in entries and "dir-outside" not in entries
    assert "to-outside" in files["skipped"] and "dir-outside" in files["skipped"]
    assert not any(p.startswith("dir-outside/") for p in entries)
    assert sum(objects.values()) == len("inside")
    target = tmp_path / "restored"
    report = restore_files(engine.store, files, str(target))
    assert report.links_restored == 2
    assert os.readlink(target / "to-inside") == "real/f.txt" and (target / "to-inside").read_text() == "inside"


def test_a_file_changing_while_read_is_read_again(engine, tmp_path):
    root = tmp_path / "busy"
    root.mkdir()
    path = root / "log.bin"
    path.write_bytes(b"a" * (4 * CHUNK))
    writes = []

    def writer(done, total, relpath):  # a concurrent writer appends while the first read is under way
        if relpath == "log.bin" and not writes:
            writes.append(1)
            with open(path, "ab") as f:
                f.write(b"b" * 1000)

    files, _objects, stats = backup_workspace(engine.store, str(root), chunk_size=CHUNK, progress=writer)
    entry = files["entries"]["log.bin"]
    assert writes and "unstable" not in entry and entry["size"] == 4 * CHUNK + 1000
    restore_files(engine.store, files, str(tmp_path / "r1"))
    assert (tmp_path / "r1" / "log.bin").read_bytes() == path.read_bytes()


def test_a_file_that_never_holds_still_is_marked_unstable(engine, tmp_path):
    root = tmp_path / "busy"
    root.mkdir()
    path = root / "log.bin"
    path.write_bytes(b"a" * (4 * CHUNK))

    def writer(done, total, relpath):
        with open(path, "ab") as f:
            f.write(b"b")

    files, _objects, stats = backup_workspace(engine.store, str(root), chunk_size=CHUNK, progress=writer)
    assert files["entries"]["log.bin"].get("unstable") is True
    assert files["unstable"] == ["log.bin"] and stats.unstable == ["log.bin"]
    report = restore_files(engine.store, files, str(tmp_path / "r"))
    assert report.unstable == ["log.bin"]


BAD_PATHS = ["../escape.txt", "/etc/spotwarp-escape", "a/../../escape.txt", "a/./b", "a//b", "..", "", "C:/x",
             "a\\..\\b"]


@pytest.mark.parametrize("bad", BAD_PATHS)
def test_restore_refuses_paths_leaving_the_workspace(engine, ws, tmp_path, bad):
    files, _objects, _ = backup_workspace(engine.store, str(ws), chunk_size=CHUNK)
    files["entries"][bad] = dict(files["entries"]["configs/run.yaml"])
    target = tmp_path / "deep" / "target"
    with pytest.raises(UnsafePathError, match="refusing"):
        restore_files(engine.store, files, str(target))
    assert not target.exists()  # checked before anything is written
    assert not (tmp_path / "deep" / "escape.txt").exists() and not Path("/etc/spotwarp-escape").exists()


@pytest.mark.parametrize("link", ["../../outside", "/etc/passwd", "a/../../../x"])
def test_restore_refuses_links_leaving_the_workspace(engine, ws, tmp_path, link):
    files, _objects, _ = backup_workspace(engine.store, str(ws), chunk_size=CHUNK)
    files["entries"]["innocent"] = {"link": link, "size": 0}
    with pytest.raises(UnsafePathError):
        restore_files(engine.store, files, str(tmp_path / "target"))
    assert not (tmp_path / "target").exists()


def test_restore_never_writes_through_a_symlinked_folder(engine, ws, tmp_path):
    files, _objects, _ = backup_workspace(engine.store, str(ws), chunk_size=CHUNK)
    outside = tmp_path / "outside"
    outside.mkdir()
    target = tmp_path / "target"
    target.mkdir()
    (target / "configs").symlink_to(outside)  # a link planted where the snapshot has a folder
    with pytest.raises(UnsafePathError, match="symbolic link"):
        restore_files(engine.store, files, str(target), workers=1)
    assert list(outside.iterdir()) == []


def test_restore_of_a_damaged_object_names_it_and_leaves_no_partial_file(engine, ws, tmp_path):
    files, _objects, _ = backup_workspace(engine.store, str(ws), chunk_size=CHUNK)
    oid = files["entries"]["big.bin"]["chunks"][3]["id"]
    with open(engine.store.object_path(oid), "r+b") as f:
        f.write(b"X")
    target = tmp_path / "target"
    with pytest.raises(DamagedObjectError, match=oid):
        restore_files(engine.store, files, str(target))
    assert not (target / "big.bin").exists()
    assert not [p for p in target.rglob("*") if ".spotwarp-tmp-" in p.name]


def test_malformed_entries_are_refused(engine, ws, tmp_path):
    files, _objects, _ = backup_workspace(engine.store, str(ws), chunk_size=CHUNK)
    entry = files["entries"]["configs/run.yaml"]
    for bad in ({**entry, "size": entry["size"] + 1}, {**entry, "chunks": [{"id": "nope", "size": 1}]}, "x"):
        broken = {"entries": {**files["entries"], "configs/run.yaml": bad}}
        with pytest.raises(ManifestError):
            restore_files(engine.store, broken, str(tmp_path / "t"))
    clash = {"entries": {"a": entry, "a/b": entry}}
    with pytest.raises(ManifestError, match="both"):
        restore_files(engine.store, clash, str(tmp_path / "t"))


@pytest.mark.process
def test_project_snapshot_and_cli_restore_refuse_a_tampered_manifest(engine, ws, tmp_path):
    manifest = engine.snapshot_project(str(ws), message="first", chunk_size=CHUNK)
    assert engine.with_files().id == manifest.id and manifest.kind == "project"
    assert set(manifest.objects) == {c["id"] for e in manifest.files["entries"].values()
                                     for c in e.get("chunks", [])} | {manifest.files["record"]}
    assert engine.verify(manifest.id).ok
    # nothing changed: no new manifest when asked only for changes
    age(ws)
    engine.snapshot_project(str(ws), chunk_size=CHUNK)
    assert engine.snapshot_project(str(ws), only_if_changed=True, chunk_size=CHUNK) is None
    report = engine.restore_files(manifest, str(tmp_path / "b"))
    assert report.files_restored == 6
    # a manifest (correctly checksummed, unsigned store) naming ../ is refused by `spotwarp restore`
    evil = engine.new_manifest("project", "evil", files={"entries": {
        "../evil.txt": manifest.files["entries"]["configs/run.yaml"]}}, objects=dict(manifest.objects))
    engine.commit_manifest(evil)
    env = {**os.environ, "HOME": str(tmp_path / "home")}
    out = subprocess.run([sys.executable, "-m", "spotwarp_jupyter.cli", "restore", "--project-id", "ws",
                          "--storage", engine.settings.storage, "--workspace-path", str(tmp_path / "c" / "ws"),
                          "--snapshot", evil.id], capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 1, out
    assert "outside the workspace" in out.stderr and len(out.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "c" / "evil.txt").exists() and not (tmp_path / "c" / "ws").exists()


def test_backup_of_a_missing_workspace_is_a_clear_error(engine, tmp_path):
    with pytest.raises(SpotWarpError, match="not a folder"):
        backup_workspace(engine.store, str(tmp_path / "nope"))


def test_gc_keeps_the_newest_snapshot_with_files_whatever_keep_says(engine, ws, tmp_path):
    """Kernels snapshot far more often than files change; a small --keep must not lose the workspace."""
    project = engine.snapshot_project(str(ws), message="files", chunk_size=CHUNK)
    older = engine.snapshot_project(str(ws), message="files again", chunk_size=CHUNK)
    for step in range(3):
        engine.snapshot_kernel({"step": step}, notebook="train.ipynb")
    report = engine.gc(keep=1, grace_s=0)
    assert older.id in report.kept and project.id in report.dropped and len(report.kept) == 2
    assert engine.with_files().id == older.id and engine.verify().ok
    engine.restore_files(engine.with_files(), str(tmp_path / "new-host"))
    assert tree(tmp_path / "new-host") == {k: v for k, v in tree(ws).items() if k in older.files["entries"]}
