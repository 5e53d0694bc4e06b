"""A promoted standby's catch-up when the snapshot it restored at start was since pruned (`gc --keep`)."""

from __future__ import annotations

from pathlib import Path

from spotwarp_jupyter.engine import SnapshotEngine
from spotwarp_jupyter.engine.coordination.fence import Fence
from spotwarp_jupyter.service import VIA_HUB, Project

from engines import engine_settings


def test_catch_up_restores_the_newest_files_when_the_restored_snapshot_was_pruned(tmp_path: Path) -> None:
    """Catch-up must not fail forever on a pruned `restored`: the newest files come back, stale ones stay."""
    settings = engine_settings(tmp_path / "store", "pruned")
    holder = SnapshotEngine(settings)
    old = tmp_path / "old-holder"
    old.mkdir()
    (old / "a.txt").write_text("first")
    (old / "gone.txt").write_text("dropped later")
    first = holder.snapshot_project(str(old), message="first")
    standby_dir = tmp_path / "standby"
    standby = Project(SnapshotEngine(settings, fence=Fence(1, "cand-a")), str(standby_dir))
    assert standby.restore("latest", via=VIA_HUB, files_only=True).snapshot.id == first.id
    (old / "a.txt").write_text("second")
    (old / "gone.txt").unlink()
    (old / "b.txt").write_text("new")
    holder.snapshot_project(str(old), message="second")
    newest = holder.snapshot_project(str(old), message="third")
    holder.gc(keep=1, grace_s=0.0)
    assert first.id not in [m.id for m in holder.manifests()]
    assert Project(SnapshotEngine(settings), str(standby_dir)).catch_up(first.id) == newest.id
    assert (standby_dir / "a.txt").read_text() == "second"
    assert (standby_dir / "b.txt").read_text() == "new"
