"""New host: `spotwarp start` on an empty workspace to a served, restored session.

Measured against references taken in the same run (medians of --repeat runs):
  lab start    plain `jupyter lab` on an empty folder until /api/status answers (what any host pays)
  raw copy     copying the workspace's bytes folder to folder with fsync (the storage's transfer time)
  kernel start a notebook's kernel started through /api/sessions, first cell run
Figures:
  start+restore   `spotwarp start` until spotwarp/api/status answers, files restored byte-identical
  kernel restore  the notebook's kernel started, `%load_ext spotwarp` + `%spotwarp restore latest` done
  overhead        start+restore - lab start - raw copy  (goal: under 10 s, benchmarks/README.md)

Run: python benchmarks/bench_start.py [--size-mb 200] [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import common  # noqa: E402, F401  (puts tests/support and the checkout on the import path)

from spotwarp_jupyter.engine import Settings, SnapshotEngine  # noqa: E402

from lab_server import LabServer, host_env, tree  # noqa: E402

PROJECT = "bench-start"


def make_workspace(root: Path, size_mb: int) -> None:
    """One large file (most of the bytes), many small ones, a notebook: a typical ML workspace."""
    (root / "data").mkdir(parents=True)
    big = max(size_mb - 20, 1) * 1024 * 1024
    with open(root / "data" / "shard-000.bin", "wb") as f:
        for _ in range(0, big, 8 * 1024 * 1024):
            f.write(os.urandom(min(8 * 1024 * 1024, big - f.tell())))
    for i in range(400):
        sub = root / "src" / f"pkg{i % 20}"
        sub.mkdir(parents=True, exist_ok=True)
        (sub / f"mod{i}.py").write_bytes(os.urandom(50 * 1024))
    (root / "train.ipynb").write_text('{"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}')


def prepare_store(store: str, workspace: Path) -> None:
    """A project snapshot of the workspace and a kernel snapshot of its notebook, as host A left them."""
    import numpy as np

    engine = SnapshotEngine(Settings.resolve(project=PROJECT, storage=store, env={}))
    namespace = {"weights": np.random.default_rng(0).random((1000, 1000)), "step": 1234, "history": list(range(1000))}
    kernel = engine.snapshot_kernel(namespace, notebook="train.ipynb")
    engine.snapshot_project(str(workspace), kernels={"train.ipynb": kernel.kernels["train.ipynb"]})


def raw_copy(src: Path, dst: Path) -> float:
    started = time.perf_counter()
    for path in sorted(src.rglob("*")):
        target = dst / path.relative_to(src)
        if path.is_dir():
            target.mkdir(parents=True, exist_ok=True)
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "rb") as fin, open(target, "wb") as fout:
            shutil.copyfileobj(fin, fout, 8 * 1024 * 1024)
            fout.flush()
            os.fsync(fout.fileno())
    return time.perf_counter() - started


def drop_caches() -> None:
    try:
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
    except OSError:
        pass  # not root: reads may come from the page cache, for references and SpotWarp alike


def one_run(base: Path, store: str, source: Path, run: int) -> dict[str, float]:
    out: dict[str, float] = {}
    drop_caches()
    out["raw copy"] = raw_copy(source, base / f"copy-{run}")

    drop_caches()
    plain = LabServer(base / f"plain-{run}", store, PROJECT, host_env(base / f"home-plain-{run}"),
                      base / f"plain-{run}.log", plain=True)
    try:
        out["lab start"] = plain.wait_ready()
        started = time.perf_counter()
        nb = plain.open_notebook("x.ipynb")
        nb.run("1 + 1")
        out["kernel start"] = time.perf_counter() - started
        nb.close()
    finally:
        plain.kill()

    drop_caches()
    workspace = base / f"ws-{run}"
    server = LabServer(workspace, store, PROJECT, host_env(base / f"home-{run}"), base / f"start-{run}.log")
    try:
        out["start+restore"] = server.wait_ready()
        if tree(workspace) != tree(source):
            raise SystemExit("restored workspace differs from the source")
        started = time.perf_counter()
        nb = server.open_notebook("train.ipynb")
        nb.run("%load_ext spotwarp\n%spotwarp restore latest")
        if nb.value("step") != 1234:
            raise SystemExit("kernel state did not come back")
        out["kernel restore"] = time.perf_counter() - started
        nb.close()
    finally:
        server.kill()
    out["overhead"] = out["start+restore"] - out["lab start"] - out["raw copy"]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=int, default=200, help="workspace size in MB (default 200)")
    parser.add_argument("--repeat", type=int, default=3, help="runs; medians are reported (default 3)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="spotwarp-bench-start-") as tmp:
        base = Path(tmp)
        source = base / "source-ws"
        store = str(base / "store")
        make_workspace(source, args.size_mb)
        prepare_store(store, source)
        files = tree(source)
        size, count = sum(len(b) for b in files.values()), len(files)
        del files
        runs = [one_run(base, store, source, i) for i in range(args.repeat)]
    print(f"workspace {size / 1e6:.0f} MB in {count} files; medians of {args.repeat} runs")
    print(f"{'figure':<16} {'seconds':>8}")
    for key in ("lab start", "raw copy", "kernel start", "start+restore", "kernel restore", "overhead"):
        print(f"{key:<16} {statistics.median(r[key] for r in runs):>8.2f}")
    med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    print(f"start+restore / (lab start + raw copy) = {med['start+restore'] / (med['lab start'] + med['raw copy']):.2f}x; "
          f"kernel restore / kernel start = {med['kernel restore'] / med['kernel start']:.2f}x; "
          f"goal: overhead under 10 s -> {'met' if med['overhead'] < 10 else 'NOT met'}")


if __name__ == "__main__":
    main()
