"""A real browser (Debian's chromium, driven by Playwright's sync API) on JupyterLab from `spotwarp start`.

This folder runs in its own pytest process (see scripts/test.sh): Playwright's sync API clashes with the
event loop pytest-jupyter runs in the main test run.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Iterator

import pytest

from lab_server import TOKEN, free_port, host_env

CHROMIUM = os.environ.get("SPOTWARP_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--no-first-run"]


def _decode(raw: bytes) -> Any:
    try:
        return json.loads(raw) if raw else None
    except ValueError:  # an HTML error page
        return raw.decode(errors="replace")


class Lab:
    """`spotwarp start` in its own process group, with the browser-facing options a test needs."""

    def __init__(self, workspace: Path, store: str, home: Path, log: Path, without_spotwarp: bool = False):
        """`without_spotwarp`: plain `jupyter lab` with SpotWarp's server extension off (the panel must say so)."""
        self.port = free_port()
        self.ready_path = "api/status" if without_spotwarp else "spotwarp/api/status"
        self.url = f"http://127.0.0.1:{self.port}/"
        self.workspace = workspace
        self.log_path = log
        config = home / ".jupyter"
        (config / "labconfig").mkdir(parents=True, exist_ok=True)
        # news and update checks off: no network, no notification covering the page
        (config / "labconfig" / "page_config.json").write_text(json.dumps(
            {"disabledExtensions": {"@jupyterlab/apputils-extension:announcements": True}}))
        if without_spotwarp:
            workspace.mkdir(parents=True, exist_ok=True)
            argv = [sys.executable, "-m", "jupyterlab", f"--ServerApp.root_dir={workspace}", f"--port={self.port}",
                    "--ServerApp.jpserver_extensions=spotwarp_jupyter.server=False"]
        else:
            argv = [sys.executable, "-m", "spotwarp_jupyter.cli", "start", "--project-id", "browser",
                    "--storage", store, "--workspace-path", str(workspace), "--port", str(self.port), "--"]
        argv += ["--no-browser", "--allow-root", f"--ServerApp.token={TOKEN}", "--ServerApp.ip=127.0.0.1",
                "--LabApp.news_url=", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
                "--LabApp.extension_manager=readonly", "--LabApp.expose_app_in_browser=True"]
        # SIGTERM watcher only: a test never asks a cloud's metadata address
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=host_env(home, SPOTWARP_WATCHERS="signals"),
                                         start_new_session=True)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def request(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        data = json.dumps(body).encode() if body is not None else (b"" if method == "POST" else None)
        req = urllib.request.Request(self.url + path, data=data, method=method,
                                     headers={"Authorization": f"token {TOKEN}", "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=120) as r:
                return r.status, _decode(r.read())
        except urllib.error.HTTPError as exc:
            return exc.code, _decode(exc.read())

    def wait_ready(self, timeout: float = 180) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"spotwarp start exited with {self.proc.returncode}:\n{self.log()}")
            try:
                if self.request("GET", self.ready_path)[0] == 200:
                    return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.1)  # poll interval of a deadline-bounded wait
        raise AssertionError(f"JupyterLab not ready after {timeout} s:\n{self.log()}")

    def kill(self) -> None:
        """SIGKILL to the whole process group: the spot instance is gone."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc.poll() is not None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=30)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait(timeout=30)


NOTEBOOK_CELLS = [
    ("c1", "%load_ext spotwarp"),
    ("c2", "weights = [0.25] * 1000\nimport threading\nlock = threading.Lock()"),
    ("c3", "%spotwarp snapshot -m epoch3"),
]


@pytest.fixture
def start_lab(tmp_path: Path) -> Iterator:
    """Start `spotwarp start` as a host named `host` (its own HOME); every host shares one store."""
    started: list[Lab] = []

    def start(host: str, workspace: Path, without_spotwarp: bool = False) -> Lab:
        server = Lab(workspace, str(tmp_path / "store"), tmp_path / host / "home", tmp_path / f"{host}.log",
                     without_spotwarp)
        started.append(server)
        server.wait_ready()
        return server

    yield start
    for server in started:
        server.stop()


@pytest.fixture
def lab(tmp_path: Path, start_lab) -> Lab:
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
