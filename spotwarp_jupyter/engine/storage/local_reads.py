"""Reading a local object straight into its destination, hashed piece by piece on the way.

An object not in the page cache (a new host, a restore after the snapshot's O_DIRECT writes) is read
with O_DIRECT into the destination itself when that is page-aligned: the disk's DMA fills the final
memory, with no copy out of the page cache and no page cache to fill and evict. Helper threads (one set
for the process, started once) keep an object's next pieces in flight while the reading thread hashes the
pieces already in, in order; an object of one piece is read by the reading thread itself, with nothing to
overlap. The last partial block comes with the last piece, into a scratch page. An object the page cache
mostly holds (asked of the kernel with mincore, which reads nothing) is copied from there, which is faster
than the disk; so is anything O_DIRECT refuses.
Either way a size or hash that differs is refused before the caller uses any byte.
SPOTWARP_DIRECT_READS=0 reads everything through the page cache.

A fresh destination's pages: a restore queues their population on one thread ahead of the reads
(pages.populate_ahead), so an O_DIRECT read finds them in and the disk does not idle while a read faults
its 8 MiB in; a read that starts before its pages' population faults them in itself. A read through the page cache
copies into the destination page by page, and a fault per page costs more than the copy, so those pages
are populated first in one call.
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
import threading
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any, Callable

from .. import pages
from ..errors import DamagedObjectError
from ..hashing import object_hasher
from ..settings import env_int
from ..timings import phase

# Pieces read (and then hashed) one at a time; several objects are read by as many threads at once.
READ_PIECE = 8 * 1024 * 1024
# Pieces of one object being read at once, while the reading thread hashes the pieces already in.
IN_FLIGHT = 2
# Helper threads reading pieces for the whole process: IN_FLIGHT for each of a restore's reading threads
# (load.read_pool). A piece waits for nothing but its disk, so readers sharing them never deadlock.
HELPERS = 4 * IN_FLIGHT
# Objects from this size up are read with O_DIRECT when cold and their destination is aligned.
DIRECT_MIN = 4 * 1024 * 1024
# A destination the CPU copies into (from the page cache, or an object store's bytes) gets its pages
# populated in one call first from this size up.
POPULATE_MIN = 1024 * 1024
_O_DIRECT = getattr(os, "O_DIRECT", 0)


def read_local_checked(oid: str, path: str, target: memoryview) -> None:
    """Fill `target` with the object at `path`; DamagedObjectError unless its size and blake3 hash match `oid`."""
    hasher = object_hasher()
    with open(path, "rb", buffering=0) as f:
        fd = f.fileno()
        if os.fstat(fd).st_size != target.nbytes:
            raise DamagedObjectError(oid, f"size differs from the manifest ({target.nbytes} bytes expected)")
        done = _read_direct(path, target, hasher) if _direct_worth_it(fd, target) else 0
        populate_for_copy(target[done:])
        got = done + _read_buffered(fd, target, done, hasher)
        extra = os.pread(fd, 1, got) if got == target.nbytes else b""
    if got != target.nbytes or extra:
        raise DamagedObjectError(oid, f"size differs from the manifest ({target.nbytes} bytes expected)")
    if hasher.hexdigest() != oid:
        raise DamagedObjectError(oid, "content does not match its hash")


def populate_for_copy(target: memoryview) -> None:
    """Fault in, in one call, the pages of a destination whose every byte the CPU is about to copy in (from
    POPULATE_MIN up): a fault per page costs more than the copy. An O_DIRECT read needs none of this."""
    if target.nbytes >= POPULATE_MIN:
        with phase("populate", target.nbytes):
            pages.populate_view(target)


def _direct_worth_it(fd: int, target: memoryview) -> bool:
    """O_DIRECT when the object is large, the destination aligned and most of the file not in the page cache."""
    if not _O_DIRECT or target.nbytes < DIRECT_MIN or (pages.address(target) or 1) % pages.PAGE:
        return False
    if not env_int("SPOTWARP_DIRECT_READS", 1, 0):  # 0: always through the page cache
        return False
    cached = _cached_fraction(fd, target.nbytes)
    return cached is None or cached < 0.5  # a filesystem that cannot tell: assume a cold cache, as a new host has


def _load_libc():
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                              ctypes.c_long]
        libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
        return libc
    except (OSError, AttributeError):
        return None


_libc = _load_libc() if _O_DIRECT else None


def _cached_fraction(fd: int, size: int) -> float | None:
    """The share of the file's pages the page cache holds (mapped, never read: no I/O); None if unknown."""
    if _libc is None:
        return None
    address = _libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
    if address in (None, ctypes.c_void_p(-1).value):
        return None
    try:
        count = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
        vec = ctypes.create_string_buffer(count)
        if _libc.mincore(address, size, vec) != 0:
            return None
        return vec.raw.count(b"\x01") / count if count else 1.0
    finally:
        _libc.munmap(address, size)


