"""Local-disk writes that are atomic and durable, and the temporaries an interrupted one leaves behind."""

from __future__ import annotations

import os
import secrets
import socket
import time
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
    tmp = f"{path}{TMP_MARK}{HOST_TAG}-{os.getpid()}-{secrets.token_hex(4)}"
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    try:
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
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
