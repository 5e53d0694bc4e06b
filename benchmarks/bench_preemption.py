"""Preemption notice to committed final snapshot, on the reference workload, mid-training.

A real `spotwarp start` server (subprocess) and a notebook kernel holding the reference workload
(benchmarks/workload.py) train it in a `spotwarp.resumable` loop: every step changes the model and the
Adam state, automatic snapshots every --interval seconds. Each repetition waits for an automatic
snapshot, trains on for half an interval (so the last snapshot is at most one interval old), then a
notice arrives: an AWS spot interruption from a local IMDSv2 server (tests/support/metadata_servers.py), and
for the last repetition SIGTERM to the server. Figures:

  notice -> commit      from the server seeing the notice to the final manifest committed (goal: < 5 s)
  posted -> commit      from the metadata server starting to announce it (adds the watcher's polling)
  to the safe point     notice seen -> the kernel's snapshot starting (the rest of the running training step)
  kernel write          the kernel's background snapshot, start to commit
  written               bytes the final snapshot wrote (only what changed since the last snapshot)
  raw write             the same byte count written with fsync, measured in the same run (the write limit)
  exit                  SIGTERM to the server's exit
  preStop hook          with --prestop: the Kubernetes hook (`python -m spotwarp_jupyter.server.hub prestop`)
                        run mid-training before the SIGTERM, as the kubelet does, with deploy/values.yaml's
                        timeout and grace: its request answered (a kernel snapshot at the loop's next step)

Run: python benchmarks/bench_preemption.py [--scale 0.1] [--repeat 3] [--interval 20] [--prestop]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent

from common import raw_write, table  # noqa: E402

from spotwarp_jupyter.engine import Settings, SnapshotEngine  # noqa: E402
from spotwarp_jupyter.engine.journal.events import FINAL_SNAPSHOT_COMMITTED, NOTICE_SEEN, Journal  # noqa: E402
from spotwarp_jupyter.engine.units import format_size  # noqa: E402

from lab_server import TOKEN, Execution, LabServer, host_env  # noqa: E402
from metadata_servers import WATCHER_ENV_OFF, FakeAws  # noqa: E402

PROJECT = "bench-preempt"
SETUP = """
%load_ext spotwarp
import sys, torch
sys.path.insert(0, {bench!r})
from workload import build
globals().update(build({scale}))
x = torch.randn(4, model[0].in_features)
%spotwarp snapshot -m "initial full snapshot"
%spotwarp policy --every {interval}s --no-after-cell
"""
TRAIN = """
import pathlib, spotwarp
stop = pathlib.Path({stop!r})
for step in spotwarp.resumable(range(10**9), name="train"):
    model(x).square().mean().backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    if stop.exists():
        break
