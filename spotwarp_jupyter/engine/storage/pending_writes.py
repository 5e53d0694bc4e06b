"""A batch of local files made durable together: one pass of syncs before a commit, not two per file."""

from __future__ import annotations

import ctypes
import errno
import fcntl
import mmap
import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from ..hashing import Buffer
from ..pages import PAGE, address
from ..timings import phase
from .local_files import fsync_folder, temporary_name, unlink_quietly


def _fdatasync(fd: int) -> None:
    """A file's data durable (and what is needed to read it back); fsync where there is no fdatasync."""
    getattr(os, "fdatasync", os.fsync)(fd)


_SYNC_FILE_RANGE_WRITE = 2


def _writeback_starter():
    """sync_file_range(fd, 0, 0, SYNC_FILE_RANGE_WRITE) where Linux has it: start a file's writeback, not wait for it."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return fn


_start_writeback = _writeback_starter()

# Files from this size up bypass the page cache (O_DIRECT where the OS has it): the data goes from a small
# aligned staging buffer straight to the disk, which spares the CPU the page cache's copy, its page
# allocation and any reclaim it forces; nothing reads these bytes back soon. Durability is unchanged:
# sync() still fdatasyncs every file before renaming it. A filesystem that refuses gets buffered writes.
DIRECT_MIN = 1024 * 1024
DIRECT_PIECE = 8 * 1024 * 1024  # staging buffer per writer thread (a multiple of any logical block size)
_O_DIRECT = getattr(os, "O_DIRECT", 0)
_staging = threading.local()


def _staging_buffer() -> memoryview:
    """This thread's page-aligned staging buffer for direct writes."""
    buf = getattr(_staging, "buffer", None)
    if buf is None:
        buf = _staging.buffer = memoryview(mmap.mmap(-1, DIRECT_PIECE))
    return buf


# ctypes calls a foreign function with the GIL released; a slice assignment copies holding it
_copy = ctypes.memmove


def _page_aligned(view: memoryview) -> bool:
    """Whether `view` starts on a page (a staged copy does), so O_DIRECT can take it as it is."""
    start = address(view)
    return start is not None and start % PAGE == 0


def _write_all(fd: int, view: memoryview) -> None:
    done = 0
    while done < view.nbytes:
        done += os.write(fd, view[done:])


def _write_direct(fd: int, view: memoryview) -> bool:
    """Write `view` through the staging buffer with O_DIRECT set on `fd`, its unaligned tail buffered.

    False (nothing written, O_DIRECT cleared) when the filesystem refuses direct writes.
    """
    staging = None if _page_aligned(view) else _staging_buffer()  # an aligned view is written from where it is
    aligned = view.nbytes - view.nbytes % PAGE
    source = address(view) if staging is not None else None
    target = address(staging) if staging is not None else None
    done = 0
    try:
        while done < aligned:
            n = min(DIRECT_PIECE, aligned - done)
            if source is not None and target is not None:
                _copy(target, source + done, n)  # without the GIL: other threads (pickling) go on meanwhile
            elif staging is not None:
                staging[:n] = view[done:done + n]
            written = os.write(fd, staging[:n] if staging is not None else view[done:done + n])
            if written != n:  # a short direct write: the rest goes buffered, from where it stopped
                done += written
                break
            done += n
    except OSError as exc:
        if exc.errno != errno.EINVAL or done:
            raise
    fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~_O_DIRECT)
    if done == 0 and aligned:
        return False
    _write_all(fd, view[done:])
    return True


