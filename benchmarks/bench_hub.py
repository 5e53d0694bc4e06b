"""JupyterHub: a user's server lost mid-training and respawned, until the interrupted cell runs again by itself.

A real JupyterHub (tests/support/real_hub.py: the guide's deploy/ config, SimpleLocalProcessSpawner, storage on
the moto S3 emulator, the user's own key) runs alice's training notebook (a `resumable` loop); once snapshots
inside the loop are committed, her server and kernel are SIGKILLed and the hub is told. Then the respawn request
(`POST users/alice/server`), alternately with the home kept and on a new, empty home (the whole home backed up
before the loss). Figures, from the respawn request:

  ready      the hub reports the server ready (files restored into a new home happen before this)
  running    the server's resume entry says the interrupted cell runs again (kernel started, state restored, cell
             sent); its first resumed step follows one step later
  finished   the resumed loop finished, every step once (the test suite checks it bit for bit)

Run: python benchmarks/bench_hub.py [--repeat 2]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
import common  # noqa: E402, F401  (puts tests/support and the checkout on the import path)

from real_hub import (  # noqa: E402
    TRAIN,
    TRAIN_SETUP,
    cell_text,
    poll,
    running_hub,
    snapshot,
    train_and_lose_the_server,
)
from storage_servers import start_server  # noqa: E402


def resume_entry(hub, name: str, states: tuple[str, ...]) -> dict | None:
    reply = hub.call("GET", name, "spotwarp/api/status")
    if reply.status_code != 200:
        return None
    found = [e for e in reply.json().get("resume") or [] if e["notebook"] == "train.ipynb"]
    return found[0] if found and found[0]["state"] in states else None


def one_respawn(hub, home: Path, kernel: str, kept: bool) -> tuple[dict[str, float], str]:
    """Lose alice's server mid-training, respawn it (home kept or new); the figures and the resumed kernel."""
    snapshot(hub, "alice", "the whole home")  # what a new home comes back from
    train_and_lose_the_server(hub, "alice", kernel)
    if not kept:
        shutil.rmtree(home)
        home.mkdir()
    began = time.monotonic()
    hub.start("alice")
    hub.wait_ready("alice")
    ready = time.monotonic() - began
    entry = poll("the cell running again", lambda: resume_entry(hub, "alice", ("running", "finished", "failed")),
                 timeout=180, every=0.05, log=hub.log)
    running = time.monotonic() - began
    assert entry["state"] != "failed", entry
    done = poll("the resumed loop finished", lambda: resume_entry(hub, "alice", ("finished", "failed")),
                timeout=180, log=hub.log)
    finished = time.monotonic() - began
    assert done["state"] == "finished", done
    notebook = home / "train.ipynb"
    text = poll("the resumed cell's output", lambda: "done:" in cell_text(notebook, "train") and
                cell_text(notebook, "train"), timeout=60, log=hub.log)
    steps = [int(line.split()[1]) for line in text.splitlines() if line.startswith("step ")]
    assert steps == list(range(1, 61)), steps
    return {"ready": ready, "running": running, "finished": finished}, done["kernel_id"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=2, help="respawns of each kind (kept home, new home)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-hub-") as tmp:
        tmp_path = Path(tmp)
        s3 = start_server("s3", tmp_path / "moto")
        try:
            with running_hub(tmp_path / "hub", s3) as hub:
                hub.add_user("alice")
                home = hub.home("alice")
                home.mkdir(parents=True, exist_ok=True)
                hub.start("alice")
                hub.wait_ready("alice")
                cells = [{"cell_type": "code", "execution_count": None, "id": cid, "metadata": {}, "outputs": [],
                          "source": src} for cid, src in (("setup", TRAIN_SETUP), ("train", TRAIN))]
                (home / "train.ipynb").write_text(json.dumps({"cells": cells, "metadata": {"kernelspec": {
                    "name": "python3", "language": "python", "display_name": "Python 3"}}, "nbformat": 4,
                    "nbformat_minor": 5}))
                hub.call("PUT", "alice", "api/collaboration/session/train.ipynb",
                         json={"format": "json", "type": "notebook"})
                reply = hub.call("POST", "alice", "api/sessions", json={
                    "path": "train.ipynb", "name": "train.ipynb", "type": "notebook", "kernel": {"name": "python3"}})
                assert reply.status_code == 201, reply.text
                kernel = reply.json()["kernel"]["id"]
                results: dict[str, list[dict[str, float]]] = {"kept home": [], "new home": []}
                for i in range(args.repeat * 2):
                    kind = "kept home" if i % 2 == 0 else "new home"
                    figures, kernel = one_respawn(hub, home, kernel, kind == "kept home")
                    results[kind].append(figures)
                    print(f"{kind:9}  ready {figures['ready']:5.2f} s  running {figures['running']:5.2f} s  "
                          f"finished {figures['finished']:5.2f} s  (load {os.getloadavg()[0]:.1f})", flush=True)
        finally:
            s3.stop()
    print("\nmedians, from the respawn request:")
    for kind, runs in results.items():
        if runs:
            med = {k: statistics.median(r[k] for r in runs) for k in ("ready", "running", "finished")}
            print(f"{kind:9}  ready {med['ready']:5.2f} s  running {med['running']:5.2f} s  "
                  f"finished {med['finished']:5.2f} s  ({len(runs)} runs)")


if __name__ == "__main__":
    main()
