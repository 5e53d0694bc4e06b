"""Failover end to end with the local provider: real `spotwarp launch` and real `spotwarp start` candidates.

1. A race of three (scripted delays, one scripted failure): exactly one promoted, the fastest healthy one;
   the others torn down, and nothing in the store written by them.
2. The holder SIGKILLed with no notice: `launch --watch` detects it within --dead-after, races, and the new
   holder serves the session restored: files byte-identical, kernel variables back in the notebook's kernel.
3. The holder SIGSTOPped (a partition), then SIGCONT after the failover: its later snapshots never become
   latest, and it stops itself.
"""

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

import pytest

from spotwarp_jupyter.engine import Settings, SnapshotEngine
from spotwarp_jupyter.engine.coordination.fence import Fence, read_lease
from spotwarp_jupyter.engine.coordination.heartbeats import read_heartbeat, read_heartbeats
from spotwarp_jupyter.engine.journal.events import FINAL_SNAPSHOT_COMMITTED, NOTICE_SEEN, Journal

from lab_server import TOKEN, LabServer, host_env, tree
from waiting import wait_for

pytestmark = pytest.mark.slow  # real `spotwarp start` servers raced, killed and partitioned: minutes in all

PROJECT = "fo"
NOTEBOOK = {"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}


def engine_for(store: str) -> SnapshotEngine:
    return SnapshotEngine(Settings.resolve(project=PROJECT, storage=store, env={}), key=b"", fence=Fence())


def seed_project(tmp_path: Path, store: str) -> Path:
    """A project with files and a notebook's kernel state, as a first host left it."""
    ws = tmp_path / "origin"
    (ws / "data").mkdir(parents=True)
    (ws / "data" / "blob.bin").write_bytes(os.urandom(200_000))
    (ws / "train.ipynb").write_text(json.dumps(NOTEBOOK))
    engine = engine_for(store)
    engine.snapshot_kernel({"weights": [0.5, 1.5], "step": 7}, "train.ipynb")
    engine.snapshot_project(str(ws), kernels={"train.ipynb": engine.get("latest").kernels["train.ipynb"]})
    return ws


class Launch:
    """`spotwarp launch ... --json` in its own process group; its JSON lines in a queue."""

    def __init__(self, tmp_path: Path, store: str, *args: str, env: dict[str, str]):
        argv = [sys.executable, "-m", "spotwarp_jupyter.cli", "launch", "--project-id", PROJECT, "--storage", store,
                "--provider", "local", "--provider-option", f"root={tmp_path / 'candidates'}",
                "--provider-option", f"token={TOKEN}", "--provider-option", "grace=15", "--json", *args]
        self.stderr_path = tmp_path / "launch.stderr"
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
    return host_env(tmp_path / "orchestrator-home", SPOTWARP_WATCHERS="signals", SPOTWARP_HEARTBEAT_INTERVAL="1",
                    SPOTWARP_SHUTDOWN_GRACE="10", **extra)


def test_race_promotes_the_fastest_healthy_candidate_and_the_losers_write_nothing(tmp_path):
    store = str(tmp_path / "store")
    seed_project(tmp_path, store)
    engine = engine_for(store)
    before = set(engine.store.manifest_names())
    launch = Launch(tmp_path, store, "--candidates", "3", "--provider-option", "delays=0,0,6",
                    "--provider-option", "fail=1", env=env_for(tmp_path))
    try:
        started = launch.next("race_started")
        ids = [c["id"] for c in started["candidates"]]
        failed = launch.next("candidate_failed")
        promoted = launch.next("promoted")
        finished = launch.next("failover_finished")
        assert launch.proc.wait(timeout=120) == 0, launch.stderr_path.read_text()
        assert failed["id"] == ids[1] and "scripted failure" in failed["message"]
        assert promoted["candidate"] == ids[0] == finished["winner"]  # the fastest healthy one
        assert [e["event"] for e in launch.seen].count("promoted") == 1
        states = {c["id"]: c["state"] for c in finished["candidates"]}
        assert states == {ids[0]: "promoted", ids[1]: "failed", ids[2]: "down"}
        lease = read_lease(engine.store)
        assert (lease.generation, lease.holder) == (1, ids[0])
        assert running(ids[1]) == [] and running(ids[2]) == []  # torn down
        assert running(ids[0])  # the winner serves
        # the winner learns of its promotion and commits its generation's first snapshot; nobody else wrote
        promotion = wait_for(lambda: next((m for m in engine.manifests() if m.generation == 1), None),
                             "the promotion snapshot")
        assert promotion.holder == ids[0] and promotion.kernels["train.ipynb"]
        new = [m for m in engine.manifests() if m.name not in before]
        assert [(m.generation, m.holder) for m in new] == [(1, ids[0])], new
        events = Journal(engine.store).events()
        assert not [e for e in events if e.event in (NOTICE_SEEN, FINAL_SNAPSHOT_COMMITTED)]
        assert not [e for e in events if e.details.get("candidate") in (ids[1], ids[2])
                    and e.event not in ("race_started",)]
        assert read_heartbeat(engine.store, ids[0])["state"] == "holder"
        for loser in ids[1:]:
            doc = read_heartbeat(engine.store, loser)
            assert doc is None or doc["state"] in ("standby", "fenced")
        report = json.loads(subprocess.run([sys.executable, "-m", "spotwarp_jupyter.cli", "report", "--project-id",
                                            PROJECT, "--storage", store, "--json"], capture_output=True, text=True,
                                           env=env_for(tmp_path), timeout=60, check=True).stdout)
        (row,) = report["failovers"]
        assert row["ok"] and row["winner"] == ids[0] and row["provision_s"] is not None \
            and row["restore_serve_s"] is not None and row["total_s"] >= row["restore_serve_s"]
    finally:
        launch.stop()
        cleanup(store, tmp_path)


def test_the_holder_killed_without_notice_is_replaced_and_the_session_comes_back(tmp_path):
    store = str(tmp_path / "store")
    seed_project(tmp_path, store)
    engine = engine_for(store)
    dead_after = 4.0
    launch = Launch(tmp_path, store, "--candidates", "2", "--watch", "--dead-after", f"{dead_after:g}s",
                    env=env_for(tmp_path))
    kernel_pid = None
    try:
        first = launch.next("promoted")
        holder = attach(first["url"], tmp_path / "first.log")
        ws_first = tmp_path / "candidates" / first["candidate"] / "ws"
        nb = holder.open_notebook("train.ipynb")
        kernel_pid = nb.value("__import__('os').getpid()")
        restored = nb.run("%load_ext spotwarp\n%spotwarp restore latest")
        assert "weights" in restored, restored
        nb.run("weights.append(2.5)\nhistory = {'loss': [0.9, 0.4]}")
        (ws_first / "data" / "notes.txt").write_text("written on the first holder\n")
        code, snap = holder.request("POST", "spotwarp/api/snapshots", {"message": "before the loss"})
        assert code == 201 and snap["generation"] == 1 and snap["holder"] == first["candidate"], snap
        nb.close()
        expected = tree(ws_first)
        pid = read_heartbeat(engine.store, first["candidate"])["pid"]
        launch.next("failover_finished")  # the first race's row
        killed = time.time()
        os.killpg(pid, signal.SIGKILL)  # the host vanishes, no notice
        os.kill(kernel_pid, signal.SIGKILL)
        lost = launch.next("host_lost", timeout=dead_after + 30)
        detected = time.time()
        assert lost["lost"] == first["candidate"] and lost["reason"] == "no heartbeat"
        assert lost["provider_state"] == "gone"
        assert detected - killed <= dead_after + 5, (detected - killed, lost)
        second = launch.next("promoted")
        finished = launch.next("failover_finished")
        assert second["generation"] == 2 and finished["lost"] == first["candidate"]
        assert finished["detect_s"] is not None and finished["total_s"] >= finished["restore_serve_s"]

        ws_second = tmp_path / "candidates" / second["candidate"] / "ws"
        assert tree(ws_second) == expected  # byte-identical
        new = attach(second["url"], tmp_path / "second.log")
        nb = new.open_notebook("train.ipynb")
        out = nb.run("%load_ext spotwarp\n%spotwarp restore latest")
        assert "weights" in out, out
        assert nb.value("weights") == [0.5, 1.5, 2.5]
        assert nb.value("history") == {"loss": [0.9, 0.4]}
        assert nb.value("step") == 7
        nb.close()
        latest = engine.get("latest")
        assert latest.generation == 2 and latest.holder == second["candidate"]
        launch.stop()
        assert launch.proc.returncode == 0, launch.stderr_path.read_text()
    finally:
        launch.stop()
        if kernel_pid:
            try:
                os.kill(kernel_pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        cleanup(store, tmp_path)


def test_a_partitioned_holder_back_after_the_failover_never_becomes_latest_and_stops(tmp_path):
    store = str(tmp_path / "store")
    seed_project(tmp_path, store)
    engine = engine_for(store)
    env = env_for(tmp_path)
    old = LabServer(tmp_path / "old" / "ws", store, PROJECT, host_env(tmp_path / "old-home", **{
        k: v for k, v in env.items() if k.startswith("SPOTWARP_")}), tmp_path / "old.log")
    launch = None
    try:
        old.wait_ready()
        code, first = old.request("POST", "spotwarp/api/snapshots", {"message": "on the first host"})
        assert code == 201 and first["generation"] == 0
        launch = Launch(tmp_path, store, "--candidates", "1", "--watch", "--dead-after", "3s", env=env)
        launch.next("adopted")  # a live host serving the project: watched, not raced against
        os.killpg(old.proc.pid, signal.SIGSTOP)  # cut off: no heartbeat, but still there
        lost = launch.next("host_lost", timeout=60)
        assert lost["reason"] == "no heartbeat"
        promoted = launch.next("promoted")
        launch.next("failover_finished")
        assert promoted["generation"] == 1
        promoted_at = read_lease(engine.store).time

        os.killpg(old.proc.pid, signal.SIGCONT)  # back: it must find itself fenced off
        try:
            code, answer = old.request("POST", "spotwarp/api/snapshots", {"message": "after the partition"},
                                       timeout=30)
            assert code == 409 and "lost the lease" in answer["message"], (code, answer)
        except (OSError, ConnectionError):
            pass  # it had already stopped itself
        assert old.proc.wait(timeout=60) is not None  # it stops itself
        assert "lost the lease" in old.log()
        stale = [m for m in engine.manifests() if m.generation == 0 and m.created > promoted_at]
        assert stale == []
        latest = engine.get("latest")
        assert latest.generation == 1 and latest.holder == promoted["candidate"]
        heartbeats = {d["id"]: d for d in read_heartbeats(engine.store)}
        assert any(d["state"] == "fenced" for d in heartbeats.values() if not d.get("candidate"))
    finally:
        if launch is not None:
            launch.stop()
        try:
            os.killpg(old.proc.pid, signal.SIGCONT)
        except ProcessLookupError:
            pass
        old.discard()
        cleanup(store, tmp_path)


def test_a_preemption_notice_is_detected_and_the_race_restores_the_final_snapshot(tmp_path):
    store = str(tmp_path / "store")
    seed_project(tmp_path, store)
    engine = engine_for(store)
    # a long --dead-after: only the notice can make the watch act this soon
    launch = Launch(tmp_path, store, "--candidates", "1", "--watch", "--dead-after", "120s", env=env_for(tmp_path))
    try:
        first = launch.next("promoted")
        launch.next("failover_finished")
        ws_first = tmp_path / "candidates" / first["candidate"] / "ws"
        (ws_first / "late.txt").write_text("only the final snapshot has this\n")
        pid = read_heartbeat(engine.store, first["candidate"])["pid"]
        sent = time.time()
        os.kill(pid, signal.SIGTERM)  # the cloud's notice
        lost = launch.next("host_lost", timeout=60)
        assert lost["reason"] == "notice" and lost["source"] == "signals" and lost["final_snapshot"], lost
        assert time.time() - sent < 60
        final = engine.get(lost["final_snapshot"])
        assert final.generation == 1 and final.holder == first["candidate"] and "late.txt" in final.files["entries"]
        second = launch.next("promoted")
        launch.next("failover_finished")
        ws_second = tmp_path / "candidates" / second["candidate"] / "ws"
        assert (ws_second / "late.txt").read_text() == "only the final snapshot has this\n"
        assert tree(ws_second) == tree(ws_first)
    finally:
        launch.stop()
        cleanup(store, tmp_path)


def cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "spotwarp_jupyter.cli", *args], capture_output=True, text=True,
                          env=env_for(tmp_path), timeout=120)


