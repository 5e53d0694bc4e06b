"""Where a snapshot's seconds go: its phases are gathered while asked, and only then.

`bench_scaling.py --breakdown` splits a full snapshot into serialize, hash, write and fsync;
these tests take real snapshots of arrays into a real folder and read the phases they report.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from spotwarp_jupyter.engine import timings

from engines import UNSIGNED, make_engine


def test_a_full_snapshot_reports_each_phase_with_its_bytes(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    ns = {"big": rng.random(3_000_000), "small": rng.random(10), "n": 1}  # 24 MB: one chunk, written direct
    with timings.collecting() as phases:
        manifest = make_engine(tmp_path / "store", "phases", key=UNSIGNED).snapshot_kernel(ns)
    got = phases.as_dict()
    assert {"serialize", "hash", "write", "fsync"} <= set(got)
    written = manifest.stats["bytes_written"]
    for name in ("hash", "write"):  # every new object's bytes, each counted once
        assert got[name]["bytes"] == written, (name, got[name], written)
    assert got["write"]["wall_s"] > 0 and got["serialize"]["cpu_s"] >= 0


def test_nothing_is_gathered_unless_asked(tmp_path: Path) -> None:
    engine = make_engine(tmp_path / "store", "phases", key=UNSIGNED)
    with timings.collecting() as asked:
        pass
    engine.snapshot_kernel({"a": np.arange(1_000_000)})
    assert asked.as_dict() == {}


def test_an_unchanged_snapshot_writes_nothing_large_and_reads_each_byte_once(tmp_path: Path) -> None:
    engine = make_engine(tmp_path / "store", "phases", key=UNSIGNED)
    ns = {"big": np.random.default_rng(1).random(2_000_000)}
    engine.snapshot_kernel(ns)
    with timings.collecting() as phases:
        manifest = engine.snapshot_kernel(ns)
    got = phases.as_dict()
    assert got.get("write", {}).get("bytes", 0) < ns["big"].nbytes // 100
    # a large chunk stored before is known by its change-detection digest alone; the rest by the blake3 that names it
    assert got["detect"]["bytes"] >= ns["big"].nbytes - 4096
    assert got["hash"]["bytes"] + got["detect"]["bytes"] == manifest.stats["bytes_total"]
