"""Populating and freeing large anonymous buffers through libc, without holding the GIL.

Python's own `mmap.mmap(..., MAP_POPULATE)` and `mmap.madvise` keep the GIL while the kernel clears and
maps hundreds of megabytes (0.5 s for 800 MB on a loaded 2-core machine), stalling the thread that
unpickles the groups already read; a call through ctypes lets the GIL go for its length.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import sys
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable

PAGE = 4096  # the alignment O_DIRECT asks of memory and file offsets on every Linux filesystem we write to
MADV_POPULATE_WRITE = 23  # Linux 5.14: fault a range in, writable, in one call
MADV_FREE = 8  # Linux 4.5: the host may take the pages back when short of memory; a write first keeps them
MADV_DONTNEED = 4  # the pages go at once; this process's next touch gets fresh ones
MADV_NOHUGEPAGE = 15  # no transparent huge pages for this range
# Pieces a destination is populated in ahead of its reads: as small as a read, so the first reads of a
# restore find their pages in after one piece's population, not a whole buffer's.
POPULATE_PIECE = 8 * 1024 * 1024


def _load_libc() -> Any:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        return libc
    except (OSError, AttributeError):
        return None


_libc = _load_libc()


def address(view: memoryview | mmap.mmap) -> int | None:
    """Where a writable buffer's memory starts (None for a read-only or empty one)."""
    if isinstance(view, memoryview) and (view.readonly or view.nbytes == 0):
        return None
    try:
        return ctypes.addressof(ctypes.c_char.from_buffer(view))
    except (TypeError, ValueError):
        return None


def populate(buf: mmap.mmap) -> bool:
    """Fault every page of an anonymous map in, writable, in one call; False where the kernel cannot (before 5.14)."""
    start = address(buf) if _libc is not None and len(buf) else None
    return start is not None and populate_range(start, len(buf))


def populate_view(view: memoryview) -> bool:
    """`populate` for a writable view into a map (one chunk of a restored buffer); False where it cannot."""
    start = address(view) if _libc is not None else None
    return start is not None and populate_range(start, view.nbytes)


def populate_range(address: int, nbytes: int) -> bool:
    """`populate` for part of a map, by address (pieces of one map are faulted in by several threads), from
    the start of the page holding `address` (madvise takes page-aligned addresses only)."""
    if _libc is None or nbytes <= 0:
        return False
    start = address - address % mmap.PAGESIZE
    return _libc.madvise(start, nbytes + address - start, MADV_POPULATE_WRITE) == 0


def free_range(address: int, nbytes: int) -> bool:
    """Mark the whole pages inside a range free: the host takes them back only when it needs memory, and
    until then writing them again costs no page fault (`populate_range` over them is nearly free)."""
    return _advise_whole_pages(address, nbytes, MADV_FREE)


def drop_range(address: int, nbytes: int) -> bool:
    """Give the whole pages inside a range back at once (in a forked child: its copy-on-write share of them)."""
    return _advise_whole_pages(address, nbytes, MADV_DONTNEED)


def _advise_whole_pages(address: int, nbytes: int, advice: int) -> bool:
    page = mmap.PAGESIZE
    start = (address + page - 1) // page * page
    end = (address + nbytes) // page * page
    if _libc is None or end <= start:
        return False
    return _libc.madvise(start, end - start, advice) == 0


def no_huge_pages(buf: mmap.mmap) -> None:
    """Ask for small pages only for an anonymous map: on a VM a huge page may come from memory the host
    took back, and a restore's destination faulted in with them ran 2-7x slower than with 4 KiB pages."""
    try:
        buf.madvise(MADV_NOHUGEPAGE)
    except (AttributeError, OSError, ValueError):
        pass  # a platform without the advice: its default pages


_populator: ThreadPoolExecutor | None = None
_populator_lock = threading.Lock()


def _forget_populator() -> None:
    """A forked child has none of its parent's threads: it starts its own populator when it needs one."""
    global _populator
    _populator = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_populator)


def populate_ahead(view: memoryview, fill: Callable[[memoryview], object] | None = None) -> list[Future]:
    """Queue the population of a fresh destination's pages, in POPULATE_PIECE pieces, on one thread shared
    by the process; returns at once.

    Readers filling the destination then find its pages in and never fault (an O_DIRECT read faults its
    pages before its I/O starts, leaving the disk idle meanwhile). One thread, in the order asked, so the
    pages come in the order the reads are queued; a caller cancels the pieces its reads reach first. Each queued piece holds its view, so the memory stays mapped until its piece is done or cancelled.
    `fill` populates one piece (populate_view, or a caller's wrapper that times it).
    """
    if _libc is None or view.readonly or view.nbytes == 0:
        return []
    global _populator
    with _populator_lock:
        if _populator is None:
            _populator = ThreadPoolExecutor(max_workers=1, thread_name_prefix="spotwarp-populate")
        pool = _populator
    fill = fill or populate_view
    return [pool.submit(fill, view[i:i + POPULATE_PIECE]) for i in range(0, view.nbytes, POPULATE_PIECE)]
