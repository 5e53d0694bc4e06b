"""Snapshot upload and restore throughput on object storage, as a ratio to plain fsspec on the same bytes.

Starts gcp-storage-emulator and moto on 127.0.0.1 (as the tests do), builds the reference workload
(benchmarks/workload.py), and for each backend and repetition, in the same run:
  - snapshot: a full SpotWarp snapshot of the workload into a fresh prefix (serialize, hash, upload, commit);
  - put:      plain fsspec writing a blob of the same byte count, the best of one `fs.pipe_file` call and
              64 MiB parts put concurrently (as many in flight as SpotWarp's storage workers);
  - restore:  a fresh engine (a new host) restoring that snapshot into an empty namespace (read, verify, load);
  - get:      plain fsspec reading the blob back, the best of one `fs.cat_file` call, `fs.cat_ranges` over
              64 MiB ranges, and ranged reads from that many threads.
  - put/get of the same objects: plain fsspec moving the snapshot's own object sizes (one `pipe_file` each from
              that many threads; one `cat_ranges` of them, whole, as many in flight): what the object count costs on this
              server, apart from the bytes (an emulator's cost per request dominates many small objects).
Two workloads: the reference notebook (benchmarks/README.md) (many tensors: request latency counts) and one large
array (few 64 MiB objects: bandwidth counts). The ratios are SpotWarp throughput over plain fsspec's best
throughput on the same bytes (1.0 = as fast as the best plain transfer; the goal for a restore is at
most 1.1x its time, a ratio of at least 0.91). The "one call" ratios against a single put/get (the
older reference) follow. Medians of --reps repetitions.

    python benchmarks/bench_storage.py --scale 0.1 --reps 3
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent

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


PART = 64 * 1024 * 1024  # SpotWarp's chunk size: the parallel references move the same pieces


def _timed(fn) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def plain_put(fs, root: str, blob: bytes, workers: int) -> tuple[float, float]:
    """Seconds for one `pipe_file` of `blob`, and for its 64 MiB parts put by `workers` threads."""
    one = _timed(lambda: fs.pipe_file(f"{root}/blob", blob))
    view = memoryview(blob)
    parts = [(f"{root}/parts/{i:06d}", bytes(view[o:o + PART])) for i, o in enumerate(range(0, len(blob), PART))]
    with ThreadPoolExecutor(max_workers=workers) as pool:
        parallel = _timed(lambda: list(pool.map(lambda kv: fs.pipe_file(*kv), parts)))
    return one, parallel


def plain_get(fs, root: str, nbytes: int, workers: int) -> tuple[float, float]:
    """Seconds for one `cat_file` of the blob, and the best parallel read of it (cat_ranges or ranged threads)."""
    path = f"{root}/blob"
    one = _timed(lambda: fs.cat_file(path))
    starts = list(range(0, nbytes, PART))
    ends = [min(s + PART, nbytes) for s in starts]
    ranges = _timed(lambda: fs.cat_ranges([path] * len(starts), starts, ends))
    with ThreadPoolExecutor(max_workers=workers) as pool:
        threads = _timed(lambda: list(pool.map(lambda se: fs.cat_file(path, start=se[0], end=se[1]), zip(starts, ends))))
    return one, min(ranges, threads)


def plain_same_objects(fs, root: str, blob: bytes, sizes: list[int], workers: int) -> tuple[float, float]:
    """Seconds for plain fsspec to put objects of `sizes`, then to read them back, `workers` at a time.

    The reads are one `cat_ranges` call limited to `workers` requests in flight, as SpotWarp's reading
    threads are: the same concurrency, so the object count's cost on the server is all that differs.
    """
    view = memoryview(blob)
    names = [f"{root}/objects/{i:06d}" for i in range(len(sizes))]
    bodies = [bytes(view[:size]) for size in sizes]  # copies made before the clock starts
    with ThreadPoolExecutor(max_workers=workers) as pool:
        put = _timed(lambda: list(pool.map(lambda kv: fs.pipe_file(*kv), zip(names, bodies))))
    kwargs = {"batch_size": workers} if getattr(fs, "async_impl", False) else {}
    get = _timed(lambda: fs.cat_ranges(names, [0] * len(sizes), sizes, **kwargs))
    return put, get


def run_backend(kind: str, new_target, ns: dict, reps: int) -> dict[str, float]:
    """Median seconds of snapshot / put / restore / get on one backend, and the byte count."""
    times: dict[str, list[float]] = {"snapshot": [], "put": [], "restore": [], "get": [], "put_one": [], "get_one": [],
                                     "put_same": [], "get_same": []}
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
        root = f"{target.url.split('://', 1)[-1]}/plain"
        if kind == "local":
            os.makedirs(f"{root}/parts", exist_ok=True)
        workers = engine.store.workers
        one, parallel = plain_put(fs, root, blob, workers)
        times["put_one"].append(one)
        times["put"].append(min(one, parallel))
        one, parallel = plain_get(fs, root, nbytes, workers)
        times["get_one"].append(one)
        times["get"].append(min(one, parallel))
        if kind == "local":
            os.makedirs(f"{root}/objects", exist_ok=True)
        put, get = plain_same_objects(fs, root, blob, list(manifest.objects.values()), workers)
        times["put_same"].append(put)
        times["get_same"].append(get)
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
        # the reference notebook: a model, Adam state, a DataFrame, many small objects: many small requests
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
    header = ("backend, workload", "bytes", "best plain put", "snapshot", "upload ratio", "best plain get", "restore",
              "restore ratio", "one-call ratios up/down", "same-objects ratios up/down")
    lines = [header]
    for kind, r in rows:
        size = r["bytes"] / mb
        lines.append((
            kind, f"{size:.0f} MB",
            f"{size / r['put']:.0f} MB/s", f"{size / r['snapshot']:.0f} MB/s", f"{r['put'] / r['snapshot']:.2f}x",
            f"{size / r['get']:.0f} MB/s", f"{size / r['restore']:.0f} MB/s", f"{r['get'] / r['restore']:.2f}x",
            f"{r['put_one'] / r['snapshot']:.2f}x / {r['get_one'] / r['restore']:.2f}x",
            f"{r['put_same'] / r['snapshot']:.2f}x / {r['get_same'] / r['restore']:.2f}x",
        ))
    widths = [max(len(row[i]) for row in lines) for i in range(len(header))]
    print()
    print(f"median of {args.reps}; ratio = SpotWarp throughput / plain fsspec's best throughput on the same bytes "
          "(one call, or 64 MiB pieces in parallel); one-call ratios: against a single pipe_file / cat_file; "
          "same-objects ratios: against plain fsspec moving the snapshot's own objects")
    for i, row in enumerate(lines):
        print("  ".join(c.ljust(w) for c, w in zip(row, widths)))
        if i == 0:
            print("  ".join("-" * w for w in widths))
    return 0


if __name__ == "__main__":
    sys.exit(main())
