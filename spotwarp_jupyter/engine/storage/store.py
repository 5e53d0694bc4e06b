"""Immutable, content-addressed objects and snapshot manifests on any fsspec filesystem.

Under `{storage}/{project}/` (the areas: layout.py), `objects/ab/<blake3>` holds one immutable blob each, named
by its content hash, and `snapshots/<time>-<id>.json` one manifest per committed snapshot, written last.
A snapshot exists only once its manifest exists; a manifest names only objects already durable. The small
records of coordination and the journal (leases, heads, heartbeats, requests, watchers, events) are read,
written, listed and deleted here too (`read_record` and its siblings), with the same retries and one-line errors.

On object stores (gcsfs, s3fs) there is no atomic rename, and none is needed: every object is one
PUT (or one multipart upload), visible only when complete, and the commit is a single PUT of the
manifest made after every object it names has been stored. Transient failures (connection resets,
timeouts, 5xx, throttling) are retried with exponential backoff (retries.py); when the attempts are
spent the caller gets one StorageError line and no manifest is written.
"""

from __future__ import annotations

import functools
import inspect
import logging
import os
import posixpath
import threading
import time
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from datetime import datetime
from typing import Any, Callable, Iterable, Iterator, TypeVar

# gcsfs probes for hierarchical-namespace buckets over gRPC unless told not to; against emulators and
# most buckets that probe waits out a 60 s timeout per bucket call. Must be set before gcsfs is imported.
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")

import fsspec  # noqa: E402
from fsspec.exceptions import FSTimeoutError  # noqa: E402
from fsspec.implementations.local import LocalFileSystem  # noqa: E402

from ..errors import DamagedObjectError, StorageError, one_line  # noqa: E402
from ..hashing import Buffer, is_object_id, object_hasher, object_id  # noqa: E402
from ..settings import env_float, env_int  # noqa: E402
from ..timings import phase  # noqa: E402
from .backends import check_backend  # noqa: E402
from .layout import Layout  # noqa: E402
from .local_files import (  # noqa: E402
    HOST_TAG,
    TEMPORARY_GRACE_S,
    TMP_MARK,
    create_exclusive,
    stale_temporaries,
    write_atomic,
)
from .local_reads import populate_for_copy, read_local_checked  # noqa: E402
from .pending_writes import PendingWrites  # noqa: E402
from .ranged_reads import range_reader, read_ranges_into  # noqa: E402
from .retries import RetryPolicy, call_with_retries, log  # noqa: E402

T = TypeVar("T")
__all__ = ["CHUNK_SIZE", "HOST_TAG", "MANIFEST_SUFFIX", "Store", "TEMPORARY_GRACE_S", "check_content"]

# Large buffers and workspace files are stored in chunks of this size, each its own object.
CHUNK_SIZE = 64 * 1024 * 1024
# On S3, objects above this size go up as multipart uploads in parts of PART_SIZE, sent in parallel.
# Chunks are CHUNK_SIZE (64 MiB), so this catches big pickle streams.
MULTIPART_THRESHOLD = CHUNK_SIZE + 1
PART_SIZE = 16 * 1024 * 1024
# Objects from this size up are looked for before they are sent (smaller ones are just sent).
ASK_BEFORE_UPLOAD = 8 * 1024 * 1024
# On GCS, objects from this size up go as resumable uploads in chunks of GCS_CHUNK_SIZE (a multiple of 256 KiB).
GCS_RESUMABLE_THRESHOLD = 1024 * 1024
GCS_CHUNK_SIZE = 8 * 1024 * 1024
# gcsfs sends a smaller object as one multipart request whose boundary is always "==0==": content holding
# the delimiter would be cut there by the server, so such an object goes up as a resumable upload instead.
# (Manifests, locks and events are JSON, whose lines never start with "--".)
GCSFS_DELIMITER = b"--==0=="
# On object stores, objects from this size up are read as ranged GETs of up to RANGE_SIZE, concurrently
# (a GET without a range streams a body slowly through s3fs; a ranged one does not). A chunk is one
# request, as plain fsspec's best parallel read makes it: smaller ranges cost more in requests than they
# gain in streams once several chunks are read at once (the restore reads several).
RANGED_READ_MIN = 1024 * 1024
RANGE_SIZE = CHUNK_SIZE
MANIFEST_SUFFIX = ".json"


