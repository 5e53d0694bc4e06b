"""DCP's files as the store's content-addressed objects: hashed as DCP writes them, checked before DCP reads them.

Writing, each file's object id (engine.hashing's blake3) is computed from the page cache while the file's fsync
runs, so that DCP's writes do not wait on hashing and storing the file needs no further pass over it. Reading, the object files of a local store are split among the
ranks; each rank hashes its share while DCP plans the load, and no rank reads a file before every rank reported
its share sound (nothing unchecked is unpickled). From an object store each file a rank reads is downloaded once,
checked by the store, and handed to DCP from memory. Imported only where torch is.
"""

from __future__ import annotations

import contextlib
import io
import os
import threading
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import IO, Any

import blake3
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.filesystem import FileSystem

from ..engine import DamagedObjectError, SpotWarpError
from ..engine.storage.store import Store

METADATA = ".metadata"
PARALLEL_MIN = 8 << 20  # a file at least this large is hashed by several threads
_pool: tuple[int, ThreadPoolExecutor] | None = None


def hash_file(path: str) -> str:
    """The file's object id; a large file hashed by as many threads as help (a small one by this thread alone:
    it does not queue behind another hash for the shared pool)."""
    big = os.path.getsize(path) >= PARALLEL_MIN
    hasher = blake3.blake3(max_threads=blake3.blake3.AUTO if big else 1)
    hasher.update_mmap(path)
    return hasher.hexdigest()


def _fsync_thread() -> ThreadPoolExecutor:
    """This process's thread for a written file's fsync (a forked rank starts its own: threads do not survive a
    fork)."""
    global _pool
    if _pool is None or _pool[0] != os.getpid():
        _pool = (os.getpid(), ThreadPoolExecutor(1, thread_name_prefix="spotwarp-fsync"))
    return _pool[1]


# -- writing -------------------------------------------------------------------------------------------

class _HashedFiles(FileSystem):
    """DCP's local file system, recording the object id and size of each file it wrote under its last name.

    DCP writes each file straight to disk, uncontended; the file is then hashed from the page cache while the
    disk makes it durable (its fsync in a thread), so the hash costs CPU the fsync leaves idle."""

    def __init__(self, sync_files: bool) -> None:
        super().__init__()
        self.sync_files = sync_files
        self.hashed: dict[str, tuple[str, int]] = {}
        self.lock = threading.Lock()  # DCP may write with several threads

    @contextlib.contextmanager
    def create_stream(self, path: str | os.PathLike, mode: str) -> Iterator[Any]:
        with super().create_stream(path, mode) as stream:
            yield stream
        if mode == "wb":
            done = _durable_and_hashed(str(path), self.sync_files)
            with self.lock:
                self.hashed[os.path.basename(str(path))] = done

    def rename(self, path: str | os.PathLike, new_path: str | os.PathLike) -> None:
        super().rename(path, new_path)
        with self.lock:
            done = self.hashed.pop(os.path.basename(str(path)), None)
            if done is not None:
                self.hashed[os.path.basename(str(new_path))] = done


def _durable_and_hashed(path: str, sync: bool) -> tuple[str, int]:
    """A written file's object id and size, hashed while its fsync (with `sync`) runs in a thread."""
    fd = os.open(path, os.O_RDONLY)
    try:
        syncing = _fsync_thread().submit(os.fsync, fd) if sync else None
        try:
            return hash_file(path), os.fstat(fd).st_size
        finally:
            if syncing is not None:
                syncing.result()  # raises what fsync raised: the file is not durable
    finally:
        os.close(fd)


def hashing_writer(folder: str, sync_files: bool) -> tuple[FileSystemWriter, dict[str, tuple[str, int]]]:
    """A DCP writer into `folder`, and the (object id, size) of each file it wrote, by name, once it is done.
    With `sync_files` each file is durable before DCP goes on (DCP's own fsync is replaced by the one above)."""
    writer = FileSystemWriter(folder, sync_files=False)
    files = _HashedFiles(sync_files)
    writer.fs = files
    return writer, files.hashed