"""


def wait_for(predicate, what: str, timeout: float):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise SystemExit(f"bench_preemption: no {what} within {timeout:g} s")


def final_after(journal: Journal, since: float):
    events = journal.events(limit=20)
    seen = next((e for e in events if e.event == NOTICE_SEEN and e.time >= since), None)
    done = next((e for e in events if e.event == FINAL_SNAPSHOT_COMMITTED and e.time >= since), None)
    return (seen, done) if seen and done else None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=float, default=0.1, help="workload scale: 1.0 is about 2 GB, 0.1 about 200 MB")
    parser.add_argument("--repeat", type=int, default=3, help="AWS notices (a SIGTERM follows them)")
    parser.add_argument("--interval", type=float, default=20.0, help="seconds between automatic snapshots")
    parser.add_argument("--prestop", action="store_true",
                        help="run the preStop hook before the SIGTERM, with deploy/values.yaml's timeout and grace")
    parser.add_argument("--keep", help="folder to work in, kept afterwards (default: a temporary one, removed)")
    args = parser.parse_args()

    root = Path(args.keep or tempfile.mkdtemp(prefix="bench-preempt-"))
    try:
        return _run(args, root)
    finally:
        if not args.keep:  # several GB of store: never left behind on a shared disk
            shutil.rmtree(root, ignore_errors=True)


def _run(args: argparse.Namespace, root: Path) -> int:
    store = str(root / "store")
    ws = root / "ws"
    ws.mkdir(parents=True, exist_ok=True)
    (ws / "train.ipynb").write_text('{"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}')
    aws = FakeAws()
    grace = 10 if args.prestop else 30  # deploy/values.yaml's SPOTWARP_SHUTDOWN_GRACE with its hook
    hook_timeout = 5  # deploy/values.yaml's prestop --timeout
    env = host_env(root / "home", **{**WATCHER_ENV_OFF, "SPOTWARP_WATCHERS": "signals,aws",
                                     "SPOTWARP_AWS_METADATA_URL": aws.url, "SPOTWARP_METADATA_POLL_INTERVAL": "0.5",
                                     "SPOTWARP_SHUTDOWN_GRACE": str(grace),
                                     "SPOTWARP_BACKUP_INTERVAL": f"{args.interval:g}s"})
    server = LabServer(ws, store, PROJECT, env, root / "server.log")
    engine = SnapshotEngine(Settings.resolve(project=PROJECT, storage=store, env={}))
    journal = Journal(engine.store)
    rows, results = [], []
    try:
        server.wait_ready()
        nb = server.open_notebook("train.ipynb")
        started = time.perf_counter()
        nb.run(SETUP.format(bench=str(HERE), scale=args.scale, interval=int(args.interval)), timeout=1800)
        initial = engine.manifests("train.ipynb")[0]
        print(f"workload {format_size(initial.size)} loaded and snapshotted in {time.perf_counter() - started:.1f} s",
              flush=True)
        nb.ws.send(Execution(TRAIN.format(stop=str(root / "stop"))).request)
        for rep in range(args.repeat + 1):
            sigterm = rep == args.repeat
            since = time.time()
            automatic = wait_for(lambda since=since: next((m for m in engine.manifests("train.ipynb")
                                                           if m.created > since and m.message is None), None),
                                 "automatic snapshot", args.interval * 4 + 120)
            time.sleep(args.interval / 2)  # benchmark pacing: the notice lands mid-interval
            posted = time.time()
            hook_s = None
            if sigterm and args.prestop:
                hook_env = {**env, "JUPYTERHUB_SERVICE_URL": server.url, "JUPYTERHUB_API_TOKEN": TOKEN}
                hook_started = time.monotonic()
                hook = subprocess.run([sys.executable, "-m", "spotwarp_jupyter.server.hub", "prestop", "--timeout",
                                       str(hook_timeout)], env=hook_env, capture_output=True, text=True, check=False)
                hook_s = round(time.monotonic() - hook_started, 2)
                print(f"preStop hook: {hook_s:.2f} s, exit {hook.returncode}: {(hook.stdout or hook.stderr).strip()}",
                      flush=True)
                posted = time.time()
            if sigterm:
                sent = time.monotonic()
                os.kill(server.proc.pid, signal.SIGTERM)
                server.proc.wait(timeout=grace + 30)
                exit_s = time.monotonic() - sent
            else:
                aws.interrupt(seconds=100 + rep)
            seen, done = wait_for(lambda posted=posted: final_after(journal, posted - 1), "final snapshot", 120)
            final = engine.get(done.snapshot)
            kernel_snapshot = next(m for m in engine.manifests("train.ipynb")
                                   if m.kind == "kernel" and "preemption" in (m.message or ""))
            written = int(final.stats.get("bytes_written", 0)) + int(kernel_snapshot.stats.get("bytes_written", 0))
            # where the time went: a training step to the safe point, the kernel's write, files and the commit
            kernel_start = kernel_snapshot.created - float(kernel_snapshot.stats.get("duration_s") or 0)
            notice_seen = float(seen.details.get("seen", seen.time))
            results.append({"source": "SIGTERM" if sigterm else "aws", "notice_to_commit_s": done.details["notice_to_commit_s"],
                            "to_safe_point_s": round(max(0.0, kernel_start - notice_seen), 2),
                            "kernel_write_s": round(float(kernel_snapshot.stats.get("duration_s") or 0), 2),
                            "posted_to_commit_s": round(done.time - posted, 3), "written": written,
                            "age_s": round(posted - automatic.created, 1), "exit_s": round(exit_s, 2) if sigterm else None,
                            "hook_s": hook_s,
                            "groups_reused": kernel_snapshot.stats.get("groups_reused"),
                            "full_reason": kernel_snapshot.stats.get("full_reason"),
                            # inside the kernel write: pickling and fingerprinting, then the writes' tail, of it the sync
                            **{k: kernel_snapshot.stats.get(k) for k in ("serialize_s", "write_wait_s", "sync_s")}})
            print(json.dumps(results[-1]), flush=True)
    finally:
        (root / "stop").write_text("stop")
        server.kill()
        aws.close()

    raw = [statistics.median(raw_write(root / "raw.bin", max(r["written"], 1)) for _ in range(3)) for r in results]
    (root / "raw.bin").unlink(missing_ok=True)
    for r, ref in zip(results, raw):
        rows.append((f"{r['source']}: notice -> commit (last snapshot {r['age_s']:.0f} s old)", f"{r['notice_to_commit_s']:.2f} s",
                     "< 5 s", "ok" if r["notice_to_commit_s"] < 5 else "MISSED"))
        rows.append((f"{r['source']}: posted -> commit", f"{r['posted_to_commit_s']:.2f} s", "", ""))
        split = f"{r['to_safe_point_s']:.2f} s / {r['kernel_write_s']:.2f} s"
        rows.append((f"{r['source']}: to the safe point / kernel write", split, "", ""))
        reuse = f"{r['groups_reused']} groups reused" if not r["full_reason"] else f"full: {r['full_reason']}"
        rows.append((f"{r['source']}: kernel snapshot", reuse, "", ""))
        rows.append((f"{r['source']}: written / raw write of it", f"{format_size(r['written'])} / {ref:.2f} s",
                     "", f"{r['notice_to_commit_s'] / ref:.1f}x raw" if ref > 0 else ""))
        if r["hook_s"] is not None:
            rows.append(("preStop hook: run -> answered (training)", f"{r['hook_s']:.2f} s", f"< {hook_timeout} s",
                         "ok" if r["hook_s"] < hook_timeout else "MISSED"))
        if r["exit_s"] is not None:
            rows.append(("SIGTERM: signal -> server exited", f"{r['exit_s']:.2f} s", f"< {grace} s grace",
                         "ok" if r["exit_s"] < grace else "MISSED"))
    aws_times = [r["notice_to_commit_s"] for r in results if r["source"] == "aws"]
    if aws_times:
        rows.append(("median notice -> commit (aws)", f"{statistics.median(aws_times):.2f} s", "< 5 s",
                     "ok" if statistics.median(aws_times) < 5 else "MISSED"))
    print(f"\nreference workload at scale {args.scale} ({format_size(initial.size)}), automatic snapshots every "
          f"{args.interval:g} s, training mid-interval\n")
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