# A storage call on an object store, the library's own retries included, ends within twice the request
# timeout plus a second for every SLOWEST_RATE bytes it moves (a slow link's upload is not cut short).
SLOWEST_RATE = 256 * 1024


def _bound_requests(protocol: str, options: dict[str, Any], seconds: float) -> None:
    """Each GCS or S3 request waits at most `seconds` (SPOTWARP_STORAGE_REQUEST_TIMEOUT, default 60) to
    connect, and as long for each next piece of its answer, unless `options` say otherwise (gcsfs's
    `requests_timeout`, botocore's `connect_timeout` / `read_timeout` in `config_kwargs`).

    gcsfs sets no timeout of its own: a connection left open by a server that stopped answering (a hung
    process, a partition that drops packets) held a snapshot forever. A timed-out request is retried like
    any transient failure (the library's retries, then ours), then fails the snapshot with one line.
    These bounds do not cover a request that waits to send its body (Store._bounded does).
    """
    if seconds <= 0:
        return
    if protocol in ("gs", "gcs") and "requests_timeout" not in options:
        import aiohttp  # gcsfs's own HTTP client

        options["requests_timeout"] = aiohttp.ClientTimeout(total=None, sock_connect=seconds, sock_read=seconds)
    if protocol in ("s3", "s3a"):
        config = dict(options.get("config_kwargs") or {})
        config.setdefault("connect_timeout", seconds)
        config.setdefault("read_timeout", seconds)
        options["config_kwargs"] = config


