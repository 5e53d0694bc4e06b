"""A kernel snapshot commits the workspace files of its instant in the same manifest (engine/files/cut.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from spotwarp_jupyter.engine import SnapshotEngine
from spotwarp_jupyter.engine.files.cut import take_cut
from spotwarp_jupyter.service import VIA_START, Project

from engines import make_engine


def age(root: Path, seconds: float = 60) -> None:
    """Every file older than the racy-write window, as files are between two real snapshots."""
    for p in root.rglob("*"):
        st = p.stat()
        os.utime(p, (st.st_atime - seconds, st.st_mtime - seconds))


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    root.mkdir()
    (root / "train.log").write_text("".join(f"step {i}\n" for i in range(3)))
    (root / "metrics.json").write_text('{"step": 2}')
    (root / "run.bin").write_bytes(b"r" * 300_000)  # larger than what is read at the instant
    (root / "data.csv").write_text("a,b\n1,2\n")
    return root


@pytest.fixture
def engine(tmp_path: Path, ws: Path) -> SnapshotEngine:
    return make_engine(tmp_path / "store", "cut", workspace=str(ws))


def read_tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_a_kernel_snapshot_holds_the_files_and_other_notebooks_of_its_instant(engine, ws, tmp_path):
    other = engine.snapshot_kernel({"b": 7}, notebook="other.ipynb")
    at_instant = read_tree(ws)
    cut = engine.cut_workspace()
    # the kernel runs on while the writer stores the snapshot: it appends, rewrites, creates, deletes
    with open(ws / "train.log", "a") as f:
        f.write("step 3\n")
    (ws / "metrics.json").write_text('{"step": 3, "loss": 0.25}')
    with open(ws / "run.bin", "ab") as f:
        f.write(b"s" * 1000)
    (ws / "late.txt").write_text("after the instant")
    manifest = engine.snapshot_kernel({"step": 2}, notebook="train.ipynb", cut=cut)

    assert manifest.kind == "kernel"
    assert set(manifest.kernels) == {"train.ipynb", "other.ipynb"}
    assert manifest.kernels["other.ipynb"] == other.kernels["other.ipynb"]
    assert engine.with_files() is not None and engine.with_files().id == manifest.id
    restored = tmp_path / "host-b"
    engine.restore_files(engine.with_files(), str(restored))
    assert read_tree(restored) == at_instant  # every file as it was at the instant, the late one absent
    namespace: dict = {}
    engine.restore_kernel(manifest.id, namespace, "train.ipynb")
    assert namespace["step"] == 2

    # gc keeps what a kernel manifest's files name
    engine.snapshot_kernel({"step": 3}, notebook="train.ipynb")
    engine.gc(keep=1, grace_s=0)
    again = tmp_path / "host-c"
    engine.restore_files(engine.get(manifest.id), str(again))
    assert read_tree(again) == at_instant


def test_an_unchanged_file_is_not_read_again(engine, ws):
    age(ws)
    first = engine.snapshot_kernel({"step": 1}, notebook="train.ipynb", cut=engine.cut_workspace())
    assert first.stats["files_read"] == 4
    with open(ws / "train.log", "a") as f:
        f.write("step 3\n")
    cut = engine.cut_workspace(first)
    assert set(cut.held) == {"train.log"}  # only the changed file is read at the instant
    second = engine.snapshot_kernel({"step": 2}, notebook="train.ipynb", cut=cut)
    assert second.stats["files_read"] == 1 and second.stats["files_reused"] == 3
    assert second.stats["file_bytes_written"] == len((ws / "train.log").read_bytes())


def test_in_a_nested_tree_the_cut_keeps_every_file_in_order_and_reads_only_the_changed_one(engine, ws):
    for rel in ("a/z.txt", "a/b/c.txt", "a/b2/d.txt", "__pycache__/m.pyc", ".git/HEAD"):
        (ws / rel).parent.mkdir(parents=True, exist_ok=True)
        (ws / rel).write_text(rel)
    os.symlink("a/z.txt", ws / "ln")
    age(ws)
    first = engine.snapshot_kernel({"step": 1}, notebook="train.ipynb", cut=engine.cut_workspace())
    with open(ws / "a/b/c.txt", "a") as f:
        f.write("more")
    cut = engine.cut_workspace(first)
    kept = ["data.csv", "ln", "metrics.json", "run.bin", "train.log", "a/z.txt", "a/b/c.txt", "a/b2/d.txt"]
    assert [s.relpath for s in cut.seen] == kept
    assert set(cut.held) == {"a/b/c.txt"}
    assert set(cut.clean) == set(kept) - {"ln", "a/b/c.txt"}
    second = engine.snapshot_kernel({"step": 2}, notebook="train.ipynb", cut=cut)
    assert list(second.files["entries"]) == kept and second.stats["files_read"] == 1


def test_cuts_after_one_that_found_a_folder_unchanged_see_every_change_in_it(engine, ws, tmp_path):
    for folder in ("runs", "logs"):
        (ws / folder).mkdir()
        for i in range(5):
            (ws / folder / f"r{i}.txt").write_text(f"run {i}")
    age(ws)
    first = engine.snapshot_kernel({"step": 1}, notebook="train.ipynb", cut=engine.cut_workspace())
    second = engine.snapshot_kernel({"step": 2}, notebook="train.ipynb", cut=engine.cut_workspace(first))
    assert second.stats["files_read"] == 0
    # in folders the last cut found as the one before it: a rewrite of the same size (the same names), a deletion
    # and a new file
    (ws / "runs" / "r2.txt").write_text("RUN 2")
    (ws / "logs" / "r4.txt").unlink()
    (ws / "logs" / "r5.txt").write_text("run 5")
    at_instant = read_tree(ws)
    cut = engine.cut_workspace(second)
    assert set(cut.held) == {"runs/r2.txt", "logs/r5.txt"}
    third = engine.snapshot_kernel({"step": 3}, notebook="train.ipynb", cut=cut)
    restored = tmp_path / "host-b"
    engine.restore_files(third, str(restored))
    assert read_tree(restored) == at_instant

    # the same folders, against a record that names one file otherwise: that file is not taken as clean
    age(ws)
    fourth = engine.snapshot_kernel({"step": 4}, notebook="train.ipynb", cut=engine.cut_workspace(third))
    engine.snapshot_kernel({"step": 5}, notebook="train.ipynb", cut=engine.cut_workspace(fourth))
    entries = dict(fourth.files["entries"])
    entries["runs/r1.txt"] = {**entries["runs/r1.txt"], "ino": entries["runs/r1.txt"]["ino"] + 1}
    other = take_cut(str(ws), engine.ignore_rules(str(ws)), {**fourth.files, "entries": entries})
    assert "runs/r1.txt" not in other.clean and "runs/r1.txt" in other.held
    assert set(other.clean) == set(entries) - {"runs/r1.txt"}


def test_a_file_written_just_before_its_record_was_scanned_is_read_again_at_every_cut(engine, ws):
    age(ws)
    fresh = ws / "fresh.txt"
    fresh.write_text("written within the racy-write window of the next scan")
    later = time.time_ns() + 10**10  # so on a slow machine too
    os.utime(fresh, ns=(later, later))
    first = engine.snapshot_kernel({"step": 1}, notebook="train.ipynb", cut=engine.cut_workspace())
    for _ in range(2):  # the second finds every folder as the first did
        cut = engine.cut_workspace(first)
        assert "fresh.txt" not in cut.clean and "fresh.txt" in cut.held
        assert set(cut.clean) == {"train.log", "metrics.json", "run.bin", "data.csv"}


def test_a_cut_with_nothing_to_read_counts_the_files_bytes_and_chunks_it_names(engine, ws):
    age(ws)
    first = engine.snapshot_kernel({"step": 1}, notebook="train.ipynb", cut=engine.cut_workspace())
    (ws / "data.csv").unlink()
    for step in (2, 3):  # a file deleted, then nothing changed
        manifest = engine.snapshot_kernel({"step": step}, notebook="train.ipynb",
                                          cut=engine.cut_workspace(engine.with_files()))
        kept = {p: e for p, e in first.files["entries"].items() if p != "data.csv"}
        assert manifest.stats["files_read"] == 0 and manifest.stats["files"] == manifest.stats["files_reused"] == 3
        assert manifest.stats["file_bytes_total"] == sum(e["size"] for e in kept.values()) == manifest.files["bytes"]
        assert manifest.stats["file_objects_reused"] == sum(len(e["chunks"]) for e in kept.values())


def test_a_cut_against_the_same_entries_scanned_earlier_reads_again_what_was_written_within_their_window(engine,
                                                                                                         ws):
    age(ws)
    first = engine.snapshot_kernel({"step": 1}, notebook="train.ipynb", cut=engine.cut_workspace())
    rules = engine.ignore_rules(str(ws))
    newest = max(e["mtime_ns"] for e in first.files["entries"].values())
    later = {**first.files, "scanned_at_ns": newest + 10**10}
    assert set(take_cut(str(ws), rules, later).clean) == set(first.files["entries"])
    # the very entries, in a record scanned just after the files were written: none of them is clean against it
    earlier = {**first.files, "scanned_at_ns": newest + 10**9}
    for _ in range(2):
        cut = take_cut(str(ws), rules, earlier)
        assert cut.clean == {} and set(cut.held) == {"train.log", "metrics.json", "data.csv"}
    assert set(take_cut(str(ws), rules, later).clean) == set(first.files["entries"])


@pytest.mark.process
def test_kernel_snapshots_without_files_restore_with_their_notebooks_rebuilt(tmp_path, monkeypatch):
    monkeypatch.setenv("SPOTWARP_KEY", "the project's key")  # recorded cells go into notebooks only when it vouches
    engine = make_engine(tmp_path / "store", "old")
    project = Project(engine, str(tmp_path / "empty-host"))
    assert project.restore("latest", via=VIA_START, files_only=True) is None  # no snapshot at all: nothing
    printed = [{"output_type": "stream", "name": "stdout", "text": "step 1\nstep 2\n"}]
    manifest = engine.snapshot_kernel({"step": 2}, "runs/train.ipynb", annotations={
        "cells": [{"id": "setup", "source": "import spotwarp"}, {"id": "loop", "source": "for i in r: print(i)"}],
        "running": {"id": "loop", "source": "for i in r: print(i)", "outputs": printed}, "at": "step"})
    assert not manifest.files  # a kernel without a workspace, or a store from before kernels held files

    result = project.restore("latest", via=VIA_START, files_only=True)
    assert result is not None and result.snapshot.id == manifest.id
    document = json.loads((tmp_path / "empty-host" / "runs" / "train.ipynb").read_text())
    assert [(c["id"], c["source"]) for c in document["cells"]] == [("setup", "import spotwarp"),
                                                                    ("loop", "for i in r: print(i)")]
    assert document["cells"][1]["outputs"] == printed

    # what the restore line of `spotwarp start` and `spotwarp restore` says it brought back
    out = subprocess.run([sys.executable, "-m", "spotwarp_jupyter.cli", "restore", "--project-id", "old",
                          "--storage", str(tmp_path / "store"), "--workspace-path", str(tmp_path / "host-c")],
                         capture_output=True, text=True, timeout=120, env={**os.environ, "HOME": str(tmp_path / "h")})
    assert out.returncode == 0, out.stderr
    assert (f"no workspace files in snapshot {manifest.id} ({manifest.host}, {manifest.created_iso}): notebook "
            "runs/train.ipynb rebuilt from its recorded cells") in out.stdout.splitlines()
    assert "restored 0 files" not in out.stdout


def stored_manifest(engine: SnapshotEngine, manifest) -> dict:
    return json.loads(engine.store.read_manifest(manifest.name))


def test_an_unchanged_workspace_names_the_same_files_record_without_writing_it(engine, ws):
    first = engine.snapshot_kernel({"step": 0}, notebook="train.ipynb", cut=engine.cut_workspace())
    age(ws)
    engine.snapshot_kernel({"step": 1}, notebook="train.ipynb", cut=engine.cut_workspace(engine.with_files()))
    objects_before = set(engine.store.list_objects_with_times())
    record = engine.with_files().files["record"]
    again = engine.snapshot_kernel({"step": 1}, notebook="train.ipynb", cut=engine.cut_workspace(engine.with_files()))

    stored = stored_manifest(engine, again)
    assert stored["files"]["record"] == record and "entries" not in stored["files"]
    assert stored["files"]["count"] == 4 and record in stored["objects"]
    assert not {c["id"] for e in first.files["entries"].values() for c in e["chunks"]} & set(stored["objects"])
    assert set(engine.store.list_objects_with_times()) == objects_before  # no record, no chunk written again
    # a new reader (another host) sees the entries through the record
    reader = SnapshotEngine(engine.settings)
    assert set(reader.get(again.id).files["entries"]) == {"train.log", "metrics.json", "run.bin", "data.csv"}
    assert reader.verify(again.id).ok


def test_verify_finds_a_damaged_files_record_and_gc_keeps_it(engine, ws, tmp_path):
    manifest = engine.snapshot_kernel({"step": 0}, notebook="train.ipynb", cut=engine.cut_workspace())
    for step in range(3):
        engine.snapshot_kernel({"step": step + 1}, notebook="other.ipynb")
    report = engine.gc(keep=1, grace_s=0)
    assert report is not None
    record = manifest.files["record"]
    assert engine.store.has_object(record)
    restored = tmp_path / "host-b"
    SnapshotEngine(engine.settings).restore_files(SnapshotEngine(engine.settings).with_files(), str(restored))
    assert read_tree(restored) == read_tree(ws)

    path = engine.store.object_path(record)
    os.chmod(path, 0o644)
    data = bytearray(Path(path).read_bytes())
    data[10] ^= 1
    Path(path).write_bytes(bytes(data))
    reader = SnapshotEngine(engine.settings)
    verdict = reader.verify()
    assert not verdict.ok
    assert any(record[:12] in p or manifest.id in p for p in verdict.problems), verdict.problems


def test_the_timed_backup_commits_nothing_after_a_kernel_snapshot_with_its_cut(tmp_path, ws):
    engine = make_engine(tmp_path / "store", "cut", workspace=str(ws))
    engine.snapshot_kernel({"b": 1}, notebook="closed.ipynb")
    engine.snapshot_kernel({"a": 1}, notebook="train.ipynb", cut=engine.cut_workspace())
    newest = engine.manifests()[0]
    live = {"train.ipynb": newest.kernels["train.ipynb"]}  # what the server's backup passes: the open notebooks
    for _interval in range(2):
        assert engine.snapshot_project(str(ws), live, "automatic backup", only_if_changed=True) is None
    assert engine.manifests()[0].id == newest.id
    (ws / "data.csv").write_text("a,b\n3,4\n")
    assert engine.snapshot_project(str(ws), live, "automatic backup", only_if_changed=True) is not None
