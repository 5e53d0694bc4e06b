"""The snapshot engine on its own: grouping, aliases, incremental writes, gc, memory:// storage."""

from __future__ import annotations

import numpy as np
import pytest

from spotwarp_jupyter.engine import CaptureOptions, SnapshotNotFound, SpotWarpError
from spotwarp_jupyter.engine.variables.grouping import shared_groups

from engines import make_engine


def test_groups_join_variables_that_share_objects():
    shared = [1, 2]
    arr = np.zeros(3)
    f = lambda: 0  # noqa: E731
    groups = shared_groups({"a": shared, "b": shared, "c": {"x": shared}, "d": arr, "e": [arr],
                            "f": f, "g": f, "h": "text", "i": 5, "j": 5})
    assert sorted(map(sorted, groups)) == [["a", "b", "c"], ["d", "e"], ["f", "g"], ["h"], ["i"], ["j"]]


def test_cycles_and_self_references_terminate():
    loop: list = []
    loop.append(loop)
    assert shared_groups({"loop": loop, "other": [loop]}) == [["loop", "other"]]


@pytest.mark.parametrize("url", ["local", "memory://bucket/spotwarp-tests"])
def test_round_trip_on_any_fsspec_filesystem(url, store_url):
    engine = make_engine(store_url if url == "local" else url, resolved=False)
    a = np.arange(10.0)
    ns = {"a": a, "b": a, "d": {"k": [1, 2]}, "s": "text"}
    engine.snapshot_kernel(ns)
    out: dict = {}
    engine.restore_kernel("latest", out)
    assert out["a"] is out["b"] and out["a"].tolist() == a.tolist()
    assert out["d"] == {"k": [1, 2]} and out["s"] == "text"
    assert out["a"].flags.writeable


def test_unchanged_state_writes_nothing_and_a_change_writes_only_it(store_url):
    engine = make_engine(store_url, resolved=False)
    big = np.random.default_rng(0).random(3_000_000)
    small = np.arange(100)
    ns = {"big": big, "small": small, "cfg": {"lr": 0.1}}
    first = engine.snapshot_kernel(ns)
    assert first.stats["bytes_written"] >= big.nbytes
    second = engine.snapshot_kernel(ns)
    assert second.stats["bytes_written"] == 0
    assert second.objects == first.objects
    ns["small"] = np.arange(200)
    third = engine.snapshot_kernel(ns)
    assert 0 < third.stats["bytes_written"] < 10_000
    assert third.parent == second.id


def test_skipped_variables_are_reported_not_fatal(store_url):
    import socket
    import threading

    engine = make_engine(store_url, resolved=False)
    with socket.socket() as sock:
        ns = {"ok": 1, "gen": (i for i in range(2)), "sock": sock, "inside": [1, (i for i in range(2))],
              "lock": threading.Lock()}
        manifest = engine.snapshot_kernel(ns)
    skipped = manifest.kernels["default"]["skipped"]
    assert set(skipped) == {"gen", "sock", "inside"}
    assert "generator" in skipped["gen"] and "generator" in skipped["inside"]
    assert set(manifest.kernels["default"]["variables"]) == {"ok", "lock"}  # a lock is recreated


def test_policy_exclude_include_and_size_limit(store_url):
    engine = make_engine(store_url, resolved=False)
    ns = {"a": 1, "b": 2, "big": np.zeros(1000), "c": 3}
    options = CaptureOptions(exclude=frozenset({"b"}), max_var_size=4000)
    manifest = engine.snapshot_kernel(ns, options=options)
    record = manifest.kernels["default"]
    assert set(record["variables"]) == {"a", "c"}
    assert record["skipped"]["b"] == "excluded by policy"
    assert "max-var-size" in record["skipped"]["big"]
    only = engine.snapshot_kernel(ns, options=CaptureOptions(include=frozenset({"c"})))
    assert set(only.kernels["default"]["variables"]) == {"c"}


def test_gc_keeps_newest_and_what_they_reference(store_url):
    engine = make_engine(store_url, resolved=False)
    keep_me = np.ones(100_000)
    ids = []
    for i in range(4):
        ids.append(engine.snapshot_kernel({"keep": keep_me, "gen": np.full(50_000, i)}).id)
    report = engine.gc(keep=2, grace_s=0)
    assert report.kept == ids[:1:-1] and sorted(report.dropped) == sorted(ids[:2])
    assert report.objects_deleted >= 2
    for snap in report.kept:
        out: dict = {}
        engine.restore_kernel(snap, out)
        assert out["keep"].tolist() == keep_me.tolist()
    assert engine.verify().ok
    with pytest.raises(SpotWarpError, match="at least 1"):
        engine.gc(keep=0)


def test_gc_leaves_young_unreferenced_objects_for_writers_in_flight(store_url):
    engine = make_engine(store_url, resolved=False)
    engine.snapshot_kernel({"x": np.arange(10)})
    orphan, _ = engine.store.put_object(b"an object a writer has not committed yet")
    engine.gc(keep=1)  # default grace period
    assert engine.store.has_object(orphan)


def test_ids_latest_and_prefixes(store_url):
    engine = make_engine(store_url, resolved=False)
    with pytest.raises(SnapshotNotFound, match="no snapshot"):
        engine.get("latest")
    first = engine.snapshot_kernel({"x": 1})
    second = engine.snapshot_kernel({"x": 2})
    assert engine.get("latest").id == second.id
    assert engine.get(first.id[:5]).id == first.id
    for bad in ("zzzzzzzz", "../../etc", "a" * 100, "x y"):
        with pytest.raises(SnapshotNotFound):
            engine.get(bad)
    out: dict = {}
    with pytest.raises(SpotWarpError, match="not in this snapshot: nope"):
        engine.restore_kernel("latest", out, variables=["nope"])
    assert out == {}
