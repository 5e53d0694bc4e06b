"""Resuming on a new host is opted out of by `c.SpotWarp.resume_kernels = False` (docs/resume.md), and
a server that restored nothing at start resumes nothing."""

from __future__ import annotations

import json

import pytest

from jupyter_api import call
from server_config import spotwarp_server_config

pytest_plugins = ("pytest_jupyter.jupyter_server",)


@pytest.fixture
def resume_on(request) -> bool:
    return request.param


@pytest.fixture
def jp_server_config(store_dir, resume_on, monkeypatch) -> dict:
    config = spotwarp_server_config(store_dir, monkeypatch)
    config["SpotWarp"]["resume_kernels"] = resume_on
    config["SpotWarp"]["heartbeat_interval"] = 0
    monkeypatch.delenv("SPOTWARP_RESUME_KERNELS", raising=False)
    # what `spotwarp start` tells its server after restoring files into an empty workspace
    monkeypatch.setenv("SPOTWARP_START_RESTORE", json.dumps({"snapshot": "nosuchid", "ref": "latest"}))
    return config


@pytest.mark.parametrize("resume_on", [False], indirect=True)
async def test_the_config_turns_resume_off(jp_fetch, jp_serverapp, resume_on):
    await jp_serverapp.extension_manager.start_all_extensions()
    code, status = await call(jp_fetch, "GET", "spotwarp", "api", "status")
    assert [(e["notebook"], e["state"]) for e in status["resume"]] == [("*", "off")]
    assert "c.SpotWarp.resume_kernels = False" in status["resume"][0]["line"]
    code, sessions = await call(jp_fetch, "GET", "api", "sessions")
    assert sessions == []


@pytest.mark.parametrize("resume_on", [True], indirect=True)
async def test_a_snapshot_the_store_lacks_resumes_nothing(jp_fetch, jp_serverapp, resume_on):
    await jp_serverapp.extension_manager.start_all_extensions()
    (app,) = jp_serverapp.extension_manager.extension_apps["spotwarp_jupyter.server"]
    await app._resume_task  # it looked for the snapshot in the store, found none
    code, status = await call(jp_fetch, "GET", "spotwarp", "api", "status")
    assert status["resume"] == []
