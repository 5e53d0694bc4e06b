"""Immutable, content-addressed objects and snapshot manifests on any fsspec filesystem.

Layout under `{storage}/{project}/`:
  objects/ab/<blake3>          one immutable blob each, named by its content hash
  snapshots/<time>-<id>.json   one manifest per committed snapshot, written last
A snapshot exists only once its manifest exists; a manifest names only objects already durable.
"""

from __future__ import annotations

import logging
import os
import posixpath
import secrets
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Iterable, Iterator

import fsspec
from fsspec.implementations.local import LocalFileSystem

from .errors import DamagedObjectError, StorageError
from .hashing import Buffer, is_object_id, object_id

log = logging.getLogger("spotwarp")

MANIFEST_SUFFIX = ".json"


def _modified(info: dict[str, Any]) -> float | None:
    """Modification time from an fsspec info dict, whatever the backend calls it."""
    from datetime import datetime

    for key in ("mtime", "LastModified", "updated", "mtime_ns", "created"):
        value = info.get(key)
        if value is None:
            continue
        if isinstance(value, (int, float)):
            return float(value) / (1e9 if key == "mtime_ns" else 1)
        if isinstance(value, datetime):
            return value.timestamp()
        try:
            return datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()
        except ValueError:
            continue
    return None
_TMP_MARK = ".tmp-"


