"""Snapshot upload and restore throughput on object storage, as a ratio to plain fsspec on the same bytes.

Starts gcp-storage-emulator and moto on 127.0.0.1 (as the tests do), builds the reference workload
(benchmarks/workload.py), and for each backend and repetition, in the same run:
  - snapshot: a full SpotWarp snapshot of the workload into a fresh prefix (serialize, hash, upload, commit);
  - put:      a plain `fs.pipe_file` of a blob of the same byte count (fsspec defaults, one call);
  - restore:  a fresh engine (a new host) restoring that snapshot into an empty namespace (read, verify, load);
  - get:      a plain `fs.cat_file` of the blob.
Two workloads: BENCH.md's reference notebook (many tensors: request latency counts) and one large
array (few 64 MiB objects: bandwidth counts). The ratios are SpotWarp throughput over plain fsspec throughput (1.0 = as fast as a bare put/get of the
same bytes; above 1 = faster, from parallel transfers). Medians of --reps repetitions.

    python benchmarks/bench_storage.py --scale 0.1 --reps 3
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import uuid
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "tests" / "support")]

from common import median  # noqa: E402

from spotwarp_jupyter.engine import Settings, SnapshotEngine  # noqa: E402


def _targets(kinds: list[str], workdir: Path):
    import storage_servers

    servers = []
    for kind in kinds:
        if kind == "local":
            yield kind, None, lambda: storage_servers.StorageTarget("local", str(workdir / "local" / uuid.uuid4().hex))
            continue
        server = storage_servers.start_server(kind, workdir / kind)
        servers.append(server)
        yield kind, server, server.target
    for server in servers:
        server.stop()


def _engine(target) -> SnapshotEngine:
    settings = Settings.resolve(project="bench", storage=target.url, storage_options=target.options, env={})
    return SnapshotEngine(settings, key=b"bench-key")


def _rm(target) -> None:
    fs = target.filesystem()
    root = target.url.split("://", 1)[-1]
    try:
        fs.rm(root, recursive=True)
    except FileNotFoundError:
        pass


def run_backend(kind: str, new_target, ns: dict, reps: int) -> dict[str, float]:
    """Median seconds of snapshot / put / restore / get on one backend, and the byte count."""
    times: dict[str, list[float]] = {"snapshot": [], "put": [], "restore": [], "get": []}
    nbytes = 0
    blob = b""
    for rep in range(reps):
        target = new_target()
        engine = _engine(target)
        started = time.perf_counter()
        manifest = engine.snapshot_kernel(ns, message=f"bench {rep}")
        times["snapshot"].append(time.perf_counter() - started)
        if not nbytes:
            nbytes = int(manifest.stats["bytes_written"])
            blob = os.urandom(nbytes)

        restored: dict = {}
        host_b = _engine(target)
        started = time.perf_counter()
        host_b.restore_kernel(manifest.id, restored)
        times["restore"].append(time.perf_counter() - started)
        assert set(restored) >= {k for k in ns if not k.startswith("_")} - set(manifest.kernels["default"]["skipped"])
        del restored

        fs = target.filesystem()
        path = f"{target.url.split('://', 1)[-1]}/plain/blob"
        if kind == "local":
            os.makedirs(os.path.dirname(path), exist_ok=True)
        started = time.perf_counter()
        fs.pipe_file(path, blob)
        times["put"].append(time.perf_counter() - started)
        started = time.perf_counter()
        back = fs.cat_file(path)
        times["get"].append(time.perf_counter() - started)
        assert len(back) == nbytes
        del back
        _rm(target)
        print(f"  {kind} rep {rep + 1}: " + ", ".join(f"{k} {v[-1]:.2f}s" for k, v in times.items()), flush=True)
    return {"bytes": nbytes, **{k: median(v) for k, v in times.items()}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=float, default=0.1, help="workload scale: 1.0 is about 2 GB, 0.1 about 200 MB")
    parser.add_argument("--reps", type=int, default=3, help="repetitions per backend (median reported; at least 3)")
    parser.add_argument("--backends", default="gcs,s3", help="comma separated: gcs, s3, local")
    args = parser.parse_args(argv)
    if args.reps < 3:
        parser.error("--reps must be at least 3 (figures are medians)")
    kinds = [k.strip() for k in args.backends.split(",") if k.strip()]
    if not kinds or set(kinds) - {"gcs", "s3", "local"}:
        parser.error("--backends takes gcs, s3, local")
    os.environ.setdefault("SPOTWARP_NO_FORK", "1")

    import numpy as np
    import workload

    print(f"building the workloads at scale {args.scale} ...", flush=True)
    workloads = {
        # BENCH.md's notebook: a model, Adam state, a DataFrame, many small objects: many small requests
        "reference": workload.build(args.scale),
        # one large array (64 MiB chunks): what transfer itself costs, with few requests
        "bulk": {"array": np.random.default_rng(0).random(int(2e9 * args.scale) // 4, dtype=np.float32)},
    }
    rows = []
    with tempfile.TemporaryDirectory(prefix="spotwarp-bench-storage-") as tmp:
        for kind, _server, new_target in _targets(kinds, Path(tmp)):
            for name, ns in workloads.items():
                result = run_backend(kind, new_target, ns, args.reps)
                rows.append((f"{kind} {name}", result))

    mb = 1024 * 1024
    header = ("backend, workload", "bytes", "plain put", "snapshot", "upload ratio", "plain get", "restore", "restore ratio")
    lines = [header]
    for kind, r in rows:
        size = r["bytes"] / mb
        lines.append((
            kind, f"{size:.0f} MB",
            f"{size / r['put']:.0f} MB/s", f"{size / r['snapshot']:.0f} MB/s", f"{r['put'] / r['snapshot']:.2f}x",
            f"{size / r['get']:.0f} MB/s", f"{size / r['restore']:.0f} MB/s", f"{r['get'] / r['restore']:.2f}x",
        ))
    widths = [max(len(row[i]) for row in lines) for i in range(len(header))]
    print()
    print(f"median of {args.reps}; ratio = SpotWarp throughput / plain fsspec throughput on the same bytes")
    for i, row in enumerate(lines):
        print("  ".join(c.ljust(w) for c, w in zip(row, widths)))
        if i == 0:
            print("  ".join("-" * w for w in widths))
    return 0


if __name__ == "__main__":
    sys.exit(main())
