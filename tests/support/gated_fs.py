"""A test-only fsspec filesystem, `gated://`: a local folder whose large objects are held back until a test says so.

Importing this module registers the protocol (in a test process, or in a kernel that imports it).
Reads of files of at least GATED_FS_MIN bytes (default 1 MiB) under an `objects/` folder first wait
until something is written into the named pipe GATED_FS_FIFO: the test opens the gate with `open_gate`
when it chooses, so "still loading" lasts exactly as long as the test wants, with no timing guesses.
Once opened, that gate stays open for that process. Without GATED_FS_FIFO nothing is held back.
"""

from __future__ import annotations

import os
import threading

import fsspec
from fsspec.implementations.local import LocalFileSystem
from fsspec.spec import AbstractFileSystem

_opened: set[str] = set()
_lock = threading.Lock()


def _wait_for_gate() -> None:
    fifo = os.environ.get("GATED_FS_FIFO")
    if not fifo or fifo in _opened:
        return
    with _lock:
        if fifo not in _opened:
            with open(fifo, "rb") as gate:  # blocks until the test opens the pipe and writes to it
                gate.read(1)
            _opened.add(fifo)


def open_gate(fifo: str) -> None:
    """Let every held-back read through (blocks until the reader is waiting at the gate)."""
    with open(fifo, "wb") as gate:
        gate.write(b"x")


class GatedFileSystem(AbstractFileSystem):
    """A local folder seen as an object store (no local fast path), large object reads gated."""

    protocol = "gated"
    root_marker = "/"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.disk = LocalFileSystem(auto_mkdir=True)

    @classmethod
    def _strip_protocol(cls, path):
        path = path[len("gated://"):] if path.startswith("gated://") else path
        return "/" + path.lstrip("/")

    def cat_file(self, path, start=None, end=None, **kwargs):
        path = self._strip_protocol(path)
        if "/objects/" in path and os.path.getsize(path) >= int(os.environ.get("GATED_FS_MIN", 1 << 20)):
            _wait_for_gate()
        return self.disk.cat_file(path, start=start, end=end)

    def pipe_file(self, path, value, **kwargs):
        self.disk.pipe_file(self._strip_protocol(path), value)

    def ls(self, path, detail=True, **kwargs):
        return self.disk.ls(self._strip_protocol(path), detail=detail)

    def info(self, path, **kwargs):
        return self.disk.info(self._strip_protocol(path))

    def exists(self, path, **kwargs):
        return self.disk.exists(self._strip_protocol(path))

    def find(self, path, maxdepth=None, withdirs=False, detail=False, **kwargs):
        return self.disk.find(self._strip_protocol(path), maxdepth=maxdepth, withdirs=withdirs, detail=detail)

    def rm(self, path, recursive=False, maxdepth=None):
        self.disk.rm(self._strip_protocol(path), recursive=recursive, maxdepth=maxdepth)

    def _open(self, path, mode="rb", **kwargs):
        return self.disk._open(self._strip_protocol(path), mode=mode, **kwargs)


fsspec.register_implementation("gated", GatedFileSystem, clobber=True)