def written_id(path: str, hashed: Mapping[str, tuple[str, int]]) -> tuple[str, int]:
    """The object id and size of a file DCP wrote: as hashed on the way out, re-hashed if the file differs in size."""
    size = os.path.getsize(path)
    done = hashed.get(os.path.basename(path))
    if done is not None and done[1] == size:
        return done[0], size
    return hash_file(path), size


# -- reading -------------------------------------------------------------------------------------------

class ShareCheck:
    """This rank's share of a local store's object files (every `world`-th of them, by name), hashed in a thread.

    The thread touches no process group: the ranks exchange their findings in `CheckedReader.read_data`, which
    DCP calls in every rank once all planned the load."""

    def __init__(self, store: Store, files: Mapping[str, Any], rank: int, world: int):
        names = sorted(n for n in files if n != METADATA)
        self.share = [(str(files[n][0]), int(files[n][1])) for n in names[rank::world]]
        self.store, self.faults = store, []  # [object id, what is wrong]
        self.thread = threading.Thread(target=self._run, name="spotwarp-check", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        for oid, size in self.share:
            try:
                fault = _local_fault(self.store, oid, size)
            except Exception as exc:  # noqa: BLE001 - reported to every rank, raised there
                fault = f"{type(exc).__name__}: {exc}"
            if fault is not None:
                self.faults.append([oid, fault])

    def wait(self) -> list[list[str]]:
        self.thread.join()
        return self.faults


def _local_fault(store: Store, oid: str, size: int) -> str | None:
    """What is wrong with a local object file, None if it matches its hash."""
    local = store.object_path(oid)
    if not os.path.exists(local):
        return "missing from storage"
    if os.path.getsize(local) != size or hash_file(local) != oid:
        return "its content does not match its hash"
    return None


class _Objects(FileSystem):
    """The snapshot's files, read-only, each one of the store's objects."""

    def __init__(self, store: Store, files: Mapping[str, Any]):
        super().__init__()
        self.store, self.files = store, files
        self.checked: set[str] = set()  # local object files the ranks found sound
        self.downloaded: dict[str, bytes | bytearray] = {}

    def ref(self, name: str) -> tuple[str, int]:
        if name not in self.files:
            raise SpotWarpError(f"the collective snapshot names no file {name!r}: refusing it")
        return str(self.files[name][0]), int(self.files[name][1])

    @contextlib.contextmanager
    def create_stream(self, path: str | os.PathLike, mode: str) -> Iterator[IO[bytes]]:
        if mode != "rb":
            raise SpotWarpError(f"a collective snapshot is read-only (asked to open {path} with {mode!r})")
        oid, size = self.ref(os.path.basename(str(path)))
        if not self.store.local:
            if oid not in self.downloaded:
                self.downloaded[oid] = self.store.read_object(oid, size)  # DamagedObjectError unless it matches
            yield io.BytesIO(self.downloaded[oid])
            return
        if oid not in self.checked:  # the metadata, which every rank reads before planning: checked here
            fault = _local_fault(self.store, oid, size)
            if fault is not None:
                raise DamagedObjectError(oid, fault)
            self.checked.add(oid)
        with open(self.store.object_path(oid), "rb") as stream:
            yield stream


class CheckedReader(FileSystemReader):
    """A DCP reader over a collective snapshot's objects: no file is read before it is checked against its hash."""

    def __init__(self, store: Store, files: Mapping[str, Any], rank: int, world: int):
        super().__init__("spotwarp-objects")  # a name only: every file is one of the store's objects
        self.objects = _Objects(store, files)
        self.fs = self.objects
        self.share = ShareCheck(store, files, rank, world) if store.local else None

    def read_data(self, plan: Any, planner: Any) -> Any:
        if self.share is not None:  # DCP calls this in every rank: all learn every rank's findings
            import torch.distributed as dist

            found: list[Any] = [None] * dist.get_world_size()
            dist.all_gather_object(found, self.share.wait())
            faults = [fault for share in found for fault in share]
            if faults:
                raise DamagedObjectError(*faults[0])
            self.objects.checked.update(str(ref[0]) for ref in self.objects.files.values())
        try:
            return super().read_data(plan, planner)
        finally:
            self.objects.downloaded.clear()
