"""Local-disk writes that are atomic and durable, and the temporaries an interrupted one leaves behind."""

from __future__ import annotations

import ctypes
import os
import secrets
import socket
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Iterable, Iterator

from .hashing import Buffer

TMP_MARK = ".tmp-"
TEMPORARY_GRACE_S = 3600.0
# this host in temporaries' and locks' names (no '-': the name's parts are split on it)
HOST_TAG = "".join(c if c.isalnum() else "_" for c in socket.gethostname())[:40] or "host"


def write_atomic(path: str, data: Buffer) -> None:
    """Write `data` to `path` through a fsync'd temporary renamed into place (then fsync the folder)."""
    directory = os.path.dirname(path)
    os.makedirs(directory, exist_ok=True)
    tmp = _temporary(path)
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        _unlink(tmp)
        raise
    _fsync_folder(directory)


def _temporary(path: str) -> str:
    return f"{path}{TMP_MARK}{HOST_TAG}-{os.getpid()}-{secrets.token_hex(4)}"


def _fsync_folder(directory: str) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        pass  # a folder that cannot be opened or synced (some filesystems): its entries are as durable as it allows


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
        tmp = _temporary(path)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o666)
        try:
            view = memoryview(data).cast("B")
            done = 0
            while done < view.nbytes:
                done += os.write(fd, view[done:])
            if _start_writeback is not None:
                _start_writeback(fd, 0, 0, _SYNC_FILE_RANGE_WRITE)  # a hint: a failure shows in the sync
        except BaseException:
            os.close(fd)
            _unlink(tmp)
            with self._lock:
                self._names.discard(path)
            raise
        with self._lock:
            self._open.append((fd, tmp, path))
            early = self._open[:-self.MAX_OPEN] if len(self._open) > self.MAX_OPEN else []
            del self._open[:len(early)]
        for entry in early:  # bounded open files: the oldest are synced now (their writeback has had time)
            self._sync_one(entry)

    def _sync_one(self, entry: tuple[int, str, str]) -> None:
        fd, tmp, path = entry
        try:
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
                errors = [f.exception() for f in futures if f.exception() is not None]
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
            _fsync_folder(folder)
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
            _unlink(tmp)
        for tmp, _path in synced:
            _unlink(tmp)


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def writer_gone(name: str) -> bool:
    """True when a temporary's name says it was written by a process of this host that no longer runs."""
    parts = name.rsplit(TMP_MARK, 1)[-1].split("-")
    if len(parts) != 3 or parts[0] != HOST_TAG or not parts[1].isdigit():
        return False
    pid = int(parts[1])
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:
        return False
    return False


def stale_temporaries(folders: Iterable[str], older_than_s: float = TEMPORARY_GRACE_S) -> Iterator[str]:
    """Temporaries under `folders` old enough, or left by a process of this host that is gone."""
    now = time.time()
    for top in folders:
        for dirpath, _dirs, files in os.walk(top):
            for name in files:
                if TMP_MARK in name:
                    path = os.path.join(dirpath, name)
                    try:
                        if now - os.path.getmtime(path) > older_than_s or writer_gone(name):
                            yield path
                    except OSError:
                        continue
