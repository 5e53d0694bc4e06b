"""The workspace at the instant a kernel snapshot is taken, for the files half of that snapshot's manifest.

A kernel snapshot captures memory at one instant (a fork, a staged copy) and writes it afterwards, while the
kernel runs on and keeps writing files: a log appended at every step, a metrics file rewritten, a checkpoint.
`take_cut` runs at the instant, on the kernel's thread, and does only what must happen then: one stat of every
file (an unchanged file costs that stat and nothing more), and the bytes of the small files that changed since
the previous cut (bounded by `HOLD_BYTES`), so a file rewritten right after the instant is stored as it was.
The writer then stores the rest (`backup_workspace(..., cut=...)`): a larger changed file that only grew since
the instant (same inode) is stored up to its size at the instant, which is exactly its content then when it was
appended to; one replaced or shrunk since is stored as it is when read, marked `unstable`.
"""

from __future__ import annotations

import gc
import os
import stat
import time
from dataclasses import dataclass, field
from typing import Any

from .backup import Seen, _same_stat, scan
from .ignore import IgnoreRules

__all__ = ["HOLD_BYTES", "HOLD_FILE_BYTES", "Cut", "take_cut"]

HOLD_BYTES = 4 * 1024 * 1024  # the most bytes of changed files read at the instant, on the kernel's thread
HOLD_FILE_BYTES = 256 * 1024  # a changed file larger than this is read by the writer (append-consistent)


@dataclass
class Cut:
    """Every file's stat at one instant, and the bytes of the small files that changed since the previous cut."""

    root: str
    scanned_at_ns: int
    seen: list[Seen]
    skipped: dict[str, str] = field(default_factory=dict)
    held: dict[str, bytes] = field(default_factory=dict)  # relpath -> its content at the instant
    took_s: float = 0.0
    unread_bytes: int = 0  # bytes of changed files the writer has still to read
    clean: dict[str, dict[str, Any]] = field(default_factory=dict)  # relpath -> its previous entry, stat-clean
    previous_entries: Any = None  # the entries `clean` was found against, and (their id, that record's scan time)
    clean_against: tuple[int, Any] | None = None


def _read_still(seen: Seen) -> bytes | None:
    """The file's bytes if it held still while read (same stat before and after), else None."""
    try:
        fd = os.open(seen.abspath, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0)
                     | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return None
    try:
        before = os.fstat(fd)
        if not stat.S_ISREG(before.st_mode) or not _same_stat(before, seen.st):
            return None
        data = os.pread(fd, before.st_size + 1, 0)
        if len(data) != before.st_size or not _same_stat(os.fstat(fd), before):
            return None
        return data
    except OSError:
        return None
    finally:
        os.close(fd)


def take_cut(root: str, rules: IgnoreRules, previous: dict[str, Any] | None = None,
             hold_bytes: int = HOLD_BYTES, hold_file_bytes: int = HOLD_FILE_BYTES) -> Cut:
    """The workspace `root` now: a stat of every file the rules keep; small files changed since `previous` (a
    manifest's `files` record) read whole, up to `hold_bytes` in all."""
    started = time.perf_counter()
    root = os.path.realpath(root)
    skipped: dict[str, str] = {}
    scanned_at = time.time_ns()
    # unchecked: a malformed previous record only makes a file be read by the writer instead of now (the writer
    # checks the record it reuses entries of), and checking 10,000 entries would lengthen the kernel's pause
    clean: dict[str, dict[str, Any]] = {}
    collecting = gc.isenabled()
    gc.disable()  # a collection of the whole heap, set off by the many small tuples a scan makes, lengthens the pause
    try:
        seen_all = scan(root, rules, skipped, previous if isinstance(previous, dict) else None, clean)
    finally:
        if collecting:
            gc.enable()
    held: dict[str, bytes] = {}
    budget, unread = hold_bytes, 0
    for seen in seen_all if len(clean) < len(seen_all) else ():  # every file stat-clean: nothing to read
        if seen.relpath in clean or not stat.S_ISREG(seen.st.st_mode):
            continue
        size = seen.st.st_size
        if size > hold_file_bytes or size > budget:
            unread += size
            continue
        data = _read_still(seen)
        if data is not None:
            held[seen.relpath] = data
            budget -= len(data)
    entries = previous.get("entries") if isinstance(previous, dict) else None
    return Cut(root, scanned_at, seen_all, skipped, held, time.perf_counter() - started, unread, clean, entries,
               (id(entries), previous.get("scanned_at_ns")) if isinstance(previous, dict) else None)
