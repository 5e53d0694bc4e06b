"""The messages between server, kernel and widget: request ids echoed by real kernels, malformed ones refused.

A real jupyter_server (pytest-jupyter) with real kernels for the final-snapshot sequence; a real kernel
talked to over its comm for the requests themselves.
"""

from __future__ import annotations

import secrets
import time
from pathlib import Path

import pytest
from server_config import spotwarp_server_config
from test_server_api import execute, open_notebook

from spotwarp_jupyter.engine import Settings, SnapshotEngine
from spotwarp_jupyter.server.watchers import Notice

pytest_plugins = ("pytest_jupyter.jupyter_server",)


@pytest.fixture
def store_dir(tmp_path: Path) -> Path:
    return tmp_path / "store"


@pytest.fixture
def jp_server_config(store_dir, monkeypatch):
    config = spotwarp_server_config(store_dir, monkeypatch)
    config["SpotWarp"]["watchers"] = []
    return config


async def test_the_final_snapshot_is_the_one_taken_for_the_notice_even_when_a_user_message_looks_like_it(
        jp_fetch, jp_ws_fetch, jp_serverapp, store_dir, monkeypatch):
    await jp_serverapp.extension_manager.start_all_extensions()
    service = jp_serverapp.web_app.settings["spotwarp"]
    engine = SnapshotEngine(Settings.resolve(project="api", storage=str(store_dir), env={}))
    kid, ws = await open_notebook(jp_fetch, jp_ws_fetch, "train.ipynb")
    try:
        # every id the server makes from here on is the same: a user who wrote the id the server will use
        # into a snapshot message (what the final-snapshot sequence once looked for) must not fool it
        monkeypatch.setattr(secrets, "token_hex", lambda n=16: "c0ffee12"[: 2 * n])
        await execute(ws, "%load_ext spotwarp\n%spotwarp policy --every 1h --no-after-cell\nstep = 1\n"
                          "%spotwarp snapshot -m 'preemption c0ffee12'")
        (users,) = engine.manifests("train.ipynb")
        await execute(ws, "step = 2")  # after the user's snapshot: only the notice's snapshot has it
        final = await service.responder(Notice(source="test", kind="test-notice", deadline=time.time() + 30))
        monkeypatch.undo()
        assert final is not None and final.kind == "project"
        record = final.kernels["train.ipynb"]
        assert final.stats["kernels_fresh"] == ["train.ipynb"]
        namespace: dict = {}
        engine.restore_kernel(final.id, namespace, "train.ipynb")
        assert namespace["step"] == 2, f"the final snapshot holds the user's snapshot {users.id}, not a fresh one"
        assert record is not None
    finally:
        ws.close()
        await jp_fetch("api", "kernels", kid, method="DELETE")
