"""The temporary files a workspace restore writes before renaming them into place, and sweeping up after a killed one.

A temporary has a short name of its own (`.spotwarp-tmp-` and 16 hex digits), whatever the length of the
file it becomes, so a name of 255 bytes restores as well as a short one. While a restore writes it, it
holds an exclusive `flock` on it; the lock dies with its process, so a later restore can tell the
leftovers of a killed one (lock free) from the work of one still running (lock held) and remove only
those. Earlier versions named temporaries `.NAME.spotwarp-tmp-XXXXXXXX`; those are swept up too.
"""

from __future__ import annotations

import errno
import os
import re
import secrets
import stat
import time

try:
    import fcntl
except ImportError:  # pragma: no cover - not on Windows: temporaries are then judged by age alone
    fcntl = None  # type: ignore[assignment]

MARK = ".spotwarp-tmp-"
_NAME = re.compile(r"\.spotwarp-tmp-[0-9a-f]{16}")
_EARLIER_NAME = re.compile(r"\..+\.spotwarp-tmp-[0-9a-f]{8}", re.DOTALL)
# where locks are not supported, a temporary nobody has touched for this long belongs to no live restore
STALE_AFTER_S = 600.0
_NO_LOCKS = {errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL, errno.EBADF}


def is_temporary(name: str) -> bool:
    """True when `name` (a file name, no folder) is a restore's temporary, this version's or an earlier one's."""
    return MARK in name and bool(_NAME.fullmatch(name) or _EARLIER_NAME.fullmatch(name))


def new_name() -> str:
    """A fresh temporary name: 30 bytes, whatever the name of the file it becomes."""
    return f"{MARK}{secrets.token_hex(8)}"


def create_locked(folder: str) -> tuple[str, int]:
    """(path, fd) of a new temporary in `folder`, open for writing and locked by this process."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    while True:
        path = os.path.join(folder, new_name())
        fd = os.open(path, flags, 0o600)
        if not _lock(fd, blocking=True):
            return path, fd
        try:  # a sweep may have taken it between its creation and the lock: then it is no longer linked there
            if os.lstat(path).st_ino == os.fstat(fd).st_ino:
                return path, fd
        except FileNotFoundError:
            pass
        os.close(fd)


def _lock(fd: int, blocking: bool) -> bool:
    """Lock `fd`; True when locked, False where the filesystem has no locks; BlockingIOError when held elsewhere."""
    if fcntl is None:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
    except OSError as exc:
        if exc.errno in (errno.EAGAIN, errno.EWOULDBLOCK, errno.EACCES):
            raise BlockingIOError(exc.errno, "locked") from None
        if exc.errno in _NO_LOCKS:
            return False
        raise
    return True


def _open_to_lock(path: str) -> int:
    # read-write where possible: over NFS an exclusive lock needs a descriptor open for writing
    flags = os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        return os.open(path, os.O_RDWR | flags)
    except PermissionError:
        return os.open(path, os.O_RDONLY | flags)


def sweep(paths: list[str]) -> tuple[int, int]:
    """Remove the temporaries no live restore is writing; (how many, bytes freed)."""
    removed = freed = 0
    for path in paths:
        try:
            st = os.lstat(path)
            if stat.S_ISLNK(st.st_mode):
                # a link's temporary is renamed the moment it exists: one still there was left by a killed restore
                os.unlink(path)
                removed += 1
                continue
            if not stat.S_ISREG(st.st_mode):
                continue
            fd = _open_to_lock(path)
        except OSError:
            continue  # gone already, or not ours to open
        try:
            try:
                locked = _lock(fd, blocking=False)
            except BlockingIOError:
                continue  # a restore is writing it right now
            held = os.fstat(fd)
            if not locked and time.time() - max(held.st_mtime, held.st_ctime) < STALE_AFTER_S:
                continue  # no locks here, and recent enough to belong to a running restore
            if os.lstat(path).st_ino != held.st_ino:
                continue  # replaced since it was opened
            os.unlink(path)
            removed += 1
            freed += held.st_size
        except OSError:
            continue
        finally:
            os.close(fd)
    return removed, freed
