"""New host, nobody at the keyboard: `spotwarp start` until the interrupted training loop takes its first step.

Host A (`spotwarp start`) runs a notebook's `resumable` loop (tests/support/new_hosts.py) and is SIGKILLed mid-loop.
Each run then starts a new host on a copy of that store, twice:
  resume   `spotwarp start` as is: the server resumes the notebook by itself (docs/resume.md)
  by hand  `spotwarp start --no-resume`, then what a user does: open the notebook (a kernel starts),
           `%load_ext spotwarp` + `%spotwarp restore latest`, run the cell again
Both are timed from the start command to the loop's first step (its first output); the resume run is split into
files restored / server serving / kernel started / kernel state restored / cell started / first step.
Goal: resume / by hand at most 1.1x. Medians of --repeat runs.

--failover: the same loss through `spotwarp launch --provider local --watch --dead-after 4s --standby 1` (one
candidate waits in standby; --standby 0: launched once the loss is detected): the holder trains, is SIGKILLed with
its kernel (no notice) once the standby serves and its warm kernel imported its packages; timed from the kill to the loop's first step on the promoted host,
split into loss detected / candidate started and serving / promoted / promotion seen and its snapshot committed /
kernel started / state restored / cell started / first step; against `--dead-after` + 1.2x a plain `spotwarp start`
(files restored, serving; measured in the same run on a copy of the same store). Goal: at most that.

Run: python benchmarks/bench_resume.py [--repeat 3] [--variant small | --scale 0.1] [--failover [--standby N]]
     (--scale: the reference workload beside the model, benchmarks/workload.py, 0 leaves it out; --variant small
     is the reference workload's smaller variant, --scale 0.1, about 200 MB)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
import common  # noqa: E402, F401  (puts tests/support and the checkout on the import path)

from new_hosts import (  # noqa: E402
    LOOP,
    SETUP,
    cell_outputs,
    kernel_manifests,
    kill_host,
    notebook,
    start_host,
    wait_for,
)

PHASES = ("files restored", "server serving", "kernel started", "state restored", "cell started", "first step")


def setup_code(scale: float) -> str:
    if not scale:
        return SETUP
    # the workload's names get a prefix: its `model` and `opt` must not replace the loop's
    return SETUP + (f"import sys as _s\n_s.path.insert(0, {str(HERE)!r})\nimport workload as _w\n"
                    f"globals().update({{'ref_' + k: v for k, v in _w.build({scale!r}).items()}})\n")


def lose_host(base: Path, store: str, scale: float) -> None:
    """Host A trains and is SIGKILLed mid-loop, with its kernel."""
    setup = setup_code(scale)
    a = start_host(base, "a", store, STEP_PAUSE="0.15", PYTHONHASHSEED="0")
    try:
        (a.workspace / "train.ipynb").write_text(json.dumps(notebook([("setup", setup), ("loop", LOOP)])))
        nb = a.open_notebook("train.ipynb")
        pid = int(nb.run("import os as _o; print(_o.getpid())").strip())
        assert a.request("POST", "spotwarp/api/snapshots", {"message": "the notebook"})[0] == 201
        nb.run(setup, cell_id="setup", timeout=1200)
        nb.send(LOOP, cell_id="loop")
        wait_for(lambda: len([m for m in kernel_manifests(store, "proj")
                              if m["kernels"]["train.ipynb"].get("at") == "step"]) >= 3, 600, "snapshots in the loop", a)
        kill_host(a, pid)
    finally:
        a.discard()


def resumed(base: Path, store: str, run: int) -> dict[str, float]:
    """`spotwarp start` alone; the phases, in seconds from the start command."""
    server = start_host(base, f"resume-{run}", store, "--json", PYTHONHASHSEED="0")
    began = server.started
    try:
        out = {"server serving": time.perf_counter() - began}
        on_disk = server.workspace / "train.ipynb"
        polls = iter(range(10**9))
        wait_for(lambda: "step " in cell_outputs(on_disk, "loop") or (next(polls) % 40 == 39 and _failed(server)),
                 1200, "the first resumed step", server)
        out["first step"] = time.perf_counter() - began
        summary = json.loads(next(line for line in server.log().splitlines() if line.startswith("{")))
        out["files restored"] = summary["prepared_s"]
        entry = wait_for(lambda: _entry(server), 60, "the resume entry", server)
        # the server's figures count from `spotwarp start` itself (SPOTWARP_STARTED_AT), as the others do
        out["kernel started"] = entry["kernel_started_s"]
        out["state restored"] = entry["state_restored_s"]
        out["cell started"] = entry["seconds_to_running"]
        return out
    finally:
        server.discard()


def _failed(server) -> bool:
    """False while the resume goes on; a failed one ends the benchmark with its line."""
    _code, status = server.request("GET", "spotwarp/api/status")
    for e in status.get("resume") or []:
        if e.get("state") in ("failed", "skipped"):
            raise SystemExit(f"the resume failed: {e['line']}")
    return False


def _entry(server) -> dict | None:
    _code, status = server.request("GET", "spotwarp/api/status")
    return next((e for e in status.get("resume") or [] if e.get("seconds_to_running") is not None), None)


def by_hand(base: Path, store: str, run: int) -> float:
    """`spotwarp start --no-resume`, then the notebook opened, restored and its cell run again, by a client."""
    server = start_host(base, f"hand-{run}", store, "--no-resume", PYTHONHASHSEED="0")
    try:
        nb = server.open_notebook("train.ipynb")
        nb.run("%load_ext spotwarp\n%spotwarp restore latest", timeout=1200)
        nb.send(LOOP, cell_id="loop")
        while True:
            msg = json.loads(nb.ws.recv())
            if msg["msg_type"] == "stream" and "step " in msg["content"].get("text", ""):
                return time.perf_counter() - server.started
            if msg["msg_type"] == "error":
                raise SystemExit(f"the cell failed by hand: {msg['content'].get('evalue')}")
    finally:
        server.discard()


DEAD_AFTER_S = 4.0


def _pythonpath() -> str:
    """This tree first (the hosts run its package), then what the benchmark was given."""
    return os.pathsep.join(p for p in (str(HERE.parent), os.environ.get("PYTHONPATH")) if p)


def failover(base: Path, scale: float, standby: int = 1) -> dict[str, float]:
    """Kill the holder of a `launch --watch`; seconds from the kill to each phase, and a plain start's."""
    from failover_hosts import Launch, attach, cleanup, engine_for, env_for

    from spotwarp_jupyter.engine.coordination.heartbeats import read_heartbeat

    from lab_server import LabServer, host_env

    store = str(base / "fo-store")
    origin = base / "fo-origin"
    origin.mkdir()
    setup = setup_code(scale)
    (origin / "train.ipynb").write_text(json.dumps(notebook([("setup", setup), ("loop", LOOP)])))
    engine_for(store).snapshot_project(str(origin))
    shutil.copytree(store, base / "fo-plain-store")
    (base / "home-fo-plain").mkdir()
    plain = LabServer(base / "ws-fo-plain", str(base / "fo-plain-store"), "fo",
                      host_env(base / "home-fo-plain", PYTHONPATH=_pythonpath(), OMP_NUM_THREADS="1",
                               SPOTWARP_BACKUP_INTERVAL="0"), base / "fo-plain.log", start_args=("--no-resume",))
    plain.wait_ready()
    out = {"plain start": time.perf_counter() - plain.started}
    plain.discard()
    launch = Launch(base, store, "--candidates", "1", "--watch", "--dead-after", f"{DEAD_AFTER_S:g}s",
                    *(("--standby", str(standby)) if standby else ()),
                    env=env_for(base, STEP_PAUSE="0.15", PYTHONHASHSEED="0", OMP_NUM_THREADS="1",
                                PYTHONPATH=_pythonpath()))
    try:
        first = launch.next("promoted")
        holder = attach(first["url"], base / "fo-first.log")
        nb = holder.open_notebook("train.ipynb")
        kernel_pid = int(nb.run("import os as _o; print(_o.getpid())").strip())
        nb.run(setup, cell_id="setup", timeout=1200)
        assert holder.request("POST", "spotwarp/api/snapshots", {"message": "after the setup"})[0] == 201
        launch.next("failover_finished")
        if standby:  # the steady state: a standby waits for the next race, its warm kernel ready
            ready = launch.next("standby_ready", timeout=600)
            warm_log = base / "candidates" / ready["candidate"] / "candidate.log"
            wait_for(lambda: any("train.ipynb imported its packages" in line and "torch" in line
                                 for line in warm_log.read_text(errors="replace").splitlines()),
                     120, "the standby's warm kernel, torch imported")
        nb.send(LOOP, cell_id="loop")
        wait_for(lambda: len([m for m in kernel_manifests(store, "fo")
                              if m["kernels"]["train.ipynb"].get("at") == "step"]) >= 3, 600, "snapshots in the loop")
        pid = read_heartbeat(engine_for(store).store, first["candidate"])["pid"]
        os.killpg(pid, signal.SIGKILL)  # the host vanishes, no notice
        os.kill(kernel_pid, signal.SIGKILL)
        killed, killed_at = time.perf_counter(), time.time()
        launch.next("host_lost", timeout=120)
        out["loss detected"] = time.perf_counter() - killed
        second = launch.next("promoted", timeout=600)
        out["promoted"] = time.perf_counter() - killed
        on_disk = base / "candidates" / second["candidate"] / "ws" / "train.ipynb"
        wait_for(lambda: "step " in cell_outputs(on_disk, "loop"), 1200, "the first resumed step on the new holder")
        out["first step"] = time.perf_counter() - killed
        out.update(_split(store, second, base / "candidates" / second["candidate"], killed_at))
    finally:
        launch.stop()
        if os.environ.get("BENCH_KEEP_LOGS"):  # the candidates' logs, for a closer look
            for log in (base / "candidates").glob("*/candidate.log"):
                shutil.copy(log, Path(os.environ["BENCH_KEEP_LOGS"]) / f"{log.parent.name}.log")
        cleanup(store, base)
    return out


