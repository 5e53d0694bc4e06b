"""Failover with the local provider: holder killed -> a restored session served on the race's winner.

A project with workspace files and a notebook's kernel state. `spotwarp launch --watch` races candidates
(real `spotwarp start` processes, scripted start delays standing in for provisioning) and promotes the
first serving one. The holder is then SIGKILLed (no notice) and the figures are taken of the failover:

  detect             SIGKILL -> the orchestrator declares the host lost (goal: <= --dead-after + 5 s)
  provision          race start -> `spotwarp start` begins on the winner (the scripted delay plus process start)
  restore-and-serve  `spotwarp start` begins -> the winner serves the restored session (its heartbeat says so)
  kill -> served     SIGKILL -> the winner promoted, serving the restored session
  race / single      the race's time to a served winner over the mean time of one candidate alone with each of
                     the same scripted delays (each run as a one-candidate race, same data)
  vs plain start     restore-and-serve over `spotwarp start` on an empty workspace of the same project, no
                     failover (its own heartbeat's figures), measured in the same run (goal: <= 1.2x)

Run: python benchmarks/bench_failover.py [--data-mb 5] [--delays 0.5,2] [--dead-after 3]
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent

from common import table  # noqa: E402

from spotwarp_jupyter.engine import Settings, SnapshotEngine  # noqa: E402
from spotwarp_jupyter.engine.coordination.fence import Fence  # noqa: E402
from spotwarp_jupyter.engine.coordination.heartbeats import read_heartbeat, read_heartbeats  # noqa: E402

from lab_server import TOKEN, LabServer, host_env  # noqa: E402

PROJECT = "bench-failover"


def seed(root: Path, store: str, data_mb: float) -> None:
    ws = root / "origin"
    (ws / "data").mkdir(parents=True)
    for i in range(4):
        (ws / "data" / f"part-{i}.bin").write_bytes(os.urandom(int(data_mb * (1 << 20) / 4)))
    (ws / "train.ipynb").write_text(json.dumps({"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    engine = SnapshotEngine(Settings.resolve(project=PROJECT, storage=store, env={}), key=b"", fence=Fence())
    engine.snapshot_kernel({"weights": list(range(1000)), "step": 42}, "train.ipynb")
    engine.snapshot_project(str(ws), kernels={"train.ipynb": engine.get("latest").kernels["train.ipynb"]})


class Launch:
    def __init__(self, root: Path, store: str, env: dict[str, str], *args: str):
        argv = [sys.executable, "-m", "spotwarp_jupyter.cli", "launch", "--project-id", PROJECT, "--storage", store,
                "--provider", "local", "--provider-option", f"root={root / 'candidates'}", "--provider-option",
                f"token={TOKEN}", "--json", *args]
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env, text=True,
                                     start_new_session=True)
        self.events: queue.Queue = queue.Queue()
        threading.Thread(target=lambda: [self.events.put(json.loads(x)) for x in self.proc.stdout], daemon=True).start()

    def next(self, kind: str, timeout: float = 180) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                event = self.events.get(timeout=0.5)
            except queue.Empty:
                if self.proc.poll() is not None and self.events.empty():
                    break
                continue
            if event["event"] == kind:
                return event
        raise SystemExit(f"bench_failover: no {kind} event within {timeout:g} s")

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=60)


def kill_all(store: str) -> None:
    engine = SnapshotEngine(Settings.resolve(project=PROJECT, storage=store, env={}), key=b"", fence=Fence())
    for doc in read_heartbeats(engine.store):
        try:
            os.killpg(int(doc["pid"]), signal.SIGKILL)
        except (ProcessLookupError, PermissionError, KeyError, ValueError):
            pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-mb", type=float, default=5.0, help="workspace size to restore (MB)")
    parser.add_argument("--delays", default="0.5,2", help="scripted start delays, one per candidate (s)")
    parser.add_argument("--dead-after", type=float, default=3.0, help="--dead-after of the watch (s)")
    args = parser.parse_args()
    delays = [float(d) for d in args.delays.split(",")]
    root = Path(tempfile.mkdtemp(prefix="bench-failover-"))
    store = str(root / "store")
    seed(root, store, args.data_mb)
    shutil.copytree(store, root / "store-plain")  # the same data, for the runs without a race's lease
    shutil.copytree(store, root / "store-single")
    env = host_env(root / "home", SPOTWARP_WATCHERS="signals", SPOTWARP_HEARTBEAT_INTERVAL="1")
    engine = SnapshotEngine(Settings.resolve(project=PROJECT, storage=store, env={}), key=b"", fence=Fence())
    launch = Launch(root, store, env, "--candidates", str(len(delays)), "--watch", "--dead-after",
                    f"{args.dead_after:g}s", "--provider-option", f"delays={args.delays}")
    try:
        first = launch.next("promoted")
        launch.next("failover_finished")
        pid = read_heartbeat(engine.store, first["candidate"])["pid"]
        killed = time.time()
        os.killpg(pid, signal.SIGKILL)
        lost = launch.next("host_lost", timeout=args.dead_after + 60)
        promoted = launch.next("promoted")
        row = launch.next("failover_finished")
    finally:
        launch.stop()
        kill_all(store)

    singles = []  # each scripted delay alone: a one-candidate race on a copy of the same store
    for delay in delays:
        one = Launch(root / f"single-{delay}", str(root / "store-single"), env, "--candidates", "1",
                     "--provider-option", f"delays={delay}")
        try:
            singles.append(one.next("failover_finished")["race_s"])
        finally:
            one.stop()
            kill_all(str(root / "store-single"))

    plain = LabServer(root / "plain" / "ws", str(root / "store-plain"), PROJECT, env, root / "plain.log")
    try:
        wall = plain.wait_ready()
        plain_engine = SnapshotEngine(Settings.resolve(project=PROJECT, storage=str(root / "store-plain"), env={}),
                                      key=b"", fence=Fence())
        doc = next(d for d in read_heartbeats(plain_engine.store))
        plain_rs = doc["ready_at"] - doc["started_at"]
    finally:
        plain.discard()

    detect = lost["time"] - killed
    kill_to_served = promoted["time"] - killed
    ratio_race = row["race_s"] / statistics.mean(singles)
    ratio_plain = row["restore_serve_s"] / plain_rs
    figures = {"detect_s": round(detect, 3), "provision_s": row["provision_s"],
               "restore_serve_s": row["restore_serve_s"], "kill_to_served_s": round(kill_to_served, 3),
               "race_s": row["race_s"], "singles_s": singles, "race_over_single_mean": round(ratio_race, 3),
               "plain_start_restore_serve_s": round(plain_rs, 3), "plain_start_wall_s": round(wall, 3),
               "restore_serve_over_plain": round(ratio_plain, 3), "delays": delays, "data_mb": args.data_mb,
               "dead_after_s": args.dead_after}
    print(table([
        ("detect", f"{detect:.2f} s", f"<= {args.dead_after + 5:g} s", "ok" if detect <= args.dead_after + 5 else "MISS"),
        ("provision (winner)", f"{row['provision_s']:.2f} s", "", ""),
        ("restore-and-serve (winner)", f"{row['restore_serve_s']:.2f} s", "", ""),
        ("kill -> served", f"{kill_to_served:.2f} s", "", ""),
        ("race / mean single", f"{row['race_s']:.2f} / {statistics.mean(singles):.2f} s = {ratio_race:.2f}x", "< 1", ""),
        ("restore-and-serve / plain start", f"{row['restore_serve_s']:.2f} / {plain_rs:.2f} s = {ratio_plain:.2f}x",
         "<= 1.2x", "ok" if ratio_plain <= 1.2 else "MISS"),
        ("plain start, process to HTTP 200", f"{wall:.2f} s", "", ""),
    ]))
    print(json.dumps(figures, sort_keys=True))
    shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
