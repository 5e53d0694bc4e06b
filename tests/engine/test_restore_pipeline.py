"""The restore's read pipeline: every byte of a large object checked before anything is bound, memory that is
the restored arrays' own (small pages), and a restore killed midway that leaves the store whole.

The large array spans several 64 MiB objects, each read cold (O_DIRECT where the filesystem has it) in 8 MiB
pieces while one thread populates the destination's pages ahead of the reads.
"""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from spotwarp_jupyter.engine import DamagedObjectError

from engines import UNSIGNED, make_engine
from waiting import wait_for

MIB = 1024 * 1024
BIG = 2 * 64 * MIB + 8 * MIB + 3 * 4096 + 123  # two whole objects, a partial one, a partial page


def _state() -> dict:
    rng = np.random.default_rng(7)
    return {"big": np.frombuffer(rng.bytes(BIG), dtype=np.uint8).copy(), "note": "hello",
            "weights": torch.from_numpy(rng.random((1_000, 2_000)).astype(np.float32))}


def _evict(folder: Path) -> None:
    """Drop the store's objects from the page cache (they were fsync'd, so clean): the reads go to the disk."""
    for path in folder.rglob("*"):
        if path.is_file():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


@pytest.fixture(scope="module")
def snapped(tmp_path_factory) -> tuple[str, dict, list[Path]]:
    """One snapshot of the state for the whole module; its large array's objects, largest first."""
    store = str(tmp_path_factory.mktemp("pipeline") / "store")
    state = _state()
    make_engine(store, key=UNSIGNED, resolved=False).snapshot_kernel(state)
    objects = sorted((p for p in Path(store, "proj", "objects").rglob("*") if p.is_file()),
                     key=lambda p: p.stat().st_size, reverse=True)
    return store, state, objects


def _flip(path: Path, offset: int) -> None:
    os.chmod(path, 0o644)
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0xFF]))
        f.flush()
        os.fsync(f.fileno())


@pytest.mark.parametrize("which,offset", [
    (0, 0), (0, 4095), (0, 4096), (0, 8 * MIB - 1), (0, 8 * MIB), (0, 32 * MIB + 17), (0, 64 * MIB - 1),
    (2, 0), (2, -1),
], ids=["first-byte", "page-end", "page-start", "piece-end", "piece-start", "middle", "last-byte",
        "partial-object-first", "partial-object-last"])
def test_damage_anywhere_in_a_large_object_refuses_the_restore(snapped, which, offset):
    store, _state_, objects = snapped
    victim = objects[which]
    at = offset % victim.stat().st_size
    _flip(victim, at)
    try:
        _evict(Path(store))
        ns = {"note": "keep me"}
        with pytest.raises(DamagedObjectError, match=victim.name):
            make_engine(store, key=UNSIGNED, resolved=False).restore_kernel("latest", ns)
        assert ns == {"note": "keep me"}, "a refused restore bound something"
    finally:
        _flip(victim, at)


def _mapping_flags(address: int) -> tuple[str, int]:
    """The VmFlags and AnonHugePages (kB) of the mapping of this process that holds `address`."""
    inside, flags, huge = False, "", 0
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()[0] if line else ""
        if "-" in head and ":" not in head:
            low, high = (int(x, 16) for x in head.split("-"))
            inside = low <= address < high
        elif inside and line.startswith("AnonHugePages:"):
            huge = int(line.split()[1])
        elif inside and line.startswith("VmFlags:"):
            flags = line.split(":", 1)[1]
    return flags, huge


def test_restored_arrays_own_small_pages_that_outlive_the_pipeline(snapped):
    store, state, _objects = snapped
    _evict(Path(store))
    first: dict = {}
    make_engine(store, key=UNSIGNED, resolved=False).restore_kernel("latest", first)
    big, weights = first.pop("big"), first.pop("weights")
    first.clear()
    second: dict = {}  # a second restore: the pipeline's threads and any memory it freed are used again
    make_engine(store, key=UNSIGNED, resolved=False).restore_kernel("latest", second)
    second["big"][:] = 0
    second["weights"].zero_()
    del second

    assert np.array_equal(big, state["big"]) and torch.equal(weights, state["weights"])
    assert big.flags.writeable and big.flags.c_contiguous
    for address in (big.__array_interface__["data"][0], weights.untyped_storage().data_ptr()):
        flags, huge = _mapping_flags(address)
        assert " nh" in f" {flags}" and huge == 0, f"restored memory may get huge pages: {flags!r}, {huge} kB"
    big[:] = 1
    weights.fill_(2.0)
    assert int(big.sum()) == BIG and float(weights.sum()) == 2.0 * weights.numel()
    assert not np.shares_memory(big, weights.numpy())


CHILD = r"""
import json, sys
from pathlib import Path
from spotwarp_jupyter.engine import Settings, SnapshotEngine
engine = SnapshotEngine(Settings(project="proj", storage=sys.argv[1]), key=b"")
Path(sys.argv[2]).write_text("ready")
ns = {}
engine.restore_kernel("latest", ns)
Path(sys.argv[3]).write_text(json.dumps(sorted(ns)))
"""


def _read_bytes(pid: int) -> int:
    """Bytes the process has read from storage so far (/proc/<pid>/io), 0 once it is gone."""
    try:
        text = Path(f"/proc/{pid}/io").read_text()
    except OSError:
        return 0
    return next(int(line.split()[1]) for line in text.splitlines() if line.startswith("read_bytes:"))


def _tree(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.process
def test_a_restore_killed_midway_leaves_the_store_whole_for_the_next(snapped, tmp_path):
    store, state, _objects = snapped
    before = _tree(Path(store))
    killed_midway = 0
    for attempt in range(5):  # a restore that outran the watcher is tried again: the kill must land midway
        ready, done = tmp_path / f"ready-{attempt}", tmp_path / f"done-{attempt}"
        _evict(Path(store))
        child = subprocess.Popen([sys.executable, "-c", CHILD, store, str(ready), str(done)],
                                 env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
        try:
            wait_for(lambda: ready.exists() or child.poll() is not None, "restoring child", timeout=120)
            wait_for(lambda: _read_bytes(child.pid) >= BIG // 4 or done.exists() or child.poll() is not None,
                     "a restore under way", timeout=120, every=0.002)
            child.send_signal(signal.SIGKILL)
        finally:
            child.wait(timeout=60)
        if not done.exists():
            killed_midway += 1
            break
    assert killed_midway, "every restore ended before the kill"
    assert _tree(Path(store)) == before, "a killed restore changed the store"
    ns: dict = {}
    make_engine(store, key=UNSIGNED, resolved=False).restore_kernel("latest", ns)
    assert sorted(ns) == sorted(state) and np.array_equal(ns["big"], state["big"])
    assert torch.equal(ns["weights"], state["weights"]) and ns["note"] == "hello"