class Store:
    """One project's area in a storage URL."""

    def __init__(self, url: str, project: str, storage_options: dict[str, Any] | None = None, create: bool = True):
        self.url = url
        self.project = project
        options = dict(storage_options or {})
        protocol = url.split("://", 1)[0].lower() if "://" in url else "file"
        if protocol not in ("file", "local"):
            # listings must be fresh: another host may commit or gc at any moment
            options.setdefault("use_listings_cache", False)
        if protocol in ("gs", "gcs"):
            # gcsfs logs each retried request's traceback; the user gets our one-line error instead
            logging.getLogger("gcsfs").addHandler(logging.NullHandler())
        self._options = options
        check_backend(protocol)
        self._request_timeout = env_float("SPOTWARP_STORAGE_REQUEST_TIMEOUT", 60.0)
        _bound_requests(protocol, options, self._request_timeout)  # after the check: a missing gcsfs is named
        try:
            self._fs, base = fsspec.core.url_to_fs(url, **options)
            self._fs_pid = os.getpid()
        except (ImportError, ValueError, TypeError) as exc:
            raise StorageError(f"cannot use storage {url!r}: {one_line(exc)}") from None
        except Exception as exc:  # noqa: BLE001 - any backend failure is a storage error
            raise StorageError(f"cannot open storage {url!r}: {one_line(exc)}") from None
        self.local = isinstance(self.fs, LocalFileSystem)
        self._s3 = protocol in ("s3", "s3a")
        self._gcs = protocol in ("gs", "gcs")
        self._protocol = protocol
        self.retry = RetryPolicy(attempts=1) if self.local else RetryPolicy.from_env()
        # writers in flight: on a local disk four keep more direct writes queued while others hash (full
        # snapshots 3-16% faster than with two from 0.25 to 4 GB, on 2 cores idle or busy; benchmarks/RESULTS.md),
        # for 32 MiB of staging buffers in all
        self.workers = env_int("SPOTWARP_STORAGE_WORKERS", 4 if self.local else 8, 1)
        self.base = base.rstrip("/")
        self.root = posixpath.join(self.base, project) if base else project
        self.objects_dir = posixpath.join(self.root, Layout.OBJECTS)
        self.snapshots_dir = posixpath.join(self.root, Layout.SNAPSHOTS)
        self.locks_dir = posixpath.join(self.root, Layout.LOCKS)
        self._swept = False
        if self.local and "://" in url and not url.split("://", 1)[1].startswith("/"):
            # fsspec reads `file://` and `file://x` relative to the current folder: never write there unasked
            raise StorageError(f"storage {url!r} names no absolute folder: use file:///absolute/path or a plain path")
        self._check(create)

    def __repr__(self) -> str:
        return f"Store({self.url!r}, project={self.project!r})"

    @property
    def fs(self) -> fsspec.AbstractFileSystem:
        """The fsspec filesystem; opened afresh in a forked child (async backends are not fork-safe)."""
        if self._fs_pid != os.getpid():
            self._fs, _ = fsspec.core.url_to_fs(self.url, **self._options)
            self._fs_pid = os.getpid()
        return self._fs

    # -- reachability and retries ---------------------------------------------------------------
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
                self._reach()
        except StorageError:
            raise
        except FileNotFoundError:
            raise StorageError(f"storage {self.url!r} does not exist (create the bucket or folder first)") from None
        except PermissionError as exc:  # local disks; object stores' refusals come through _call
            raise StorageError(f"storage {self.url!r} refuses access (check credentials): {one_line(exc)}") from None
        except Exception as exc:  # noqa: BLE001
            raise StorageError(f"storage {self.url!r} is unreachable: {one_line(exc)}") from None

    def _reach(self) -> None:
        """List the bucket once, within SPOTWARP_STORAGE_CONNECT_TIMEOUT seconds in all (backends' own retries included)."""
        bucket = self.root.split("/")[0]
        deadline = env_float("SPOTWARP_STORAGE_CONNECT_TIMEOUT", 10.0)
        kwargs: dict[str, Any] = {"detail": False}
        if deadline > 0 and getattr(self.fs, "async_impl", False):
            kwargs["timeout"] = deadline  # fsspec's sync() cancels the listing (and its retries) then
        started = time.monotonic()
        try:
            # one attempt bounded by the deadline: the backend's own retries run inside it
            self._call("reaching the bucket", self.fs.ls, bucket, _failed="is unreachable",
                       _attempts=1 if "timeout" in kwargs else None, **kwargs)
        except StorageError as exc:
            if "FSTimeoutError" in str(exc) or "TimeoutError" in str(exc):
                raise StorageError(f"storage {self.url!r} is unreachable: no answer within "
                                   f"{time.monotonic() - started:.0f} s (SPOTWARP_STORAGE_CONNECT_TIMEOUT)") from None
            raise

    def _call(self, what: str, fn: Callable[..., T], *args: Any, cancel: threading.Event | None = None,
              _failed: str | None = None, _attempts: int | None = None, **kwargs: Any) -> T:
        """Run one storage operation, retrying transient failures; raise StorageError when attempts are spent.
        A call of the object store's filesystem is bounded in time as a whole (`_bounded`)."""
        if "timeout" not in kwargs and inspect.iscoroutinefunction(getattr(fn, "__wrapped__", None)):
            # fsspec's sync face of an async call, not bounded by the caller
            fn = self._bounded(fn, sum(memoryview(a).nbytes for a in args
                                       if isinstance(a, (bytes, bytearray, memoryview))))
        return call_with_retries(self.url, self.retry, what, fn, *args, cancel=cancel, failed=_failed,
                                 attempts=_attempts, **kwargs)

    def call_bound(self, nbytes: int = 0) -> float | None:
        """The seconds one call moving `nbytes` may take on an object store, the library's retries included
        (None: unbounded, on a local disk or with SPOTWARP_STORAGE_REQUEST_TIMEOUT=0)."""
        if self.local or self._request_timeout <= 0:
            return None
        return 2 * self._request_timeout + nbytes / SLOWEST_RATE

    def _bounded(self, fn: Callable[..., T], nbytes: int) -> Callable[..., T]:
        """`fn`, a call that runs on fsspec's event loop (it takes `timeout`), cancelled there when it outlasts
        `call_bound(nbytes)`.

        aiohttp's per-request timeouts do not run while a request waits for `100 Continue` (botocore asks it
        before every S3 upload) or while the server takes none of its body: a hung S3 server held a snapshot
        for good there. A call cut short is a timeout, retried like any other."""
        seconds = self.call_bound(nbytes)
        if seconds is None:
            return fn

        def bounded(*args: Any, **kwargs: Any) -> T:
            try:
                return fn(*args, timeout=seconds, **kwargs)
            except FSTimeoutError:
                # fsspec raises this for its own bound and for a request's timeout inside the call alike
                raise TimeoutError(f"no answer in time (each request waits up to {self._request_timeout:g} s, "
                                   f"this call up to {seconds:.0f} s; SPOTWARP_STORAGE_REQUEST_TIMEOUT)") from None

        return bounded

    def read_whole(self, what: str, path: str) -> bytes:
        """A whole stored file's bytes in one request, retried like any storage call.

        For what is small: objects under RANGED_READ_MIN, manifests, events (larger objects are ranged
        GETs). s3fs asks a size (a HEAD) before every GET without a range, to split big ones, unless the
        call says `max_concurrency=1`: on S3 that made two requests of every small read.
        """
        if self._s3:
            return self._call(what, self.fs.cat_file, path, max_concurrency=1)
        return self._call(what, self.fs.cat_file, path)

    def _write_local(self, what: str, path: str, data: Buffer) -> None:
        """A local atomic write; a full disk or a refusal becomes one StorageError line."""
        try:
            write_atomic(path, data)
        except OSError as exc:
            reason = exc.strerror or one_line(exc)
            raise StorageError(f"storage {self.url!r} failed while {what}: {reason}") from None

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
        size = memoryview(data).nbytes
        if not oid:
            with phase("hash", size):
                oid = object_id(data)
        path = self.object_path(oid)
        if self.local:
            if os.path.exists(path):
                pass
            elif pending is not None:
                try:
                    with phase("write", size):
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
            with phase("write", size):
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
        pipe_file = self._bounded(self.fs.pipe_file, size)
        if self._s3:
            body = data if isinstance(data, (bytes, bytearray)) else bytes(data)  # botocore wants bytes
            if size >= MULTIPART_THRESHOLD:
                # multipart, parts sent in parallel; invisible until completed, aborted on failure
                pipe_file(path, body, chunksize=PART_SIZE, max_concurrency=4)
            else:
                pipe_file(path, body)
        elif self._gcs:
            # resumable upload in 8 MiB chunks from 1 MiB up (one request below): the same speed on
            # GCS, and the emulator ingests large single-request bodies at a few MB/s
            if size >= GCS_RESUMABLE_THRESHOLD:
                chunksize = GCS_CHUNK_SIZE
            else:  # a chunk as large as the object makes it a resumable upload of one final chunk
                chunksize = size if GCSFS_DELIMITER in memoryview(data).tobytes() else size + 1
            pipe_file(path, data, chunksize=chunksize)
        else:
            pipe_file(path, data if isinstance(data, (bytes, bytearray)) else bytes(data))

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

    def read_object(self, oid: str, size: int | None = None) -> bytes | bytearray:
        """The object's bytes, checked against its hash (a large one from an object store as ranged GETs)."""
        if size is not None and self._reads_ranged(size):
            target = bytearray(size)
            self.read_object_into(oid, memoryview(target))
            return target
        path = self.object_path(oid)
        try:
            with phase("read", size or 0):
                data = self.read_whole("reading an object", path)
        except FileNotFoundError:
            raise DamagedObjectError(oid, "missing from storage") from None
        with phase("hash", len(data)):
            check_content(oid, data, size)
        return data

    def read_object_into(self, oid: str, target: memoryview) -> None:
        """Fill `target` with the object's bytes (no extra copy locally), checked against its hash."""
        path = self.object_path(oid)
        try:
            if self.local:
                read_local_checked(oid, path, target)
                return
            populate_for_copy(target)  # every byte below is copied in by the CPU
            if self._reads_ranged(target.nbytes):
                self._read_ranges_checked(oid, path, target)
                return
            with phase("read", target.nbytes):
                data = self.read_whole("reading an object", path)
        except FileNotFoundError:
            raise DamagedObjectError(oid, "missing from storage") from None
        if len(data) != target.nbytes:
            raise DamagedObjectError(oid, f"size differs from the manifest ({target.nbytes} bytes expected)")
        with phase("copy", target.nbytes):
            target[:] = data
        with phase("hash", target.nbytes):
            check_content(oid, target, target.nbytes)

    def _reads_ranged(self, size: int) -> bool:
        """Whether an object of `size` bytes is read as ranged GETs (from an object store, from RANGED_READ_MIN up)."""
        return (self._s3 or self._gcs) and size >= RANGED_READ_MIN

    def _read_ranges_checked(self, oid: str, path: str, target: memoryview) -> None:
        """Fill `target` from concurrent ranged GETs of the object, each body streamed into its place
        (ranged_reads.py), then check its hash.

        No request asks the size first: the last range asks for one byte past the end, so a stored object
        shorter or longer than the manifest says shows as a body of the wrong length.
        """
        size = target.nbytes
        starts = list(range(0, size, RANGE_SIZE))
        ends = [min(start + RANGE_SIZE, size) for start in starts]
        asked = ends[:-1] + [size + 1]
        reader = range_reader(self.fs, self._protocol)
        if reader is None:
            self._read_ranges_joined(oid, path, target, starts, ends, asked)
            return
        with phase("read", size):
            read = self._bounded(functools.partial(read_ranges_into, self.fs, reader), size)
            got = self._call("reading an object", read, path, starts, asked,
                             [target[start:end] for start, end in zip(starts, ends)])
        if any(n != end - start for start, end, n in zip(starts, ends, got)):
            raise DamagedObjectError(oid, f"size differs from the manifest ({size} bytes expected)")
        with phase("hash", size):
            check_content(oid, target, size)

    def _read_ranges_joined(self, oid: str, path: str, target: memoryview, starts: list[int], ends: list[int],
                            asked: list[int]) -> None:
        """`_read_ranges_checked` through `cat_ranges`, for a filesystem without a streaming reader: each piece
        arrives whole in new memory and is copied into `target`."""
        size = target.nbytes
        with phase("read", size):
            pieces = self._call("reading an object", self._bounded(self.fs.cat_ranges, size), [path] * len(starts),
                                starts, asked, on_error="raise")
        hasher = object_hasher()
        for start, end, piece in zip(starts, ends, pieces):
            if len(piece) != end - start:
                raise DamagedObjectError(oid, f"size differs from the manifest ({size} bytes expected)")
            with phase("copy", end - start):
                target[start:end] = piece
            with phase("hash", end - start):
                hasher.update(piece)
        if hasher.hexdigest() != oid:
            raise DamagedObjectError(oid, "content does not match its hash")

    def entries(self, folder: str = "") -> set[str]:
        """The names directly under `folder` of the storage URL ("" is the URL itself, where each project has
        its folder), files and folders alike; empty when nothing is there. Reads only: creates nothing."""
        path = posixpath.join(self.base, folder) if folder else self.base
        self.fs.invalidate_cache(path)
        try:
            listing = self._call("listing the storage", self.fs.ls, path, detail=False)
        except (FileNotFoundError, NotADirectoryError):
            return set()
        names = {posixpath.basename(str(n).rstrip("/")) for n in listing}
        return {n for n in names if n and TMP_MARK not in n}

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

    # -- manifests ------------------------------------------------------------------------
    def manifest_names(self) -> list[str]:
        """Names of committed manifests, oldest first (names sort by creation time)."""
        self.fs.invalidate_cache(self.snapshots_dir)
        try:
            names = self._call("listing snapshots", self.fs.ls, self.snapshots_dir, detail=False)
        except FileNotFoundError:
            return []
        out = [posixpath.basename(n.rstrip("/")) for n in names]
        return sorted(n for n in out if n.endswith(MANIFEST_SUFFIX) and TMP_MARK not in n)

    def manifest_times(self, names: Iterable[str]) -> dict[str, float | None]:
        """When the store says each of `names` was written (epoch seconds, the store's clock; None if unknown)."""
        wanted = set(names)
        if not wanted:
            return {}
        if self.local:
            out: dict[str, float | None] = {}
            for name in wanted:
                try:
                    out[name] = os.stat(posixpath.join(self.snapshots_dir, name)).st_mtime
                except FileNotFoundError:
                    out[name] = None
            return out
        self.fs.invalidate_cache(self.snapshots_dir)
        try:
            listing = self._call("listing snapshots", self.fs.ls, self.snapshots_dir, detail=True)
        except FileNotFoundError:
            return {n: None for n in wanted}
        times = {posixpath.basename(i["name"].rstrip("/")): modified(i) for i in listing}
        return {n: times.get(n) for n in wanted}

    def read_manifest(self, name: str) -> bytes:
        """The stored bytes of manifest `name` (FileNotFoundError if a gc dropped it meanwhile)."""
        return self.read_whole("reading a manifest", posixpath.join(self.snapshots_dir, name))

    def write_manifest(self, name: str, data: bytes) -> None:
        """Commit: a single atomic write (rename on local disks, one PUT on object stores).

        A retried PUT writes the same bytes again, so a lost reply cannot commit anything different.
        """
        path = posixpath.join(self.snapshots_dir, name)
        if self.local:
            self._write_local("committing a manifest", path, data)
        else:
            self._call("committing a manifest", self.fs.pipe_file, path, data)

    def delete_manifest(self, name: str) -> None:
        """Drop a committed manifest (gc); its objects stay until nothing names them."""
        try:
            self._call("deleting a manifest", self.fs.rm, posixpath.join(self.snapshots_dir, name))
        except FileNotFoundError:
            pass

    # -- locks (coordination/locks.py) -------------------------------------------------------------------
    def put_lock(self, name: str, data: bytes) -> None:
        """Write (or refresh) one lock object."""
        path = posixpath.join(self.locks_dir, name)
        if self.local:
            self._write_local("writing a lock", path, data)
        else:
            self._call("writing a lock", self.fs.pipe_file, path, data)

    def list_locks(self) -> dict[str, float | None]:
        """Every lock object: name -> when it was last written (epoch seconds, if known)."""
        if self.local:
            out: dict[str, float | None] = {}
            try:
                names = os.listdir(self.locks_dir)
            except FileNotFoundError:
                return out
            for name in names:
                if TMP_MARK in name or not name.endswith(".json"):
                    continue
                try:
                    out[name] = os.stat(os.path.join(self.locks_dir, name)).st_mtime
                except FileNotFoundError:
                    continue
            return out
        self.fs.invalidate_cache(self.locks_dir)
        try:
            listing = self._call("listing locks", self.fs.ls, self.locks_dir, detail=True)
        except FileNotFoundError:
            return {}
        return {posixpath.basename(i["name"].rstrip("/")): modified(i) for i in listing
                if i.get("type") != "directory" and i["name"].endswith(".json")}

    def delete_lock(self, name: str) -> None:
        """Remove one lock object (gone already is fine)."""
        try:
            self._call("removing a lock", self.fs.rm, posixpath.join(self.locks_dir, name))
        except FileNotFoundError:
            pass

    # -- small records: leases, heads, heartbeats, requests, watchers, events ------------------------------
    def record_path(self, area: str, name: str | None = None) -> str:
        """The path of `area` (a `Layout` name) of this project, or of the record `name` in it."""
        folder = posixpath.join(self.root, area)
        return folder if name is None else posixpath.join(folder, name)

    def read_record(self, path: str, limit: int = 1 << 20) -> bytes | None:
        """A small record's bytes, None when it is absent (listing caches are bypassed); ValueError when it is
        bigger than `limit` (never read whole then)."""
        try:
            if self.local:
                with open(path, "rb") as f:
                    data = f.read(limit + 1)
            else:
                self.fs.invalidate_cache(posixpath.dirname(path))
                data = self._call("reading " + posixpath.basename(path), self.fs.cat_file, path, start=0,
                                  end=limit + 1)
        except FileNotFoundError:
            return None
        if len(data) > limit:
            raise ValueError(f"{posixpath.basename(path)} is over {limit} bytes")
        return data

    def write_record(self, path: str, data: bytes, what: str | None = None) -> None:
        """Replace a small record in one atomic write (rename on disks, one PUT on object stores); `what` names
        the write in a failure's one line (default: `writing <name>`)."""
        if self.local:
            write_atomic(path, data)
        else:
            self._call(what or "writing " + posixpath.basename(path), self.fs.pipe_file, path, data)

    def create_record(self, path: str, data: bytes) -> bool:
        """Create a small record only if nothing is at `path` yet, atomically: True when this call created it.

        A local folder links a complete temporary to the name (`create_exclusive`); S3 sends `If-None-Match: *`,
        GCS `ifGenerationMatch=0` (fsspec's `mode="create"`). A retried request whose first try succeeded finds
        its own bytes: True.
        """
        if self.local:
            return create_exclusive(path, data)
        try:
            self._call("creating " + posixpath.basename(path), self.fs.pipe_file, path, data, mode="create")
            return True
        except FileExistsError:
            try:
                return self.read_record(path, limit=len(data)) == data  # our own earlier try whose answer was lost
            except ValueError:
                return False

    def delete_record(self, path: str, what: str) -> bool:
        """Remove one small record: True when it was there, False when it was gone already."""
        try:
            self._call(what, self.fs.rm, path)
            return True
        except FileNotFoundError:
            return False

    def record_names(self, folder: str, what: str) -> list[str]:
        """The names directly in `folder`, read fresh (temporaries included: callers pick by name); [] when the
        folder is absent."""
        try:
            if self.local:
                return self._call(what, os.listdir, folder)  # a file or a refused folder: one line, as elsewhere
            self.fs.invalidate_cache(folder)
            listing = self._call(what, self.fs.ls, folder, detail=False)
        except FileNotFoundError:
            return []
        return [posixpath.basename(str(n).rstrip("/")) for n in listing]

    def record_stamps(self, folder: str, what: str, accept: Callable[[str], bool]) -> dict[str, tuple[float | None, Any]]:
        """name -> (when the store says it was written, what tells this object from one re-created under its
        name: inode, ns mtime and size on a disk, the store's ETag / generation / checksum elsewhere) for the
        names in `folder` that `accept` takes, read fresh; {} when the folder is absent."""
        out: dict[str, tuple[float | None, Any]] = {}
        if self.local:
            for name in filter(accept, self.record_names(folder, what)):
                try:
                    st = os.stat(posixpath.join(folder, name))
                except FileNotFoundError:
                    continue
                out[name] = (st.st_mtime, (st.st_ino, st.st_mtime_ns, st.st_size))
            return out
        self.fs.invalidate_cache(folder)
        try:
            listing = self._call(what, self.fs.ls, folder, detail=True)
        except FileNotFoundError:
            return {}
        for info in listing:
            name = posixpath.basename(info["name"].rstrip("/"))
            if accept(name):
                tag = next((str(info[k]) for k in ("ETag", "etag", "generation", "md5Hash", "crc32c") if info.get(k)),
                           None)
                out[name] = (modified(info), tag)
        return out

    def record_modified(self, path: str, what: str) -> float | None:
        """When the store says the record at `path` was last written (epoch seconds); None if absent or unknown."""
        try:
            if self.local:
                return os.stat(path).st_mtime
            return modified(self._call(what, self.fs.info, path))
        except FileNotFoundError:
            return None

    # -- housekeeping ---------------------------------------------------------------------
    def stale_temporaries(self, older_than_s: float = TEMPORARY_GRACE_S) -> Iterator[str]:
        """Leftovers of interrupted local writes: old enough, or left by a process of this host that is gone.

        Object stores leave no temporaries (uploads are invisible until complete); their interrupted
        multipart uploads are cleared by `clear_interrupted_uploads`.
        """
        if not self.local:
            return iter(())
        return stale_temporaries((self.objects_dir, self.snapshots_dir, self.locks_dir), older_than_s)

    def delete_temporaries(self, older_than_s: float = TEMPORARY_GRACE_S) -> int:
        """Remove the `stale_temporaries` (gc); how many. One gone meanwhile is fine; any other failure is raised."""
        removed = 0
        for path in list(self.stale_temporaries(older_than_s)):
            try:
                os.remove(path)
                removed += 1
            except FileNotFoundError:
                pass
        return removed

    def sweep_temporaries(self) -> int:
        """Remove stale temporaries of interrupted local writes, once per Store (the first write); how many."""
        if not self.local or self._swept:
            return 0
        self._swept = True
        removed = 0
        for path in list(self.stale_temporaries()):
            try:
                os.unlink(path)
                removed += 1
            except OSError:
                continue
        if removed:
            log.info("storage %s: removed %d temporaries of interrupted writes", self.url, removed)
        return removed

    def interrupted_uploads(self) -> list[dict[str, Any]]:
        """Unfinished multipart uploads under this project (S3 only; they hold storage until aborted)."""
        lister = getattr(self.fs, "list_multipart_uploads", None)
        if lister is None:
            return []
        bucket, _, prefix = self.root.partition("/")
        uploads = self._call("listing interrupted uploads", lister, bucket)
        mine = prefix + "/" if prefix else ""
        return [u for u in uploads if str(u.get("Key", "")).startswith(mine)]

    def clear_interrupted_uploads(self, older_than_s: float = 3600.0) -> int:
        """Abort multipart uploads older than `older_than_s` (no live writer still owns them); return how many."""
        aborter = getattr(self.fs, "abort_mpu", None)
        if aborter is None:
            return 0
        bucket = self.root.split("/")[0]
        now = time.time()
        cleared = 0
        for upload in self.interrupted_uploads():
            started = modified({"created": upload.get("Initiated")})
            if started is not None and now - started < older_than_s:
                continue
            try:
                self._call("aborting an interrupted upload", aborter, bucket, upload["Key"], upload["UploadId"])
            except FileNotFoundError:
                pass
            cleared += 1
        return cleared



def modified(info: dict[str, Any]) -> float | None:
    """Modification time from an fsspec info dict, whatever the backend calls it."""
    for key in ("mtime", "LastModified", "updated", "mtime_ns", "created", "timeCreated"):
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


def check_content(oid: str, data: Buffer, size: int | None) -> None:
    """Raise DamagedObjectError unless `data` has the expected size and hashes to `oid`."""
    if size is not None and memoryview(data).nbytes != size:
        raise DamagedObjectError(oid, f"size {memoryview(data).nbytes} differs from the manifest's {size}")
    if object_id(data) != oid:
        raise DamagedObjectError(oid, "content does not match its hash")
