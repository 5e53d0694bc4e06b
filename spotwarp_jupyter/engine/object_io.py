"""Content-addressed objects: written once under their blake3 hash, checked against it on every read.

On object stores there is no atomic rename, and none is needed: every object is one PUT (or one
multipart upload), visible only when complete. On a local disk the objects of one snapshot are written
as a batch (pending_writes.PendingWrites): each to a temporary, then one pass syncs them all, renames
them into place and syncs their folders, before the manifest naming them is committed.
"""

from __future__ import annotations

import os
import posixpath
import threading
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from typing import Any, Iterable

from .errors import DamagedObjectError, StorageError
from .hashing import Buffer, is_object_id, object_hasher, object_id
from .pending_writes import PendingWrites
from .retries import modified, one_line

# On S3, objects above this size go up as multipart uploads in parts of PART_SIZE, sent in parallel.
# Chunks of large buffers are 64 MiB (persist.CHUNK_SIZE), so this catches big pickle streams.
MULTIPART_THRESHOLD = 64 * 1024 * 1024 + 1
PART_SIZE = 16 * 1024 * 1024
# Objects from this size up are looked for before they are sent (smaller ones are just sent).
ASK_BEFORE_UPLOAD = 8 * 1024 * 1024
# On GCS, objects from this size up go as resumable uploads in chunks of GCS_CHUNK_SIZE (a multiple of 256 KiB).
GCS_RESUMABLE_THRESHOLD = 1024 * 1024
GCS_CHUNK_SIZE = 8 * 1024 * 1024
# Local reads go in pieces this size, each hashed right after it lands (while the CPU's cache holds it).
READ_PIECE = 2 * 1024 * 1024


