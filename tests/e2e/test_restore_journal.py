"""Every door that restores a project journals it, so `spotwarp report` shows the time to resume.

A host is lost (a fatal notice in the journal, as its watcher writes it); the project is then restored through
one door: `spotwarp restore`, `spotwarp start` on an empty workspace, the panel's `POST snapshots/{id}/restore`,
or a hub server's restore-on-start. `spotwarp report --json` must count the preemption as survived, name the
restored snapshot and give the seconds it took to run again.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from spotwarp_jupyter.engine import SnapshotEngine
from spotwarp_jupyter.engine.journal.events import NOTICE_SEEN, RESTORE_FINISHED, RESTORE_STARTED, Journal

from engines import engine_settings, make_engine
from jupyter_api import call
from lab_server import LabServer, host_env, tree

pytestmark = pytest.mark.process  # every test here starts a process (a kernel, server or command)

pytest_plugins = ("pytest_jupyter.jupyter_server",)

CLI = [sys.executable, "-m", "spotwarp_jupyter.cli"]


def make_files(root: Path) -> None:
    (root / "data").mkdir(parents=True, exist_ok=True)
    (root / "data" / "values.csv").write_text("x,y\n1,2\n3,4\n")
    (root / "train.py").write_text("print('train')\n")


def spotwarp(*args: str, env: dict[str, str] | None = None) -> Any:
    """Run the `spotwarp` command; its --json answer."""
    out = subprocess.run([*CLI, *args, "--json"], capture_output=True, text=True, timeout=180, env=env)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def lost_host(store: str, project: str, workspace: Path, env: dict[str, str] | None = None) -> str:
    """Host A backs up its files, then its watcher sees a fatal notice; the snapshot id."""
    make_files(workspace)
    snap = spotwarp("snapshot", "--project-id", project, "--storage", store, "--workspace-path", str(workspace),
                    env=env)
    notice_seen(store, project)
    return snap["id"]


def notice_seen(store: str, project: str) -> None:
    """What host A's preemption watcher journals when the notice comes (its own server run)."""
    journal = Journal(make_engine(store, project).store)
    journal.record(NOTICE_SEEN, source="aws", fatal=True, run="host-a", window_s=120)


def assert_resume_reported(store: str, project: str, snapshot: str, via: str) -> None:
    """The restore is in the report: survived, from `snapshot`, with its time to resume; journaled `via` this door."""
    report = spotwarp("report", "--project-id", project, "--storage", store)
    assert (report["preemptions"], report["preemptions_survived"]) == (1, 1), report
    (row,) = report["events"]
    assert row["restored_snapshot"] == snapshot and row["survived"] is True, row
    assert row["resume_s"] is not None and row["resume_s"] >= 0 and report["resume_s_median"] == row["resume_s"]
    events = Journal(make_engine(store, project).store).events()
    started = [e for e in events if e.event == RESTORE_STARTED]
    finished = [e for e in events if e.event == RESTORE_FINISHED]
    assert [e.details.get("via") for e in started] == [via], [e.as_dict() for e in events]
    assert finished[0].details["ok"] is True and finished[0].details["files_restored"] == 2


def test_cli_restore_is_journaled(tmp_path):
    store = str(tmp_path / "store")
    env = host_env(tmp_path / "home")
    snapshot = lost_host(store, "cli", tmp_path / "host-a", env)
    restored = spotwarp("restore", "--project-id", "cli", "--storage", store, "--workspace-path",
                        str(tmp_path / "host-b"), env=env)
    assert restored["id"] == snapshot and restored["files_restored"] == 2
    assert tree(tmp_path / "host-b") == tree(tmp_path / "host-a")
    assert_resume_reported(store, "cli", snapshot, via="cli")


def test_spotwarp_start_restore_is_journaled(tmp_path):
    store = str(tmp_path / "store")
    snapshot = lost_host(store, "start", tmp_path / "host-a", host_env(tmp_path / "home-a"))
    b = LabServer(tmp_path / "host-b", store, "start", host_env(tmp_path / "home-b"), tmp_path / "host-b.log")
    try:
        b.wait_ready()
        assert f"from snapshot {snapshot}" in b.log()
    finally:
        b.discard()
    assert_resume_reported(store, "start", snapshot, via="spotwarp start")


async def test_rest_restore_is_journaled(jp_fetch, jp_root_dir, store_dir):
    make_files(jp_root_dir)
    code, snap = await call(jp_fetch, "POST", "spotwarp", "api", "snapshots")
    assert code == 201
    notice_seen(str(store_dir), "api")
    (jp_root_dir / "data" / "values.csv").unlink()
    (jp_root_dir / "train.py").write_text("changed\n")
    code, restored = await call(jp_fetch, "POST", "spotwarp", "api", "snapshots", snap["id"], "restore")
    assert code == 200 and restored["id"] == snap["id"] and restored["files_restored"] == 2
    assert (jp_root_dir / "train.py").read_text() == "print('train')\n"
    assert_resume_reported(str(store_dir), "api", snap["id"], via="rest")
    code, status = await call(jp_fetch, "GET", "spotwarp", "api", "status")  # the panel sees the same report
    assert status["report"]["preemptions_survived"] == 1


class TestHubStart:
    """A hub spawns a new server on an empty home: restore-on-start brings the files back before it serves."""

    @pytest.fixture
    def jp_server_config(self, jp_server_config, store_dir, tmp_path):
        # before the server starts: host A's snapshot and notice are in the store, this server's root is empty
        self.snapshot = lost_host(str(store_dir), "api", tmp_path / "host-a", host_env(tmp_path / "home-a"))
        jp_server_config["SpotWarp"]["restore_on_start"] = "if-empty"
        return jp_server_config

    async def test_hub_restore_on_start_is_journaled(self, jp_fetch, jp_root_dir, store_dir, tmp_path):
        code, status = await call(jp_fetch, "GET", "spotwarp", "api", "status")
        assert status["start_restore"]["restored"] is True and status["start_restore"]["id"] == self.snapshot
        assert (jp_root_dir / "train.py").read_text() == "print('train')\n"
        assert_resume_reported(str(store_dir), "api", self.snapshot, via="hub")
        code, status = await call(jp_fetch, "GET", "spotwarp", "api", "status")
        assert status["report"]["events"][0]["restored_snapshot"] == self.snapshot


def test_a_standby_candidate_restores_but_journals_nothing(tmp_path):
    """Every door's restore goes through Project.restore: on a standby failover candidate it writes no event."""
    from spotwarp_jupyter.engine.coordination.fence import Fence
    from spotwarp_jupyter.service import VIA_HUB, Project

    store = str(tmp_path / "store")
    snapshot = lost_host(store, "standby", tmp_path / "host-a", host_env(tmp_path / "home"))
    settings = engine_settings(store, "standby")
    before = [e.as_dict() for e in Journal(SnapshotEngine(settings).store).events()]
    standby = Project(SnapshotEngine(settings, fence=Fence(1, "cand-a")), str(tmp_path / "host-b"))
    result = standby.restore("latest", via=VIA_HUB, files_only=True)
    assert result is not None and result.snapshot.id == snapshot and not result.journaled
    assert tree(tmp_path / "host-b") == tree(tmp_path / "host-a")
    assert [e.as_dict() for e in Journal(SnapshotEngine(settings).store).events()] == before