_helpers: ThreadPoolExecutor | None = None
_helpers_lock = threading.Lock()


def _forget_helpers() -> None:
    """A forked child has none of its parent's threads: it starts its own helpers when it needs them (and
    its own lock: a parent thread may have held this one at the fork)."""
    global _helpers, _helpers_lock
    _helpers = None
    _helpers_lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_helpers)


def _helper_pool() -> ThreadPoolExecutor:
    """The process's helper threads: started once, not per object (a thread's start waits until it runs,
    milliseconds on two busy cores, and a restore reads hundreds of objects)."""
    global _helpers
    with _helpers_lock:
        if _helpers is None:
            _helpers = ThreadPoolExecutor(max_workers=HELPERS, thread_name_prefix="spotwarp-direct")
        return _helpers


def _run_here(fn: Callable[..., Any], *args: Any) -> Future:
    """Run `fn` on this thread; its outcome as a finished future (the shape a pool's submit returns)."""
    done: Future = Future()
    try:
        done.set_result(fn(*args))
    except BaseException as exc:  # noqa: BLE001 - handed to the caller through the future
        done.set_exception(exc)
    return done


def _read_direct(path: str, target: memoryview, hasher) -> int:
    """Read the object into `target` with O_DIRECT, IN_FLIGHT pieces at a time, hashing each in order as it
    lands; how many bytes it read (0 if refused: the rest, if any, goes through the page cache).

    Helper threads read the pieces of an object of several, so the disk always has its next pieces to read
    while this thread hashes the last one; each read faults in its own piece's pages. The last partial
    block rides along with the last piece into a scratch page (one request, no separate small read queued
    behind the large ones) and is copied into place.
    """
    whole = target.nbytes // pages.PAGE * pages.PAGE
    try:
        fd = os.open(path, os.O_RDONLY | _O_DIRECT)
    except OSError:
        return 0  # a filesystem without O_DIRECT (tmpfs before 6.6, some overlays): read through the cache
    scratch = mmap.mmap(-1, pages.PAGE) if target.nbytes > whole else None
    submit = _helper_pool().submit if whole > READ_PIECE else _run_here
    try:
        got = _read_pieces(fd, target, whole, scratch, submit, hasher)
    finally:
        os.close(fd)  # _read_pieces has waited for its reads: none is left on this descriptor
        if scratch is not None:
            scratch.close()
    return got


def _read_pieces(fd: int, target: memoryview, whole: int, scratch: mmap.mmap | None,
                 submit: Callable[..., Future], hasher) -> int:
    """`_read_direct`'s loop: queue IN_FLIGHT pieces, hash each in order as it lands and queue the next; the
    bytes read and hashed. It returns (or raises) only once no read it queued is left running: the helper
    threads outlive it, and a read still running would land in `target` or `scratch` after the caller is done."""
    starts = iter(range(0, whole, READ_PIECE))
    queued: deque[tuple[int, int, Future]] = deque()
    got = 0

    def queue_next() -> None:
        start = next(starts, None)
        if start is not None:
            end = min(start + READ_PIECE, whole)
            tail = scratch if end == whole else None
            queued.append((start, end, submit(_read_piece, fd, target, start, end, tail)))

    try:
        for _ in range(IN_FLIGHT):
            queue_next()
        while queued:
            start, end, future = queued.popleft()
            n = future.result()
            if start != got or n <= 0:
                break
            queue_next()
            landed = min(n, target.nbytes - start)
            if landed > end - start:  # the tail, read into the scratch page
                target[end:start + landed] = scratch[:landed - (end - start)]
            with phase("hash", landed):
                hasher.update(target[start:start + landed])
            got = start + landed
            if landed < end - start:
                break  # short (the file is shorter than its size said): the rest through the cache
    finally:
        left = [future for _start, _end, future in queued]
        for future in left:
            future.cancel()
        wait(left)
    return got


def _read_piece(fd: int, target: memoryview, start: int, end: int, tail: mmap.mmap | None) -> int:
    """Read target[start:end] (and the tail into `tail`) with O_DIRECT; bytes read, 0 if refused."""
    buffers = [target[start:end]] + ([memoryview(tail)] if tail is not None else [])
    try:
        with phase("read", end - start):
            return os.preadv(fd, buffers, start)
    except OSError as exc:
        if exc.errno != errno.EINVAL:
            raise
        return 0  # refused after all


def _read_buffered(fd: int, target: memoryview, start: int, hasher) -> int:
    """Read `target[start:]` through the page cache; how many bytes it read (short when the file is)."""
    got = start
    while got < target.nbytes:
        piece = target[got:got + READ_PIECE]
        with phase("read", piece.nbytes):
            n = os.preadv(fd, [piece], got)
        if n <= 0:
            break
        with phase("hash", n):
            hasher.update(piece[:n])
        got += n
    return got - start
