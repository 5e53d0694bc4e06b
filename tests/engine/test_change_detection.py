"""A snapshot knows unchanged large buffers by a fast digest this process computed, not by blake3 again.

blake3 names every stored object; a chunk this process already hashed and stored is known again by its
xxh3 digest and length and named by the same object id, with no blake3 pass and no write. The digests come
only from this process and the forked writers it started, never from a store. Real snapshots into a real
folder; blake3 passes are counted by hashing.blake3_passes.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from spotwarp_jupyter.engine import hashing
from spotwarp_jupyter.engine.writers.background import start_background

from engines import UNSIGNED, make_engine

BIG = 3_000_000  # float64: 24 MB, one chunk


def _chunk_ids(manifest) -> list[str]:
    record = manifest.kernels["default"]
    return [c["id"] for g in record["groups"] for b in g["buffers"] for c in b["chunks"]]


def _blake3_bytes(run) -> tuple[int, object]:
    before = hashing.blake3_passes.nbytes
    result = run()
    return hashing.blake3_passes.nbytes - before, result


def test_an_unchanged_large_buffer_is_named_again_without_a_blake3_pass(tmp_path: Path) -> None:
    engine = make_engine(tmp_path / "store", "detect", key=UNSIGNED)
    ns = {"big": np.random.default_rng(1).random(BIG), "small": [1, 2, 3]}
    hashed_first, first = _blake3_bytes(lambda: engine.snapshot_kernel(ns))
    assert hashed_first >= ns["big"].nbytes
    hashed_again, again = _blake3_bytes(lambda: engine.snapshot_kernel(ns))
    assert hashed_again < 1 << 20, hashed_again  # the pickle streams only
    assert _chunk_ids(again) == _chunk_ids(first)
    assert again.stats["bytes_written"] < 1 << 20
    restored: dict = {}
    engine.restore_kernel("latest", restored)
    assert np.array_equal(restored["big"], ns["big"])


def test_a_buffer_changed_in_one_byte_is_hashed_stored_and_restored(tmp_path: Path) -> None:
    engine = make_engine(tmp_path / "store", "detect", key=UNSIGNED)
    ns = {"big": np.random.default_rng(2).random(BIG)}
    first = engine.snapshot_kernel(ns)
    ns["big"].view(np.uint8)[12_345_678] ^= 0x01
    hashed, changed = _blake3_bytes(lambda: engine.snapshot_kernel(ns))
    assert hashed >= ns["big"].nbytes
    assert _chunk_ids(changed) != _chunk_ids(first)
    assert changed.stats["bytes_written"] >= ns["big"].nbytes - 4096  # all but a page-aligning head piece
    restored: dict = {}
    engine.restore_kernel("latest", restored)
    assert restored["big"].view(np.uint8)[12_345_678] == ns["big"].view(np.uint8)[12_345_678]
    assert np.array_equal(restored["big"], ns["big"])


_OTHER_PROCESS = """
import sys
import numpy as np
from spotwarp_jupyter.engine import Settings, SnapshotEngine
engine = SnapshotEngine(Settings.resolve(project="detect", storage=sys.argv[1], env={}), key=b"")
engine.snapshot_kernel({"big": np.random.default_rng(3).random(%d)})
""" % BIG


@pytest.mark.process
def test_no_digest_comes_from_the_store(tmp_path: Path) -> None:
    """Another process stored the buffer, then its object's bytes were replaced by a writer without the key
    with this kernel's bytes (one byte off): this process hashes its buffer with blake3 and stores it anew."""
    store = tmp_path / "store"
    subprocess.run([sys.executable, "-c", textwrap.dedent(_OTHER_PROCESS), str(store)], check=True, timeout=120)
    engine = make_engine(store, "detect", key=UNSIGNED)
    stored = _chunk_ids(engine.get("latest"))
    chunks = engine.get("latest").kernels["default"]["groups"][0]["buffers"][0]["chunks"]
    head = sum(c["size"] for c in chunks[:-1])  # a page-aligning head piece, if any, then the one large chunk
    ns = {"big": np.random.default_rng(3).random(BIG)}
    ns["big"].view(np.uint8)[1_000_000] ^= 0x80
    forged = Path(engine.store.object_path(chunks[-1]["id"]))
    forged.chmod(0o644)
    forged.write_bytes(ns["big"].tobytes()[head:])
    hashed, manifest = _blake3_bytes(lambda: engine.snapshot_kernel(ns))
    assert hashed >= ns["big"].nbytes
    assert _chunk_ids(manifest) != stored
    restored: dict = {}
    engine.restore_kernel("latest", restored)
    assert np.array_equal(restored["big"], ns["big"])


@pytest.mark.process
def test_a_forked_writer_hands_its_digests_back_to_the_kernel(tmp_path: Path) -> None:
    engine = make_engine(tmp_path / "store", "detect", key=UNSIGNED)
    ns = {"big": np.random.default_rng(4).random(BIG)}
    job = start_background(lambda image, on_written: engine.commit_image(image, on_written=on_written),
                           ns, None, None, dict)
    result = job.wait(120)
    assert result is not None and result.ok, result
    hashed, again = _blake3_bytes(lambda: engine.snapshot_kernel(ns))
    assert hashed < 1 << 20, hashed
    assert _chunk_ids(again) == _chunk_ids(engine.get(result.snapshot_id))