class PendingWrites:
    """Files written now and made durable together by `sync()`: one pass of syncs instead of two per file.

    Each file goes to a temporary beside its name and its writeback starts at once (the disk works while
    the next files are prepared). `sync()` waits for every temporary's data, and only then renames each
    into place and syncs each folder: a file is never under its name before its bytes are durable, and
    once `sync()` returns every name is. Until then nothing is visible; `discard()` removes the temporaries.
    """

    MAX_OPEN = 128  # temporaries held open for the final pass; older ones are synced early beyond that

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open: list[tuple[int, str, str]] = []  # (fd, temporary, final name), not synced yet
        self._synced: list[tuple[str, str]] = []  # (temporary, final name): data durable, not renamed yet
        self._names: set[str] = set()
        self._folders: set[str] = set()  # folders created here: their parents' entries must be synced too
        self.sync_s = 0.0
        self.direct = bool(_O_DIRECT)  # large files bypass the page cache until a filesystem refuses

    def __len__(self) -> int:
        return len(self._names)

    def write(self, path: str, data: Buffer) -> None:
        """Write `data` to a temporary for `path` (once per name); it gets its name in `sync()`."""
        with self._lock:
            if path in self._names:
                return
            self._names.add(path)
        directory = os.path.dirname(path)
        if not os.path.isdir(directory):
            created = []
            missing = directory
            while missing and not os.path.isdir(missing):
                created.append(missing)
                missing = os.path.dirname(missing)
            os.makedirs(directory, exist_ok=True)
            with self._lock:
                self._folders.update(created)
        tmp = temporary_name(path)
        view = memoryview(data).cast("B")
        direct = _O_DIRECT if view.nbytes >= DIRECT_MIN and self.direct else 0
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
        try:
            fd = os.open(tmp, flags | direct, 0o666)
        except OSError as exc:
            if not direct or exc.errno != errno.EINVAL:
                raise
            self.direct, direct = False, 0  # this filesystem has no direct I/O: buffered from now on
            unlink_quietly(tmp)  # some kernels create the file before refusing the flag
            fd = os.open(tmp, flags, 0o666)
        try:
            if not direct:
                _write_all(fd, view)
            elif not _write_direct(fd, view):
                self.direct = False
                _write_all(fd, view)
            if _start_writeback is not None and not direct:
                _start_writeback(fd, 0, 0, _SYNC_FILE_RANGE_WRITE)  # a hint: a failure shows in the sync
        except BaseException:
            os.close(fd)
            unlink_quietly(tmp)
            with self._lock:
                self._names.discard(path)
            raise
        with self._lock:
            self._open.append((fd, tmp, path))
            early = self._open[:-self.MAX_OPEN] if len(self._open) > self.MAX_OPEN else []
            del self._open[:len(early)]
        for entry in early:  # bounded open files: the oldest are synced now (their writeback has had time)
            self._sync_one(entry)

    def forget(self, path: str) -> None:
        """Take back the file written for `path`: its temporary is removed and never gets the name."""
        with self._lock:
            if path not in self._names:
                return
            self._names.discard(path)
            entries = [e for e in self._open if e[2] == path]
            self._open = [e for e in self._open if e[2] != path]
            synced = [e for e in self._synced if e[1] == path]
            self._synced = [e for e in self._synced if e[1] != path]
        for fd, tmp, _path in entries:
            os.close(fd)
            unlink_quietly(tmp)
        for tmp, _path in synced:
            unlink_quietly(tmp)

    def _sync_one(self, entry: tuple[int, str, str]) -> None:
        fd, tmp, path = entry
        try:
            with phase("fsync"):
                _fdatasync(fd)
        except BaseException:
            with self._lock:
                self._open.append(entry)  # discard() closes and removes it
            raise
        os.close(fd)
        with self._lock:
            self._synced.append((tmp, path))

    def sync(self, workers: int = 8) -> None:
        """Make every file durable under its name: data synced, then renamed into place, then folders synced."""
        started = time.perf_counter()
        with self._lock:
            entries, self._open = self._open, []
        if len(entries) > 1 and workers > 1:
            # syncs in parallel: the filesystem serves them with few journal commits, not one each
            with ThreadPoolExecutor(max_workers=min(workers, len(entries)), thread_name_prefix="spotwarp-sync") as pool:
                futures = [pool.submit(self._sync_one, e) for e in entries]
                errors = [error for f in futures if (error := f.exception()) is not None]
            if errors:
                raise errors[0]
        else:
            for entry in entries:
                self._sync_one(entry)
        with self._lock:
            synced, self._synced = self._synced, []
            folders, self._folders = self._folders, set()
        try:
            for i, (tmp, path) in enumerate(synced):
                os.replace(tmp, path)
        except BaseException:
            with self._lock:
                self._synced.extend(synced[i:])
            raise
        # each file's entry lives in its folder; a folder created here has its own entry in its parent
        targets = {os.path.dirname(path) for _tmp, path in synced} | {os.path.dirname(f) for f in folders}
        for folder in sorted(targets, key=len, reverse=True):
            fsync_folder(folder)
        self.sync_s += time.perf_counter() - started

    def discard(self) -> None:
        """Remove every temporary not yet renamed (after a failure: nothing of this batch gets its name)."""
        with self._lock:
            entries, self._open = self._open, []
            synced, self._synced = self._synced, []
        for fd, tmp, _path in entries:
            try:
                os.close(fd)
            except OSError:
                pass
            unlink_quietly(tmp)
        for tmp, _path in synced:
            unlink_quietly(tmp)
