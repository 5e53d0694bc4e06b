"""Reading one workspace file into chunks while it may change: opened safely, re-read until it holds still."""

from __future__ import annotations

import os
import stat
from typing import Any, Callable

from .workspace_chunks import Uploads
from .workspace_scan import Seen

READ_ATTEMPTS = 3


class NotRegularFile(OSError):
    """The path names a pipe, socket or device now, not the regular file the scan saw."""


def _read_exactly(f, n: int) -> bytes:
    """Up to `n` bytes, fewer only at end of file (a short read is not EOF on every filesystem)."""
    parts = []
    while n > 0:
        data = f.read(n)
        if not data:
            break
        parts.append(data)
        n -= len(data)
    return parts[0] if len(parts) == 1 else b"".join(parts)


def _same_stat(a: os.stat_result, b: os.stat_result) -> bool:
    return (a.st_size, a.st_mtime_ns, a.st_ino) == (b.st_size, b.st_mtime_ns, b.st_ino)


def read_file(seen: Seen, uploads: Uploads, chunk_size: int,
               on_chunk: Callable[[int], None]) -> tuple[list[dict[str, Any]], os.stat_result, bool]:
    """Chunk refs of the file's content, its stat, and whether it held still while read."""
    st = seen.st
    chunks: list[dict[str, Any]] = []
    for _attempt in range(READ_ATTEMPTS):
        chunks = []
        # O_NONBLOCK: a pipe put in the file's place since the scan must not hold the backup (and its lock) forever
        fd = os.open(seen.abspath, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
        try:
            before = os.fstat(fd)
            if not stat.S_ISREG(before.st_mode):
                raise NotRegularFile(seen.relpath)
            os.set_blocking(fd, True)
            with os.fdopen(fd, "rb", buffering=0, closefd=False) as f:
                offset = 0
                while True:
                    # one byte past the expected end, so growth since the stat shows up
                    want = min(chunk_size, max(before.st_size - offset, 0) + 1)
                    data = _read_exactly(f, want)
                    if not data:
                        break
                    offset += len(data)
                    uploads.stats.bytes_read += len(data)
                    chunks.append(uploads.add(data))
                    on_chunk(len(data))
                    if len(data) < chunk_size:
                        break
            after = os.fstat(fd)
        finally:
            os.close(fd)
        try:
            on_disk = os.stat(seen.abspath, follow_symlinks=False)
        except FileNotFoundError:
            on_disk = after
        total = sum(c["size"] for c in chunks)
        if _same_stat(before, after) and _same_stat(after, on_disk) and total == after.st_size:
            return chunks, after, True
        st = after
    return chunks, st, False