def test_launch_bad_input_and_a_race_where_every_candidate_fails_are_one_line(tmp_path):
    store = str(tmp_path / "store")
    base = ["launch", "--project-id", PROJECT, "--storage", store]
    cases = [
        ([*base, "--provider", "nope"], "unknown provider 'nope'"),
        ([*base, "--candidates", "0"], "at least 1"),
        ([*base, "--max-price", "-1"], "price"),
        ([*base, "--dead-after", "soon"], "bad duration"),
        ([*base, "--clouds", ",,"], "cloud names"),
        ([*base, "--provider-option", "novalue"], "KEY=VALUE"),
        ([*base, "--provider", "local", "--provider-option", "delays=a,b"], "delays must be numbers"),
    ]
    for args, message in cases:
        out = cli(tmp_path, *args)
        assert out.returncode in (1, 2) and message in out.stderr, (args, out.stderr)
        assert len(out.stderr.strip().splitlines()) == 1, out.stderr
    seed_project(tmp_path, store)
    engine = engine_for(store)
    before = engine.store.manifest_names()
    out = cli(tmp_path, *base, "--provider", "local", "--candidates", "2", "--provider-option", "fail=0,1",
              "--provider-option", f"root={tmp_path / 'candidates'}")
    assert out.returncode == 1 and "all 2 candidates failed" in out.stderr and "scripted failure" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert read_lease(engine.store).generation == 0 and engine.store.manifest_names() == before
    out = cli(tmp_path, "watch", "--project-id", PROJECT, "--storage", store, "--provider", "local")
    assert out.returncode == 1 and "no live host serves project" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr
    hosts = json.loads(cli(tmp_path, "hosts", "--project-id", PROJECT, "--storage", store, "--json").stdout)
    assert hosts["lease"]["generation"] == 0 and hosts["hosts"] == []
    report = json.loads(cli(tmp_path, "report", "--project-id", PROJECT, "--storage", store, "--json").stdout)
    (row,) = report["failovers"]
    assert not row["ok"] and "all 2 candidates failed" in row["error"]
