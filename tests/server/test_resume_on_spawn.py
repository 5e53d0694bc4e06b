"""A server that restored files into a fresh workspace when it started (JupyterHub's restore on spawn, here
`restore_on_start = if-empty`) resumes the notebooks' kernels by itself, as `spotwarp start` does (docs/resume.md)."""

from __future__ import annotations

import json
import re

import pytest

from spotwarp_jupyter.engine.coordination import write_heartbeat

from engines import UNSIGNED, make_engine
from jupyter_api import call
from server_config import spotwarp_server_config

pytest_plugins = ("pytest_jupyter.jupyter_server",)
KEY = "the-project-key-of-the-spawned-server"


@pytest.fixture
def jp_server_config(store_dir, tmp_path, monkeypatch) -> dict:
    origin = tmp_path / "origin"
    origin.mkdir()
    (origin / "train.ipynb").write_text(json.dumps({"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    # signed with the project's key, which the server is given too: it resumes only what the key vouches for
    engine = make_engine(store_dir, "api", key=KEY)
    kernel = engine.snapshot_kernel({"weights": [0.5, 1.5], "step": 7}, "train.ipynb")
    engine.snapshot_project(str(origin), kernels={"train.ipynb": kernel.kernels["train.ipynb"]})
    # the host that took it served 30 s longer, then vanished (no notice): its last heartbeat stays in the store
    write_heartbeat(engine.store, {"id": "lost-host-8888", "generation": 0, "state": "serving", "host": "lost-host",
                                   "time": kernel.created + 30.0, "started_at": kernel.created - 60.0},
                    key=KEY.encode())
    config = spotwarp_server_config(store_dir, monkeypatch, key=KEY)
    config["SpotWarp"].update(restore_on_start="if-empty", heartbeat_interval=0)
    monkeypatch.delenv("SPOTWARP_START_RESTORE", raising=False)
    monkeypatch.delenv("SPOTWARP_RESUME_KERNELS", raising=False)
    return config


async def test_a_restore_on_spawn_resumes_the_notebooks_kernel(jp_fetch, jp_serverapp, jp_root_dir):
    assert (jp_root_dir / "train.ipynb").exists()  # restored before anything was served
    await jp_serverapp.extension_manager.start_all_extensions()
    (app,) = jp_serverapp.extension_manager.extension_apps["spotwarp_jupyter.server"]
    await app._resume_task
    code, status = await call(jp_fetch, "GET", "spotwarp", "api", "status")
    (entry,) = status["resume"]
    assert entry["notebook"] == "train.ipynb" and entry["state"] == "restored", entry
    # no cell ran when the snapshot was taken; what ran in the lost host's last 30 s is in no snapshot
    assert re.search(r"; no cell was running when it was taken, (29\.\d|30\.0) s before lost-host's last heartbeat: "
                     r"what ran after it is in no snapshot$", entry["line"]), entry["line"]
    # the loss came without a notice: the resume records it, and the report counts it
    (loss,) = status["report"]["events"]
    assert loss["with_notice"] is False and loss["host"] == "lost-host" and loss["survived"] is True, loss
    assert status["report"]["preemptions"] == 1 and 29.9 < loss["work_lost_s"] < 31
    code, sessions = await call(jp_fetch, "GET", "api", "sessions")
    assert [s["path"] for s in sessions] == ["train.ipynb"] and sessions[0]["kernel"]["id"] == entry["kernel_id"]


class TestOptedInByConfig:
    """`c.SpotWarp.resume_unsigned = True` is the opt-in for the restore on spawn as much as the variable is: the
    cells an unsigned kernel record ran go back into its notebook."""

    @pytest.fixture
    def jp_server_config(self, store_dir, tmp_path, monkeypatch) -> dict:
        origin = tmp_path / "origin"
        origin.mkdir()
        (origin / "train.ipynb").write_text(json.dumps({"cells": [], "metadata": {}, "nbformat": 4,
                                                        "nbformat_minor": 5}))
        engine = make_engine(store_dir, "api", key=UNSIGNED)
        kernel = engine.snapshot_kernel({"x": 1}, "train.ipynb")
        record = {**kernel.kernels["train.ipynb"], "cells": [{"id": "setup", "source": "x = 1"}]}
        engine.snapshot_project(str(origin), kernels={"train.ipynb": record})
        config = spotwarp_server_config(store_dir, monkeypatch)  # no key: the store's snapshots are unsigned
        config["SpotWarp"].update(restore_on_start="if-empty", resume_unsigned=True, resume_kernels=False,
                                  heartbeat_interval=0)
        for name in ("SPOTWARP_START_RESTORE", "SPOTWARP_RESUME_KERNELS", "SPOTWARP_RESUME_UNSIGNED"):
            monkeypatch.delenv(name, raising=False)
        return config

    async def test_the_recorded_cells_go_back_into_the_notebook(self, jp_fetch, jp_root_dir):
        cells = json.loads((jp_root_dir / "train.ipynb").read_text())["cells"]
        assert [(c["id"], "".join(c["source"])) for c in cells] == [("setup", "x = 1")], cells