class Store:
    """One project's area in a storage URL."""

    def __init__(self, url: str, project: str, storage_options: dict[str, Any] | None = None, create: bool = True):
        self.url = url
        self.project = project
        try:
            self.fs, base = fsspec.core.url_to_fs(url, **(storage_options or {}))
        except (ImportError, ValueError) as exc:
            raise StorageError(f"cannot use storage {url!r}: {exc}") from None
        except Exception as exc:  # noqa: BLE001 - any backend failure is a storage error
            raise StorageError(f"cannot open storage {url!r}: {type(exc).__name__}: {exc}") from None
        self.local = isinstance(self.fs, LocalFileSystem)
        self.base = base.rstrip("/")
        self.root = posixpath.join(self.base, project) if base else project
        self.objects_dir = posixpath.join(self.root, "objects")
        self.snapshots_dir = posixpath.join(self.root, "snapshots")
        self._check(create)

    def __repr__(self) -> str:
        return f"Store({self.url!r}, project={self.project!r})"

    # -- reachability -------------------------------------------------------------------
    def _check(self, create: bool) -> None:
        try:
            if self.local:
                if create:
                    os.makedirs(self.objects_dir, exist_ok=True)
                    os.makedirs(self.snapshots_dir, exist_ok=True)
                    if not os.access(self.root, os.W_OK):
                        raise StorageError(f"storage {self.url!r} is not writable")
                elif not os.path.isdir(self.base or "/"):
                    raise StorageError(f"storage {self.url!r} does not exist (nothing has been stored there yet)")
            else:
                self.fs.ls(self.root.split("/")[0] if "/" in self.root else self.root, detail=False)
        except StorageError:
            raise
        except FileNotFoundError:
            raise StorageError(f"storage {self.url!r} does not exist (create the bucket or folder first)") from None
        except Exception as exc:  # noqa: BLE001
            raise StorageError(f"storage {self.url!r} is unreachable: {type(exc).__name__}: {exc}") from None

    def _call(self, what: str, fn, *args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except (FileNotFoundError, DamagedObjectError, StorageError):
            raise
        except Exception as exc:  # noqa: BLE001
            raise StorageError(f"storage {self.url!r} failed while {what}: {type(exc).__name__}: {exc}") from None

    # -- objects --------------------------------------------------------------------------
    def object_path(self, oid: str) -> str:
        if not is_object_id(oid):
            raise DamagedObjectError(oid, "not a valid object id")
        return posixpath.join(self.objects_dir, oid[:2], oid)

    def has_object(self, oid: str) -> bool:
        return bool(self._call("checking an object", self.fs.exists, self.object_path(oid)))

    def put_object(self, data: Buffer, oid: str | None = None) -> tuple[str, int]:
        """Store `data` under its hash unless already there; return (id, size)."""
        oid = oid or object_id(data)
        size = memoryview(data).nbytes
        path = self.object_path(oid)
        if self.local:
            if not os.path.exists(path):
                self._write_local_atomic(path, data)
        elif not self.has_object(oid):
            self._call("writing an object", self.fs.pipe_file, path, bytes(data) if not isinstance(data, bytes) else data)
        return oid, size

    def put_objects(self, buffers: Iterable[Buffer], workers: int | None = None) -> list[tuple[str, int]]:
        """Store many buffers in parallel (hashing and I/O overlap); results keep the input order."""
        buffers = list(buffers)
        if not buffers:
            return []
        workers = workers or (2 if self.local else 8)
        if len(buffers) == 1 or workers == 1:
            return [self.put_object(b) for b in buffers]
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="spotwarp-put") as pool:
            return list(pool.map(self.put_object, buffers))

    def read_object(self, oid: str, size: int | None = None) -> bytes:
        """The object's bytes, checked against its hash."""
        path = self.object_path(oid)
        try:
            data = self._call("reading an object", self.fs.cat_file, path)
        except FileNotFoundError:
            raise DamagedObjectError(oid, "missing from storage") from None
        self._check_content(oid, data, size)
        return data

    def read_object_into(self, oid: str, target: memoryview) -> None:
        """Fill `target` with the object's bytes (no extra copy), checked against its hash."""
        path = self.object_path(oid)
        try:
            if self.local:
                with open(path, "rb") as f:
                    got = f.readinto(target)
                    extra = f.read(1)
                if got != target.nbytes or extra:
                    raise DamagedObjectError(oid, f"size differs from the manifest ({target.nbytes} bytes expected)")
            else:
                data = self._call("reading an object", self.fs.cat_file, path)
                if len(data) != target.nbytes:
                    raise DamagedObjectError(oid, f"size differs from the manifest ({target.nbytes} bytes expected)")
                target[:] = data
        except FileNotFoundError:
            raise DamagedObjectError(oid, "missing from storage") from None
        self._check_content(oid, target, target.nbytes)

    @staticmethod
    def _check_content(oid: str, data: Buffer, size: int | None) -> None:
        if size is not None and memoryview(data).nbytes != size:
            raise DamagedObjectError(oid, f"size {memoryview(data).nbytes} differs from the manifest's {size}")
        if object_id(data) != oid:
            raise DamagedObjectError(oid, "content does not match its hash")

    def list_objects_with_times(self) -> dict[str, tuple[int, float | None]]:
        """Every stored object id with its size and modification time (epoch seconds, if known)."""
        out: dict[str, tuple[int, float | None]] = {}
        try:
            listing = self._call("listing objects", self.fs.find, self.objects_dir, detail=True)
        except FileNotFoundError:
            return out
        for path, info in listing.items():
            name = posixpath.basename(path)
            if is_object_id(name):
                out[name] = (int(info.get("size") or 0), _modified(info))
        return out

    def delete_object(self, oid: str) -> None:
        self._call("deleting an object", self.fs.rm, self.object_path(oid))

    # -- manifests ------------------------------------------------------------------------
    def manifest_names(self) -> list[str]:
        """Names of committed manifests, oldest first (names sort by creation time)."""
        try:
            names = self._call("listing snapshots", self.fs.ls, self.snapshots_dir, detail=False)
        except FileNotFoundError:
            return []
        out = [posixpath.basename(n) for n in names]
        return sorted(n for n in out if n.endswith(MANIFEST_SUFFIX) and _TMP_MARK not in n)

    def read_manifest(self, name: str) -> bytes:
        return self._call("reading a manifest", self.fs.cat_file, posixpath.join(self.snapshots_dir, name))

    def write_manifest(self, name: str, data: bytes) -> None:
        """Commit: a single atomic write (rename on local disks, one PUT on object stores)."""
        path = posixpath.join(self.snapshots_dir, name)
        if self.local:
            self._write_local_atomic(path, data)
        else:
            self._call("committing a manifest", self.fs.pipe_file, path, data)

    def delete_manifest(self, name: str) -> None:
        self._call("deleting a manifest", self.fs.rm, posixpath.join(self.snapshots_dir, name))

    # -- housekeeping ---------------------------------------------------------------------
    def stale_temporaries(self, older_than_s: float = 3600.0) -> Iterator[str]:
        """Leftovers of interrupted local writes, old enough that no writer still owns them."""
        if not self.local:
            return
        now = time.time()
        for top in (self.objects_dir, self.snapshots_dir):
            for dirpath, _dirs, files in os.walk(top):
                for name in files:
                    if _TMP_MARK in name:
                        path = os.path.join(dirpath, name)
                        try:
                            if now - os.path.getmtime(path) > older_than_s:
                                yield path
                        except OSError:
                            continue

    @staticmethod
    def _write_local_atomic(path: str, data: Buffer) -> None:
        directory = os.path.dirname(path)
        os.makedirs(directory, exist_ok=True)
        tmp = f"{path}{_TMP_MARK}{os.getpid()}-{secrets.token_hex(4)}"
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
