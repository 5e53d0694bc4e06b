"""Local-disk writes that are atomic and durable, and the temporaries an interrupted one leaves behind."""

from __future__ import annotations

import os
import secrets
import socket
import time
from typing import BinaryIO, Callable, Iterable, Iterator

from ..hashing import Buffer

TMP_MARK = ".tmp-"
TEMPORARY_GRACE_S = 3600.0
# this host in temporaries' and locks' names (no '-': the name's parts are split on it)
HOST_TAG = "".join(c if c.isalnum() else "_" for c in socket.gethostname())[:40] or "host"


def write_atomic(path: str, data: Buffer) -> None:
    """Write `data` to `path` through a fsync'd temporary renamed into place (then fsync the folder)."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = temporary_name(path)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0), 0o666)
    replace_with(tmp, fd, path, lambda f: f.write(data))


def replace_with(tmp: str, fd: int, path: str, fill: Callable[[BinaryIO], object], *, mode: int | None = None,
                 mtime_ns: int | None = None, check: Callable[[str], None] | None = None,
                 sync_folder: bool = True) -> None:
    """Fill the temporary `tmp` (open as `fd`), set its mode and times, fsync it, rename it over `path`.

    The rename happens before `fd` closes (a lock on it is held until the file is in place); on any failure
    the temporary is removed. `check(path)` runs just before the rename; `sync_folder` fsyncs the folder after.
    """
    try:
        with os.fdopen(fd, "wb") as f:
            fill(f)
            f.flush()
            # through the descriptor: never through whatever the name may have been replaced with
            if mode is not None:
                os.chmod(fd, mode)
            if mtime_ns:
                os.utime(fd, ns=(mtime_ns, mtime_ns))
            os.fsync(fd)
            if check is not None:
                check(path)
            os.replace(tmp, path)
    except BaseException:
        unlink_quietly(tmp)
        raise
    if sync_folder:
        fsync_folder(os.path.dirname(path))


def fsync_folder(directory: str) -> None:
    """Make a rename in `directory` durable (where the platform allows opening a folder)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        pass


def temporary_name(path: str) -> str:
    """A temporary beside `path`, named so that `writer_gone` can tell whether its writer still runs."""
    return f"{path}{TMP_MARK}{HOST_TAG}-{os.getpid()}-{secrets.token_hex(4)}"


def create_exclusive(path: str, data: bytes) -> bool:
    """Create `path` holding `data` only if nothing is there yet: True when this call created it.

    A complete temporary is linked to the name: the link fails when the name exists (like O_EXCL), and
    nobody ever reads half a file."""
    folder = os.path.dirname(path)
    os.makedirs(folder, exist_ok=True)
    tmp = temporary_name(path)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(tmp, path)
        except FileExistsError:
            return False
    finally:
        unlink_quietly(tmp)
    fsync_folder(folder)
    return True


def unlink_quietly(path: str) -> None:
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
