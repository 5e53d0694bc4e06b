"""The server on a real jupyter_server: its own signed snapshots say so, and `restore latest` never falls
back past a damaged newest snapshot."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tornado.httpclient import HTTPClientError

from engines import make_engine
from server_config import spotwarp_server_config

pytest_plugins = ("pytest_jupyter.jupyter_server",)
KEY = "the-servers-secret"


@pytest.fixture
def jp_server_config(store_dir, monkeypatch):
    return spotwarp_server_config(store_dir, monkeypatch, key=KEY)


@pytest.fixture
def workspace(jp_root_dir: Path) -> Path:
    (jp_root_dir / "notes.md").write_text("# notes\n")
    return jp_root_dir


async def post(jp_fetch, *parts):
    response = await jp_fetch("spotwarp", "api", *parts, method="POST", body="")
    return response.code, json.loads(response.body)


async def test_the_servers_own_signed_snapshot_is_reported_signed(jp_fetch, workspace):
    code, made = await post(jp_fetch, "snapshots")
    assert code == 201 and made["signed"] is True
    listed = json.loads((await jp_fetch("spotwarp", "api", "snapshots")).body)["snapshots"]
    assert listed[0]["id"] == made["id"] and listed[0]["signed"] is True


async def test_restore_latest_refuses_a_damaged_newest_snapshot(jp_fetch, workspace, store_dir):
    # snapshots from another host of the project, the newest one then damaged in the store
    other_host = make_engine(store_dir, "api", key=KEY)
    older = other_host.snapshot_project(str(workspace))
    (workspace / "notes.md").write_text("# changed\n")
    newer = other_host.snapshot_project(str(workspace))
    path = store_dir / "api" / "snapshots" / newer.name
    path.write_bytes(path.read_bytes()[:60])  # half-written
    (workspace / "notes.md").write_text("# edited since\n")
    with pytest.raises(HTTPClientError) as refused:
        await post(jp_fetch, "snapshots", "latest", "restore")
    message = json.loads(refused.value.response.body)["message"]
    assert refused.value.code == 400 and path.name in message and "--snapshot ID" in message
    assert (workspace / "notes.md").read_text() == "# edited since\n"  # nothing restored
    code, _restored = await post(jp_fetch, "snapshots", older.id, "restore")
    assert code == 200 and (workspace / "notes.md").read_text() == "# notes\n"
