"""A real browser (Debian's chromium, driven by Playwright's sync API) on JupyterLab from `spotwarp start`.

This folder runs in its own pytest process (see scripts/test.sh): Playwright's sync API clashes with the
event loop pytest-jupyter runs in the main test run.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Iterator

import pytest

from lab_server import LabServer, host_env
from new_hosts import PROJECT_KEY

CHROMIUM = os.environ.get("SPOTWARP_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--no-first-run"]


def browser_lab(workspace: Path, store: str, home: Path, log: Path, without_spotwarp: bool = False,
                start_args: tuple[str, ...] = (), jupyter_args: tuple[str, ...] = ()) -> LabServer:
    """`spotwarp start` with the browser-facing options a test needs (its own HOME; news and update checks off).

    `without_spotwarp`: plain `jupyter lab` with SpotWarp's server extension off (the panel must say so);
    `jupyter_args`: more of JupyterLab's own flags (e.g. `--YDocExtension.disable_rtc=True`: collaboration off).
    """
    config = home / ".jupyter"
    (config / "labconfig").mkdir(parents=True, exist_ok=True)
    # news and update checks off: no network, no notification covering the page
    (config / "labconfig" / "page_config.json").write_text(json.dumps(
        {"disabledExtensions": {"@jupyterlab/apputils-extension:announcements": True}}))
    browser_args = ("--LabApp.news_url=", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
                    "--LabApp.expose_app_in_browser=True", *jupyter_args)
    if without_spotwarp:
        browser_args += ("--ServerApp.jpserver_extensions=spotwarp_jupyter.server=False",)
    # SIGTERM watcher only: a test never asks a cloud's metadata address; every host is given the project's key,
    # as its user carries it (`spotwarp key`), so a new host resumes what the first one signed
    env = host_env(home, SPOTWARP_WATCHERS="signals", SPOTWARP_KEY=PROJECT_KEY)
    return LabServer(workspace, store, "browser", env, log,
                     plain=without_spotwarp, jupyter_args=browser_args, start_args=start_args)


NOTEBOOK_CELLS = [
    ("c1", "%load_ext spotwarp"),
    ("c2", "weights = [0.25] * 1000\nimport socket\nconn = socket.socket()"),  # a socket: skipped
    ("c3", "%spotwarp snapshot -m epoch3"),
]


@pytest.fixture
def start_lab(tmp_path: Path, request) -> Iterator:
    """Start `spotwarp start` as a host named `host` (its own HOME); every host shares one store.

    When the test failed, the end of each host's log is printed (CI shows only the end of the output)."""
    started: list[LabServer] = []

    def start(host: str, workspace: Path, without_spotwarp: bool = False, start_args: tuple[str, ...] = (),
              jupyter_args: tuple[str, ...] = ()) -> LabServer:
        server = browser_lab(workspace, str(tmp_path / "store"), tmp_path / host / "home", tmp_path / f"{host}.log",
                             without_spotwarp, start_args, jupyter_args)
        started.append(server)
        server.wait_ready()
        return server

    yield start
    for server in started:
        server.stop()
    failed = getattr(request.node, "report_call", None)
    if failed is not None and failed.failed:
        for server in started:
            print(f"--- the last lines of {server.log_path.name} ---")
            lines = [line for line in server.log().splitlines() if "Saving " not in line]  # a room saves every 3 s
            print("\n".join(lines[-40:]))


@pytest.fixture
def lab(tmp_path: Path, start_lab) -> LabServer:
    """The first host: a workspace with a notebook and a data file."""
    workspace = tmp_path / "host-a" / "workspace"
    workspace.mkdir(parents=True)
    notebook = {
        "cells": [{"cell_type": "code", "execution_count": None, "id": cid, "metadata": {}, "outputs": [],
                   "source": src} for cid, src in NOTEBOOK_CELLS],
        "metadata": {"kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"}},
        "nbformat": 4, "nbformat_minor": 5,
    }
    (workspace / "train.ipynb").write_text(json.dumps(notebook))
    (workspace / "data.txt").write_text("epoch 3\n")
    return start_lab("host-a", workspace)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    report = yield
    setattr(item, f"report_{report.when}", report)
    return report


@pytest.fixture
def page(tmp_path: Path, request):
    """A fresh headless chromium page (function scope: the sync API's loop lives only in this test)."""
    from playwright.sync_api import expect, sync_playwright

    # deadlines, not sleeps: generous because CI machines are shared and JupyterLab is heavy
    expect.set_options(timeout=60_000)

    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} not found: apt-get install -y chromium (the browser test never downloads one)")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        context = browser.new_context(viewport={"width": 1400, "height": 1000})
        page = context.new_page()
        page.set_default_timeout(60_000)
        try:
            yield page
        finally:
            failed = getattr(request.node, "report_call", None)
            if failed is not None and failed.failed:
                shot = tmp_path / "failure.png"
                page.screenshot(path=str(shot))
                print(f"screenshot of the page at the failure: {shot}")
            context.close()
            browser.close()