def _split(store: str, promoted: dict, folder: Path, killed_at: float) -> dict[str, float]:
    """The promoted candidate's phases, seconds from the kill (one machine, one clock): its `spotwarp start` and
    serving (its heartbeat), its promotion seen and snapshot committed (its log), its resume (its status)."""
    from failover_hosts import attach, engine_for

    from spotwarp_jupyter.engine.coordination.heartbeats import read_heartbeat

    doc = read_heartbeat(engine_for(store).store, promoted["candidate"]) or {}
    began = float(doc.get("started_at") or 0)
    out = {"candidate started": began - killed_at, "candidate serving": float(doc.get("ready_at") or 0) - killed_at}
    for key, text in (("promotion seen", "SpotWarp: promoted (generation"),
                      ("promotion committed", "SpotWarpApp] SpotWarp: promotion snapshot")):
        stamp = _logged_at(folder / "candidate.log", text)
        if stamp is not None:
            out[key] = stamp - killed_at
    _code, status = attach(promoted["url"], folder / "bench.log").request("GET", "spotwarp/api/status")
    entry = next((e for e in status.get("resume") or [] if e.get("seconds_to_running") is not None), {})
    for key, name in (("kernel started", "kernel_started_s"), ("state restored", "state_restored_s"),
                      ("cell started", "seconds_to_running")):
        if entry.get(name) is not None:
            out[key] = began + entry[name] - killed_at
    return out


