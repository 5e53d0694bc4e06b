"""New host, nobody at the keyboard: `spotwarp start` until the interrupted training loop takes its first step.

Host A (`spotwarp start`) runs a notebook's `resumable` loop (tests/support/new_hosts.py) and is SIGKILLed mid-loop.
Each run then starts a new host on a copy of that store, twice:
  resume   `spotwarp start` as is: the server resumes the notebook by itself (docs/resume.md)
  by hand  `spotwarp start --no-resume`, then what a user does: open the notebook (a kernel starts),
           `%load_ext spotwarp` + `%spotwarp restore latest`, run the cell again
Both are timed from the start command to the loop's first step (its first output); the resume run is split into
files restored / server serving / kernel started / kernel state restored / cell started / first step.
Goal (issue 22): resume / by hand at most 1.1x. Medians of --repeat runs.

Run: python benchmarks/bench_resume.py [--repeat 3] [--scale 0.1]   (--scale: the reference workload beside the
     model, benchmarks/workload.py; 0 leaves it out)
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests" / "support"))

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
    return SETUP + (f"import sys as _s\n_s.path.insert(0, {str(HERE)!r})\nimport workload as _w\n"
                    f"globals().update(_w.build({scale!r}))\n")


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
        wait_for(lambda: "step " in cell_outputs(on_disk, "loop"), 1200, "the first resumed step", server)
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="runs; medians are reported (default 3)")
    parser.add_argument("--scale", type=float, default=0.0, help="reference workload beside the model (0: none)")
    args = parser.parse_args()
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