class ObjectIO:
    """The objects/ area of a Store (mixed into Store, which provides fs, _call, _write_local and the paths)."""

    fs: Any
    objects_dir: str
    local: bool
    workers: int
    url: str
    _s3: bool
    _gcs: bool
    _call: Any
    _write_local: Any

    def object_path(self, oid: str) -> str:
        """Where object `oid` lives (its first two hex digits fan the objects out)."""
        if not is_object_id(oid):
            raise DamagedObjectError(oid, "not a valid object id")
        return posixpath.join(self.objects_dir, oid[:2], oid)

    def has_object(self, oid: str) -> bool:
        """True when the object is stored (asked of the storage, never of a cache)."""
        return bool(self._call("checking an object", self.fs.exists, self.object_path(oid)))

    def present(self, oids: Iterable[str]) -> set[str]:
        """Which of `oids` are stored: asked of the storage, in parallel on object stores."""
        ordered = sorted(set(oids))
        if self.local or len(ordered) < 2:
            return {o for o in ordered if self.has_object(o)}
        with ThreadPoolExecutor(max_workers=min(16, len(ordered)), thread_name_prefix="spotwarp-check") as pool:
            return {o for o, ok in zip(ordered, pool.map(self.has_object, ordered)) if ok}

    def batch(self) -> PendingWrites | None:
        """A batch for `put_object(pending=...)` on a local disk (None on object stores: every PUT is final)."""
        return PendingWrites() if self.local else None

    def sync_batch(self, pending: PendingWrites | None) -> None:
        """Make every object written into `pending` durable under its name; on failure none of them gets it."""
        if pending is None:
            return
        try:
            pending.sync()
        except OSError as exc:
            pending.discard()
            raise StorageError(f"storage {self.url!r} failed while syncing objects: {exc.strerror or one_line(exc)}") from None
        except BaseException:
            pending.discard()
            raise

    def put_object(self, data: Buffer, oid: str | None = None, cancel: threading.Event | None = None,
                   pending: PendingWrites | None = None) -> tuple[str, int]:
        """Store `data` under its hash unless already there; return (id, size).

        With `pending` (a local `batch()`), the object is durable under its name only after `sync_batch(pending)`.
        """
        oid = oid or object_id(data)
        size = memoryview(data).nbytes
        path = self.object_path(oid)
        if self.local:
            if os.path.exists(path):
                pass
            elif pending is not None:
                try:
                    pending.write(path, data)
                except OSError as exc:
                    raise StorageError(f"storage {self.url!r} failed while writing an object: "
                                       f"{exc.strerror or one_line(exc)}") from None
            else:
                self._write_local("writing an object", path, data)
        elif size < ASK_BEFORE_UPLOAD or self._stored_size(path, cancel) != size:
            # A small object is simply written: one idempotent PUT of identical bytes costs no more than
            # asking whether it is there. A large one left whole by an interrupted snapshot is found and
            # not sent again; one a server kept truncated when the connection died is sent again.
            self._call("writing an object", self._upload, path, data, cancel=cancel)
        return oid, size

    def _stored_size(self, path: str, cancel: threading.Event | None = None) -> int | None:
        # exists() first: for a missing key (the usual case) s3fs's info() costs extra listing requests
        if not self._call("checking an object", self.fs.exists, path, cancel=cancel):
            return None
        try:
            info = self._call("checking an object", self.fs.info, path, cancel=cancel)
        except FileNotFoundError:
            return None
        size = info.get("size")
        return int(size) if size is not None else None

    def _upload(self, path: str, data: Buffer) -> None:
        size = memoryview(data).nbytes
        if self._s3:
            body = data if isinstance(data, (bytes, bytearray)) else bytes(data)  # botocore wants bytes
            if size >= MULTIPART_THRESHOLD:
                # multipart, parts sent in parallel; invisible until completed, aborted on failure
                self.fs.pipe_file(path, body, chunksize=PART_SIZE, max_concurrency=4)
            else:
                self.fs.pipe_file(path, body)
        elif self._gcs:
            # resumable upload in 8 MiB chunks from 1 MiB up (one request below): the same speed on
            # GCS, and the emulator ingests large single-request bodies at a few MB/s
            self.fs.pipe_file(path, data, chunksize=GCS_CHUNK_SIZE if size >= GCS_RESUMABLE_THRESHOLD else size + 1)
        else:
            self.fs.pipe_file(path, data if isinstance(data, (bytes, bytearray)) else bytes(data))

    def put_objects(self, buffers: Iterable[Buffer], workers: int | None = None) -> list[tuple[str, int]]:
        """Store many buffers in parallel (hashing and I/O overlap); results keep the input order.

        The first failure stops the rest (no new uploads, no more retries) and is raised.
        """
        buffers = list(buffers)
        if not buffers:
            return []
        workers = workers or self.workers
        pending = self.batch()
        try:
            results = self._put_all(buffers, workers, pending)
        except BaseException:
            if pending is not None:
                pending.discard()
            raise
        self.sync_batch(pending)
        return results

    def _put_all(self, buffers: list[Buffer], workers: int, pending: PendingWrites | None) -> list[tuple[str, int]]:
        if len(buffers) == 1 or workers == 1:
            return [self.put_object(b, pending=pending) for b in buffers]
        cancel = threading.Event()
        failures: list[BaseException] = []

        def put(data: Buffer) -> tuple[str, int]:
            if cancel.is_set():
                raise StorageError(f"storage {self.url!r}: upload abandoned after an earlier failure")
            try:
                return self.put_object(data, cancel=cancel, pending=pending)
            except BaseException as exc:
                if not cancel.is_set():
                    failures.append(exc)
                    cancel.set()
                raise

        with ThreadPoolExecutor(max_workers=min(workers, len(buffers)), thread_name_prefix="spotwarp-put") as pool:
            futures = [pool.submit(put, b) for b in buffers]
            wait(futures, return_when=FIRST_EXCEPTION)
            if cancel.is_set():
                for f in futures:
                    f.cancel()
                wait(futures)
                raise failures[0]
            return [f.result() for f in futures]

    def read_object(self, oid: str, size: int | None = None) -> bytes:
        """The object's bytes, checked against its hash."""
        path = self.object_path(oid)
        try:
            data = self._call("reading an object", self.fs.cat_file, path)
        except FileNotFoundError:
            raise DamagedObjectError(oid, "missing from storage") from None
        check_content(oid, data, size)
        return data

    def read_object_into(self, oid: str, target: memoryview) -> None:
        """Fill `target` with the object's bytes (no extra copy locally), checked against its hash."""
        path = self.object_path(oid)
        try:
            if self.local:
                _read_local_checked(oid, path, target)
                return
            data = self._call("reading an object", self.fs.cat_file, path)
        except FileNotFoundError:
            raise DamagedObjectError(oid, "missing from storage") from None
        if len(data) != target.nbytes:
            raise DamagedObjectError(oid, f"size differs from the manifest ({target.nbytes} bytes expected)")
        target[:] = data
        check_content(oid, target, target.nbytes)

    def list_objects_with_times(self) -> dict[str, tuple[int, float | None]]:
        """Every stored object id with its size and modification time (epoch seconds, if known)."""
        out: dict[str, tuple[int, float | None]] = {}
        self.fs.invalidate_cache(self.objects_dir)
        try:
            listing = self._call("listing objects", self.fs.find, self.objects_dir, detail=True)
        except FileNotFoundError:
            return out
        for path, info in listing.items():
            name = posixpath.basename(path)
            if is_object_id(name):
                out[name] = (int(info.get("size") or 0), modified(info))
        return out

    def delete_object(self, oid: str) -> None:
        """Remove one object (gc only: never one a live snapshot names)."""
        try:
            self._call("deleting an object", self.fs.rm, self.object_path(oid))
        except FileNotFoundError:
            pass  # already gone: another gc got there first


def _read_local_checked(oid: str, path: str, target: memoryview) -> None:
    """Read a local object into `target` piece by piece, hashing each piece while it is still in cache."""
    hasher = object_hasher()
    got = 0
    with open(path, "rb", buffering=0) as f:
        while got < target.nbytes:
            piece = target[got:got + READ_PIECE]
            n = f.readinto(piece)
            if not n:
                break
            hasher.update(piece[:n])
            got += n
        extra = f.read(1)
    if got != target.nbytes or extra:
        raise DamagedObjectError(oid, f"size differs from the manifest ({target.nbytes} bytes expected)")
    if hasher.hexdigest() != oid:
        raise DamagedObjectError(oid, "content does not match its hash")


def check_content(oid: str, data: Buffer, size: int | None) -> None:
    """Raise DamagedObjectError unless `data` has the expected size and hashes to `oid`."""
    if size is not None and memoryview(data).nbytes != size:
        raise DamagedObjectError(oid, f"size {memoryview(data).nbytes} differs from the manifest's {size}")
    if object_id(data) != oid:
        raise DamagedObjectError(oid, "content does not match its hash")