def _logged_at(log: Path, text: str) -> float | None:
    """When the first log line holding `text` was written (Jupyter's `[W 2026-01-02 03:04:05.678 ...]` prefix)."""
    import datetime

    for line in log.read_text(errors="replace").splitlines():
        if text in line and line.startswith("[") and len(line) > 26:
            try:
                when = datetime.datetime.strptime(line[3:26], "%Y-%m-%d %H:%M:%S.%f")
            except ValueError:
                continue
            return when.timestamp()
    return None


def report_failover(scale: float, standby: int) -> None:
    with tempfile.TemporaryDirectory(prefix="spotwarp-bench-resume-fo-") as tmp:
        f = failover(Path(tmp), scale, standby)
    goal = DEAD_AFTER_S + 1.2 * f["plain start"]
    print(f"failover (launch --provider local --watch --dead-after {DEAD_AFTER_S:g}s --standby {standby}), "
          f"scale {scale:g}, one run, seconds from the SIGKILL (negative: before it)")
    for key in ("loss detected", "candidate started", "candidate serving", "promoted", "promotion seen",
                "promotion committed", "kernel started", "state restored", "cell started", "first step"):
        print(f"{key:<20} {f[key]:>8.2f}" if key in f else f"{key:<20}        ?")
    print(f"plain start      {f['plain start']:>8.2f}  (spotwarp start --no-resume on the same store, to serving)")
    print(f"kill to training running again / (dead-after + 1.2x plain start) = {f['first step']:.2f} / {goal:.2f} = "
          f"{f['first step'] / goal:.2f}x (goal at most 1: {'met' if f['first step'] <= goal else 'NOT met'})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="runs; medians are reported (default 3)")
    parser.add_argument("--scale", type=float, default=0.0, help="reference workload beside the model (0: none)")
    parser.add_argument("--variant", choices=("small",), help="the smaller variant of the reference "
                        "workload (--scale 0.1, about 200 MB)")
    parser.add_argument("--failover", action="store_true", help="kill to running again through `spotwarp launch "
                        "--provider local --watch` instead (one run)")
    parser.add_argument("--standby", type=int, default=1, help="with --failover: candidates kept in standby "
                        "(launch --standby; default 1, 0: launched only once the loss is detected)")
    args = parser.parse_args()
    if args.variant == "small":
        args.scale = 0.1
    if args.scale:  # the workload's classes are pickled by reference: every host's kernel imports `workload`
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (os.environ.get("PYTHONPATH"), str(HERE)) if p)
    if args.failover:
        report_failover(args.scale, args.standby)
        return
    runs: list[dict[str, float]] = []
    with tempfile.TemporaryDirectory(prefix="spotwarp-bench-resume-") as tmp:
        base = Path(tmp)
        store = base / "store"
        lose_host(base, str(store), args.scale)
        for run in range(args.repeat):
            copies = [base / f"store-{run}-{which}" for which in ("resume", "hand")]
            for copy in copies:
                shutil.copytree(store, copy)
            figures = resumed(base, str(copies[0]), run)
            figures["by hand"] = by_hand(base, str(copies[1]), run)
            runs.append(figures)
    med = {key: statistics.median(r[key] for r in runs) for key in runs[0]}
    print(f"scale {args.scale:g}; medians of {args.repeat} runs, seconds from the start command")
    for key in (*PHASES, "by hand"):
        print(f"{key:<16} {med[key]:>8.2f}")
    ratio = med["first step"] / med["by hand"]
    print(f"resume / by hand = {ratio:.2f}x (goal at most 1.1x: {'met' if ratio <= 1.1 else 'NOT met'})")


if __name__ == "__main__":
    main()
