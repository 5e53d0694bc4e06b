"""Failover with the local provider as tests drive it: a seeded project, `spotwarp launch --json` with its events
in a queue, clients of the servers it starts, and the clean-up of every candidate a test leaves behind."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from spotwarp_jupyter.engine import SnapshotEngine
from spotwarp_jupyter.engine.coordination.fence import Fence
from spotwarp_jupyter.engine.coordination.heartbeats import read_heartbeats

from engines import make_engine
from lab_server import TOKEN, LabServer, host_env

PROJECT = "fo"
NOTEBOOK = {"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}


def engine_for(store: str, key: str = "") -> SnapshotEngine:
    """The project's engine in this test process: unsigned, or signing with `key` (the project's, as its hosts')."""
    return make_engine(store, PROJECT, key=key, fence=Fence())


def seed_project(tmp_path: Path, store: str, key: str = "") -> Path:
    """A project with files and a notebook's kernel state, as a first host left it (signed with `key`, if any)."""
    ws = tmp_path / "origin"
    (ws / "data").mkdir(parents=True)
    (ws / "data" / "blob.bin").write_bytes(os.urandom(200_000))
    (ws / "train.ipynb").write_text(json.dumps(NOTEBOOK))
    engine = engine_for(store, key)
    engine.snapshot_kernel({"weights": [0.5, 1.5], "step": 7}, "train.ipynb")
    engine.snapshot_project(str(ws), kernels={"train.ipynb": engine.get("latest").kernels["train.ipynb"]})
    return ws


class Launch:
    """`spotwarp launch ... --json` in its own process group; its JSON lines in a queue."""

    def __init__(self, tmp_path: Path, store: str, *args: str, env: dict[str, str], command: str = "launch",
                 python: tuple[str, ...] = ("-m", "spotwarp_jupyter.cli"), name: str = "launch"):
        argv = [sys.executable, *python, command, "--project-id", PROJECT, "--storage", store,
                "--provider", "local", "--provider-option", f"root={tmp_path / 'candidates'}",
                "--provider-option", f"token={TOKEN}", "--provider-option", "grace=15", "--json", *args]
        self.stderr_path = tmp_path / f"{name}.stderr"
        with open(self.stderr_path, "wb") as err:
            self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=err, env=env, text=True,
                                         start_new_session=True)
        self.events: queue.Queue = queue.Queue()
        self.seen: list[dict[str, Any]] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            try:
                self.events.put(json.loads(line))
            except ValueError:
                self.events.put({"event": "text", "line": line})
        self.events.put(None)

    def next(self, kind: str, timeout: float = 180) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            try:
                event = self.events.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                event = {"event": "timeout"}
            if event is None or event["event"] == "timeout" or time.monotonic() > deadline:
                raise AssertionError(f"no {kind} event; seen {self.seen}; stderr {self.stderr_path.read_text()[-2000:]}")
            self.seen.append(event)
            if event["event"] == kind:
                return event

    def quiet(self, seconds: float) -> list[dict[str, Any]]:
        """Every event in the next `seconds` (asserting that something does *not* happen needs the whole time)."""
        deadline = time.monotonic() + seconds
        out = []
        while time.monotonic() < deadline:
            try:
                event = self.events.get(timeout=max(0.05, deadline - time.monotonic()))
            except queue.Empty:
                break
            if event is None:
                break
            self.seen.append(event)
            out.append(event)
        return out

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=30)


def attach(url: str, log: Path) -> LabServer:
    """A client of a server started by the local provider (same helpers as for LabServer)."""
    server = object.__new__(LabServer)
    server.url, server.port = url, int(url.rstrip("/").rsplit(":", 1)[1])
    server.log_path, server.ready_path = log, "spotwarp/api/status"
    return server


def cleanup(store: str, tmp_path: Path) -> None:
    """End of a test: every candidate's process group and kernels, whatever state it is in."""
    for doc in read_heartbeats(engine_for(store).store):
        for sig in (signal.SIGCONT, signal.SIGKILL):
            try:
                os.killpg(int(doc["pid"]), sig)
            except (ProcessLookupError, PermissionError, KeyError, ValueError):
                pass
    runtime = str(tmp_path)
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().decode(errors="replace")
            except OSError:
                continue
            if runtime in cmdline and "kernel" in cmdline:
                try:
                    os.kill(int(entry), signal.SIGKILL)
                except ProcessLookupError:
                    pass


def running(marker: str) -> list[int]:
    """Processes whose command line holds `marker` (a candidate id appears in its `spotwarp start` arguments)."""
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().decode(errors="replace")
                state = Path(f"/proc/{entry}/stat").read_text().split(") ")[1][0]
            except (OSError, IndexError):
                continue
            if marker in cmdline and state != "Z":
                out.append(int(entry))
    return out


def env_for(tmp_path: Path, **extra: str) -> dict[str, str]:
    return host_env(tmp_path / "orchestrator-home", **{"SPOTWARP_WATCHERS": "signals",
                                                        "SPOTWARP_HEARTBEAT_INTERVAL": "1",
                                                        "SPOTWARP_SHUTDOWN_GRACE": "10", **extra})
