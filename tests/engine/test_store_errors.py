"""Stores failing or misnamed, and the newest snapshot damaged: one line, nothing lost.

Everything runs the real `spotwarp` CLI against real stores: a local folder (a real full disk where the
machine lets us mount a small tmpfs), an unreachable GCS endpoint.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from spotwarp_jupyter.server.hub import restore_on_start

from engines import UNSIGNED, make_engine
from lab_server import tree

KEY = "a-team-secret"


def spotwarp(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None,
             timeout: float = 120) -> subprocess.CompletedProcess:
    # an empty runtime folder: `snapshot` finds no Jupyter server of this machine to hand the work to
    runtime = Path(os.environ.get("TMPDIR", "/tmp")) / f"spotwarp-test-runtime-{os.getpid()}"
    runtime.mkdir(exist_ok=True)
    return subprocess.run([sys.executable, "-m", "spotwarp_jupyter.cli", *args], capture_output=True, text=True,
                          cwd=cwd, env={**os.environ, "SPOTWARP_KEY": "", "JUPYTER_RUNTIME_DIR": str(runtime),
                                        **(env or {})}, timeout=timeout)


def one_line_failure(result: subprocess.CompletedProcess, *words: str) -> None:
    """Exit 1, no traceback, the error in one `spotwarp COMMAND: ...` line and nothing else."""
    assert result.returncode == 1, (result.returncode, result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert "Traceback" not in result.stderr and len(lines) == 1 and lines[-1].startswith("spotwarp "), result.stderr
    for word in words:
        assert word in lines[-1], result.stderr


@pytest.fixture
def two_snapshots(tmp_path: Path) -> tuple[Path, Path, list[str]]:
    """A workspace snapshotted twice by the CLI; (store, workspace, [older id, newer id])."""
    store, ws = tmp_path / "store", tmp_path / "ws"
    ws.mkdir()
    engine = make_engine(store, key=UNSIGNED)
    ids = []
    for text in ("first", "second"):
        (ws / "notes.txt").write_text(text)
        ids.append(engine.snapshot_project(str(ws)).id)
    return store, ws, ids


def damage_newest(store: Path) -> str:
    newest = sorted((store / "proj" / "snapshots").glob("*.json"))[-1]
    newest.write_bytes(newest.read_bytes()[:50])  # half-written
    return newest.name


# -- item 11: a damaged newest snapshot is refused everywhere ------------------------------------------------


@pytest.mark.process
def test_restore_refuses_a_damaged_newest_snapshot_and_names_the_way_to_an_older_one(two_snapshots, tmp_path):
    store, _ws, (older, _newer) = two_snapshots
    damaged = damage_newest(store)
    into = tmp_path / "into"
    refused = spotwarp("restore", "--project-id", "proj", "--storage", str(store), "--workspace-path", str(into))
    one_line_failure(refused, damaged, "--snapshot ID")
    assert not into.exists() or not any(into.iterdir())
    chosen = spotwarp("restore", "--project-id", "proj", "--storage", str(store), "--workspace-path", str(into),
                      "--snapshot", older)
    assert chosen.returncode == 0, chosen.stderr
    assert (into / "notes.txt").read_text() == "first"


@pytest.mark.process
def test_start_refuses_a_damaged_newest_snapshot(two_snapshots, tmp_path):
    store, _ws, _ids = two_snapshots
    damaged = damage_newest(store)
    fresh = tmp_path / "fresh"
    # `-- --help`: were it to go on, jupyter lab would print its help and exit instead of serving
    refused = spotwarp("start", "--project-id", "proj", "--storage", str(store), "--workspace-path", str(fresh),
                       "--", "--help")
    one_line_failure(refused, damaged, "--snapshot ID")
    assert not fresh.exists() or not any(fresh.iterdir())


def test_hub_restore_on_start_refuses_a_damaged_newest_snapshot(two_snapshots, tmp_path):
    store, _ws, _ids = two_snapshots
    damaged = damage_newest(store)
    engine = make_engine(store, key=UNSIGNED)
    fresh = tmp_path / "fresh"
    outcome = restore_on_start(engine, str(fresh), "if-empty", None)
    assert outcome["restored"] is False and damaged in outcome["error"] and "--snapshot ID" in outcome["error"]
    assert not fresh.exists() or not any(fresh.iterdir())


# -- item 14: the writer's own signed snapshot says so ------------------------------------------------------


@pytest.mark.process
def test_snapshot_json_reports_a_signed_snapshot_as_signed(tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.txt").write_text("a")
    common = ("--project-id", "proj", "--storage", str(tmp_path / "store"))
    made = spotwarp("snapshot", "--json", *common, "--workspace-path", str(ws), env={"SPOTWARP_KEY": KEY})
    assert made.returncode == 0, made.stderr
    assert json.loads(made.stdout)["signed"] is True
    listed = json.loads(spotwarp("list", "--json", *common, env={"SPOTWARP_KEY": KEY}).stdout)
    assert listed["snapshots"][0]["signed"] is True
    unsigned = spotwarp("snapshot", "--json", *common, "--workspace-path", str(ws))
    assert json.loads(unsigned.stdout)["signed"] is False


# -- item 12: store failures in one line ----------------------------------------------------------------


@pytest.mark.process
def test_an_unknown_users_home_as_storage_is_one_line(tmp_path):
    result = spotwarp("list", "--storage", "~nosuchuser-spotwarp/store", cwd=tmp_path)
    one_line_failure(result, "~nosuchuser-spotwarp")


@pytest.mark.process
@pytest.mark.parametrize("url", ["file://", "file://relative/store"])
def test_a_file_url_without_a_folder_writes_nothing_into_the_current_folder(tmp_path, url):
    cwd, ws = tmp_path / "cwd", tmp_path / "ws"
    cwd.mkdir()
    ws.mkdir()
    (ws / "a.txt").write_text("a")
    result = spotwarp("snapshot", "--storage", url, "--workspace-path", str(ws), cwd=cwd)
    one_line_failure(result, "absolute")
    assert list(cwd.iterdir()) == []


@pytest.mark.process
def test_an_unreachable_gcs_endpoint_fails_within_the_connect_timeout(tmp_path):
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {"STORAGE_EMULATOR_HOST": f"http://127.0.0.1:{port}", "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false",
           "NO_GCE_CHECK": "True", "GCE_METADATA_HOST": "127.0.0.1:9", "SPOTWARP_STORAGE_OPTIONS": '{"token": "anon"}',
           "SPOTWARP_STORAGE_CONNECT_TIMEOUT": "3"}
    started = time.monotonic()
    result = spotwarp("list", "--storage", "gs://spotwarp-test/x", env=env, cwd=tmp_path)
    took = time.monotonic() - started
    one_line_failure(result, "unreachable", "SPOTWARP_STORAGE_CONNECT_TIMEOUT")
    assert took < 15, took


@pytest.mark.process
@pytest.mark.skipif(shutil.which("unshare") is None or os.geteuid() != 0, reason="needs root and unshare for a tmpfs")
def test_a_full_local_disk_is_one_line_and_leaves_no_snapshot(tmp_path):
    disk, ws = tmp_path / "disk", tmp_path / "ws"
    disk.mkdir()
    ws.mkdir()
    (ws / "big.bin").write_bytes(os.urandom(2 * 1024 * 1024))
    cli = f"{sys.executable} -m spotwarp_jupyter.cli"
    env = {**os.environ, "SPOTWARP_KEY": "", "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime")}
    script = (f"mount -t tmpfs -o size=512k tmpfs {disk} || exit 99; "
              f"{cli} snapshot --project-id proj --storage {disk}/store --workspace-path {ws}; rc=$?; "
              f"{cli} list --json --project-id proj --storage {disk}/store >&2; exit $rc")
    result = subprocess.run(["unshare", "-m", "sh", "-c", script], capture_output=True, text=True, timeout=120, env=env)
    if result.returncode == 99:
        pytest.skip("cannot mount a tmpfs here")
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr and "No space left on device" in result.stderr
    first, listing = result.stderr.split("\n", 1)
    assert first.startswith("spotwarp snapshot: ") and json.loads(listing)["snapshots"] == []


# -- item 13: temporaries of killed writes go on the next write -----------------------------------------


@pytest.mark.process
def test_temporaries_of_dead_writers_are_removed_on_the_next_snapshot(tmp_path):
    store, ws = tmp_path / "store", tmp_path / "ws"
    ws.mkdir()
    (ws / "a.txt").write_text("a")
    common = ("--project-id", "proj", "--storage", str(store), "--workspace-path", str(ws))
    assert spotwarp("snapshot", *common).returncode == 0
    host = "".join(c if c.isalnum() else "_" for c in socket.gethostname())[:40]
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    objects = store / "proj" / "objects" / "ab"
    objects.mkdir(parents=True, exist_ok=True)
    killed = objects / f"{'ab' * 32}.tmp-{host}-{dead.stdout.strip()}-0badc0de"  # its writer has exited
    killed.write_bytes(b"x" * 1000)
    old = store / "proj" / "snapshots" / "20260101T000000000Z-abcdefgh.json.tmp-1234-feedf00d"  # hours old
    old.write_bytes(b"{")
    os.utime(old, (time.time() - 7200, time.time() - 7200))
    live = objects / f"{'ab' * 32}.tmp-{host}-{os.getpid()}-c0ffee00"  # this test process still runs
    live.write_bytes(b"y")
    (ws / "b.txt").write_text("b")
    assert spotwarp("snapshot", *common).returncode == 0
    assert not killed.exists() and not old.exists()
    assert live.exists()
    restored = tmp_path / "restored"
    assert spotwarp("restore", "--project-id", "proj", "--storage", str(store),
                    "--workspace-path", str(restored)).returncode == 0
    assert tree(restored) == tree(ws)


@pytest.mark.process
@pytest.mark.parametrize("area", ["hosts", "events"])
def test_a_record_area_that_is_not_a_folder_is_one_line(tmp_path, area):
    """A store whose hosts/ or events/ is a file (a stray copy, a writer's mistake): `spotwarp hosts`
    and `report` say so in one line; nothing in the store changes."""
    store = tmp_path / "store"
    make_engine(store, key=UNSIGNED).snapshot_kernel(
        {"x": 1}, "train.ipynb")
    (store / "proj" / area).write_text("not a folder")
    before = tree(store)
    command = "report" if area == "events" else "hosts"
    result = spotwarp(command, "--project-id", "proj", "--storage", str(store))
    one_line_failure(result, "storage", "Not a directory")
    assert tree(store) == before
