"""On a local disk a large buffer is stored from its first page boundary on, and restored at the same offset
into a page.

torch and NumPy place an array 64 or 16 bytes past a page, and O_DIRECT takes only page-aligned memory, so
every chunk used to be copied into a staging buffer before its write. The bytes before the first page
boundary now go as a small object of their own; the large chunks start on pages and go to the disk from
where they are. A restore maps the buffer that far before a page, so its large chunks land on pages and are
read straight into place. These tests take real snapshots into a real folder and restore them.
"""

from __future__ import annotations

import json
import mmap
import pickle
from pathlib import Path

import numpy as np
import torch

from spotwarp_jupyter.engine import pages
from spotwarp_jupyter.engine.variables import capture_namespace
from spotwarp_jupyter.engine.variables.save import chunk_views
from spotwarp_jupyter.engine.writers import staged

from engines import UNSIGNED, make_engine

PAGE = pages.PAGE


def _buffers(store: Path) -> list[dict]:
    manifests = sorted((store / "aligned" / "snapshots").rglob("*.json"))
    kernels = json.loads(manifests[-1].read_text())["kernels"]
    return [b for record in kernels.values() for g in record["groups"] for b in g["buffers"]]


def _chunk_sizes(store: Path, nbytes: int) -> list[int]:
    (found,) = [b for b in _buffers(store) if b["size"] == nbytes]
    return [c["size"] for c in found["chunks"]]


def test_a_tensor_past_a_page_is_stored_from_its_page_and_restored_at_the_same_offset(tmp_path: Path) -> None:
    tensor = torch.randn(20_000_000)  # 80 MB: a head, one full chunk and the rest
    array = np.random.default_rng(0).random(3_000_000)  # 24 MB
    offsets = {"tensor": tensor.data_ptr() % PAGE, "array": array.ctypes.data % PAGE}
    assert all(offsets.values()), f"the allocators placed these on pages ({offsets}): nothing here to test"
    store = tmp_path / "store"
    engine = make_engine(store, "aligned", key=UNSIGNED)
    engine.snapshot_kernel({"tensor": tensor, "array": array})

    sizes = _chunk_sizes(store, tensor.nbytes)
    assert sizes[0] == PAGE - offsets["tensor"] and sizes[1] == 64 << 20 and sum(sizes) == tensor.nbytes
    assert _chunk_sizes(store, array.nbytes) == [PAGE - offsets["array"], array.nbytes - (PAGE - offsets["array"])]

    out: dict = {}
    engine.restore_kernel("latest", out)
    assert torch.equal(out["tensor"], tensor) and np.array_equal(out["array"], array)
    assert out["tensor"].data_ptr() % PAGE == offsets["tensor"]  # the large chunks landed on pages
    assert out["array"].ctypes.data % PAGE == offsets["array"]


def test_a_restored_state_is_known_again_and_writes_nothing_large(tmp_path: Path) -> None:
    store = tmp_path / "store"
    engine = make_engine(store, "aligned", key=UNSIGNED)
    engine.snapshot_kernel({"tensor": torch.randn(5_000_000), "n": 1})
    out: dict = {}
    engine.restore_kernel("latest", out)
    again = make_engine(store, "aligned", key=UNSIGNED).snapshot_kernel({"tensor": out["tensor"], "n": 2})
    assert again.stats["bytes_written"] < 100_000, again.stats  # the same chunks, cut at the same places


def test_a_buffer_on_a_page_or_in_an_object_store_is_cut_from_its_start(tmp_path: Path) -> None:
    region = memoryview(mmap.mmap(-1, 3 << 20))  # on a page
    assert [c.nbytes for c in chunk_views(region, page_aligned=True)] == [3 << 20]
    unaligned = memoryview(bytearray(3 << 20))[100:]
    head = (-pages.address(unaligned)) % PAGE
    assert [c.nbytes for c in chunk_views(unaligned, page_aligned=True)] == ([head] if head else []) + [
        unaligned.nbytes - head]
    assert [c.nbytes for c in chunk_views(unaligned, page_aligned=False)] == [unaligned.nbytes]
    small = memoryview(bytearray(100_000))[3:]
    assert [c.nbytes for c in chunk_views(small, page_aligned=True)] == [small.nbytes]  # no head below 1 MiB


def test_a_staged_copy_keeps_its_sources_offset_so_both_are_cut_alike() -> None:
    tensor = torch.randn(2_000_000)
    array = np.arange(1_500_000, dtype=np.int64)
    blob = b"z" * 100_000
    image = capture_namespace({"tensor": tensor, "array": array, "blob": pickle.PickleBuffer(blob)})
    before = {v.nbytes: pages.address(v) for g in image.groups for v in g.pickled.buffers if not v.readonly}
    copied, region = staged.stage(image)
    after = {v.nbytes: pages.address(v) for g in image.groups for v in g.pickled.buffers if not v.readonly}
    assert copied == len(region) and set(before) == set(after) == {tensor.nbytes, array.nbytes}
    for nbytes, source in before.items():
        assert after[nbytes] != source and after[nbytes] % PAGE == source % PAGE


def test_a_range_from_an_offset_into_a_page_is_populated() -> None:
    # a staged copy starts at its source's offset into a page; madvise takes page-aligned addresses only
    region = mmap.mmap(-1, 4 * PAGE)
    start = pages.address(memoryview(region))
    assert pages.populate_range(start + 100, 2 * PAGE)
