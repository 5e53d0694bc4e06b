"""Reading large objects from a local store straight into restore's buffers, every byte checked.

Whether the object comes from the disk or the page cache, and wherever the damage is (first page,
middle, last piece, tail), a damaged, shortened or lengthened object is refused.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import Future
from pathlib import Path

import pytest

from spotwarp_jupyter.engine import DamagedObjectError
from spotwarp_jupyter.engine.pages import POPULATE_PIECE
from spotwarp_jupyter.engine.storage.local_reads import _cached_fraction
from spotwarp_jupyter.engine.storage.store import Store
from spotwarp_jupyter.engine.variables.load import _allocate, _pieces_mostly_in

SIZE = 24 * 1024 * 1024 + 1234  # several read pieces and a partial one


def _evict(path: Path) -> None:
    """Drop the file's pages from the page cache (it was fsync'd when stored, so they are clean)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


@pytest.fixture
def stored(store_url: str) -> tuple[Store, str, bytes, Path]:
    store = Store(store_url, "proj")
    data = os.urandom(SIZE)
    oid, _size = store.put_object(data)
    return store, oid, data, Path(store.object_path(oid))


def _read(store: Store, oid: str, size: int = SIZE) -> bytes:
    target = _allocate(size)
    store.read_object_into(oid, memoryview(target))
    return bytes(target)


@pytest.mark.parametrize("cold", [True, False], ids=["cold", "cached"])
def test_large_object_reads_back_whole(stored, cold):
    store, oid, data, path = stored
    if cold:
        _evict(path)
    else:
        path.read_bytes()
    assert _read(store, oid) == data


def _skip_without_direct_io(path: Path) -> None:
    try:
        os.close(os.open(path, os.O_RDONLY | os.O_DIRECT))
    except OSError:
        pytest.skip("this filesystem has no O_DIRECT")


def test_a_cold_object_is_read_past_the_page_cache(stored):
    store, oid, data, path = stored
    _skip_without_direct_io(path)
    _evict(path)
    assert _read(store, oid) == data
    fd = os.open(path, os.O_RDONLY)
    try:  # the disk filled the destination itself: no copy of the object was left in the page cache
        assert _cached_fraction(fd, SIZE) < 0.05
        path.read_bytes()
        assert _cached_fraction(fd, SIZE) > 0.95  # (which the measure does see)
    finally:
        os.close(fd)


def test_unaligned_buffer_reads_back_whole(stored):
    store, oid, data, path = stored
    _evict(path)
    backing = bytearray(SIZE + 1)
    store.read_object_into(oid, memoryview(backing)[1:])
    assert bytes(backing[1:]) == data


@pytest.mark.parametrize("cold", [True, False], ids=["cold", "cached"])
@pytest.mark.parametrize("damage", ["first-page", "middle", "last-aligned-byte", "tail", "shortened-to-aligned",
                                    "shortened-by-one", "lengthened-by-one", "lengthened-by-a-page"])
def test_damaged_large_object_is_refused(stored, cold, damage):
    store, oid, data, path = stored
    body = bytearray(data)
    aligned = SIZE - SIZE % 4096
    if damage == "first-page":
        body[100] ^= 0xFF
    elif damage == "middle":
        body[SIZE // 2] ^= 0xFF
    elif damage == "last-aligned-byte":
        body[aligned - 1] ^= 0xFF
    elif damage == "tail":
        body[-1] ^= 0xFF
    elif damage == "shortened-to-aligned":
        del body[aligned:]
    elif damage == "shortened-by-one":
        del body[-1:]
    elif damage == "lengthened-by-one":
        body += b"\0"
    else:
        body += os.urandom(4096)
    os.chmod(path, 0o644)
    with open(path, "wb") as f:
        f.write(body)
        f.flush()
        os.fsync(f.fileno())
    if cold:
        _evict(path)
    else:
        path.read_bytes()
    with pytest.raises(DamagedObjectError):
        _read(store, oid)


def _resident_bytes(buf) -> int:
    """Bytes of `buf` (a map) whose pages are in memory (mincore)."""
    import ctypes
    import mmap

    libc = ctypes.CDLL(None, use_errno=True)
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
    count = (len(buf) + mmap.PAGESIZE - 1) // mmap.PAGESIZE
    vec = ctypes.create_string_buffer(count)
    assert libc.mincore(ctypes.addressof(ctypes.c_char.from_buffer(buf)), len(buf), vec) == 0
    return sum(b & 1 for b in vec.raw) * mmap.PAGESIZE


def test_restore_buffers_are_populated_chunk_by_chunk_by_the_reads(stored):
    store, oid, data, path = stored
    _evict(path)
    size = 3 * 64 * 1024 * 1024
    buf = _allocate(size)
    # memory is taken as the reads reach it (peak memory follows the restore), not all at allocation
    assert _resident_bytes(buf) < size // 2
    chunk = memoryview(buf)[64 * 1024 * 1024:64 * 1024 * 1024 + SIZE]
    store.read_object_into(oid, chunk)
    assert bytes(chunk) == data
    assert SIZE <= _resident_bytes(buf) < size // 2


def _helpers() -> set[int]:
    return {t.ident for t in threading.enumerate() if t.name.startswith("spotwarp-direct")}


def test_cold_reads_share_helper_threads_started_once(stored):
    store, oid, data, path = stored
    _skip_without_direct_io(path)
    _evict(path)
    assert _read(store, oid) == data
    first = _helpers()
    _evict(path)
    assert _read(store, oid) == data
    # the helpers outlive each object's read, and the next object's pieces go to the same threads
    assert first and _helpers() == first


def test_a_chunk_read_drops_only_the_population_of_pages_it_mostly_fills():
    size = 2 * POPULATE_PIECE + 4096
    pieces = [Future() for _ in range(3)]
    head = 4032  # the bytes before the buffer's first page, stored as a chunk of their own
    assert _pieces_mostly_in(pieces, size, 0, head) == []
    assert _pieces_mostly_in(pieces, size, head, size - head) == pieces
    assert _pieces_mostly_in(pieces, size, head, POPULATE_PIECE) == pieces[:1]
