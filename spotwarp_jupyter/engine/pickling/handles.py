"""Files opened by name and thread locks: reopened and recreated on restore (as dill does, and more carefully).

A file comes back opened on the same name (relative to the kernel's working folder when it lay under it, so a
workspace file reopens in the restored workspace), in its mode, at its position: a file opened for writing is
reopened without truncation, an append-mode log goes on appending, a closed file comes back closed. The
position is read without flushing the handle's buffer (a forked writer must not write it out a second time).
A `threading.Lock` comes back locked or not, an `RLock` held by the saving thread held as many times.
"""

from __future__ import annotations

import io
import os
import stat
import threading
from typing import Any

from .context import say

FILE_TYPES = (io.TextIOWrapper, io.BufferedReader, io.BufferedWriter, io.BufferedRandom, io.FileIO)


def _reduce_file(f: Any):
    name = getattr(f, "name", None)
    if not isinstance(name, str) or name.startswith("<"):
        raise TypeError(f"{type(f).__name__}: open files without a name cannot be saved (re-open it after restore)")
    if not f.closed and not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
        raise TypeError(f"{type(f).__name__}: {name} is not a regular file (a pipe, a device): not reopened on restore")
    kind = "text" if isinstance(f, io.TextIOWrapper) else "raw" if isinstance(f, io.FileIO) else "buffered"
    mode = getattr(f, "mode", "r")
    position = 0
    if not f.closed and "a" not in mode and f.seekable():
        # a text handle reading: its own tell() (it reads ahead of the line it returned); one writing: its buffer's,
        # as its tell() would flush what it holds (a forked writer must not write that out a second time)
        reading = "r" in mode and "+" not in mode
        position = (f.buffer if kind == "text" and not reading else f).tell()
    path, here = os.path.abspath(name), os.getcwd()
    relative = not os.path.isabs(name) or path.startswith(here + os.sep)
    encoding = f.encoding if kind == "text" else None
    return (_reopen_file, (os.path.relpath(path, here) if relative else path, relative, mode, position,
                           bool(f.closed), kind, encoding))


def _reopen_file(path: str, relative: bool, mode: str, position: int, closed: bool, kind: str,
                 encoding: str | None) -> Any:
    where = os.path.join(os.getcwd(), path) if relative else path
    binary = mode.replace("t", "").replace("b", "") + "b"
    buffering = 0 if kind == "raw" else -1
    if not closed and os.path.exists(where) and not os.path.isfile(where):
        say(f"the file {path} was open ({mode}) but {where} is not a regular file here: restored closed")
        closed = True
    elif not closed and "r" in binary and not os.path.exists(where):
        say(f"the file {path} was open ({mode}) but is not here ({where}): restored closed")
        closed = True
    try:
        if closed:
            return _closed(where, kind, encoding)
        if "w" in binary or "x" in binary:  # never truncate what was written: opened for writing as it is
            flags = os.O_CREAT | (os.O_RDWR if "+" in binary else os.O_WRONLY)
            handle: Any = os.fdopen(os.open(where, flags), binary.replace("x", "w"), buffering=buffering)
        else:
            handle = open(where, binary, buffering=buffering)  # noqa: SIM115 - the handle is the restored value
        if position and "a" not in binary and handle.seekable() and kind != "text":
            handle.seek(min(position, os.fstat(handle.fileno()).st_size))  # what was never flushed is not there
    except OSError as exc:
        say(f"the file {path} could not be reopened ({mode}): {exc}; restored closed")
        return _closed(where, kind, encoding)
    if kind != "text":
        return handle
    text = io.TextIOWrapper(handle, encoding=encoding)
    text.mode = mode  # as open() sets it
    if position and "a" not in binary:
        if "r" in mode and "+" not in mode:
            text.seek(position)  # the cookie its tell() gave
        else:
            text.seek(min(position, os.fstat(handle.fileno()).st_size))
    return text


def _closed(where: str, kind: str, encoding: str | None) -> Any:
    """A closed handle named `where`, of the kind the saved one was."""
    handle: Any = open(os.devnull, "rb", buffering=0)  # noqa: SIM115 - closed below, after wrapping
    handle.name = where
    if kind != "raw":
        handle = io.BufferedReader(handle)
    if kind == "text":
        handle = io.TextIOWrapper(handle, encoding=encoding)
    handle.close()
    return handle


def _reduce_lock(lock: Any):
    if isinstance(lock, _RLOCK):
        text = repr(lock)  # the count and owner without releasing it
        count = int(text.split("count=")[1].split()[0].rstrip(">"))
        owner = int(text.split("owner=")[1].split()[0])
        return (_recreate_rlock, (count if owner == threading.get_ident() else 0,))
    return (_recreate_lock, (bool(lock.locked()),))


def _recreate_lock(locked: bool) -> Any:
    lock = threading.Lock()
    if locked:
        lock.acquire()
    return lock


def _recreate_rlock(count: int) -> Any:
    lock = threading.RLock()
    for _ in range(count):
        lock.acquire()
    return lock


_LOCK = type(threading.Lock())
_RLOCK = type(threading.RLock())
LOCK_TYPES = (_LOCK, _RLOCK)
