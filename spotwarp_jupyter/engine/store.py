"""Immutable, content-addressed objects and snapshot manifests on any fsspec filesystem.

Layout under `{storage}/{project}/`:
  objects/ab/<blake3>          one immutable blob each, named by its content hash
  snapshots/<time>-<id>.json   one manifest per committed snapshot, written last
  locks/<kind>-<host>-...json  leases of writers and gc in progress (see leases.py)
A snapshot exists only once its manifest exists; a manifest names only objects already durable.

On object stores (gcsfs, s3fs) there is no atomic rename, and none is needed: every object is one
PUT (or one multipart upload), visible only when complete, and the commit is a single PUT of the
manifest made after every object it names has been stored. Transient failures (connection resets,
timeouts, 5xx, throttling) are retried with exponential backoff; when the attempts are spent the
caller gets one StorageError line and no manifest is written.
"""

from __future__ import annotations

import logging
import os
import posixpath
import random
import secrets
import socket
import threading
import time
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from datetime import datetime
from typing import Any, Callable, Iterable, Iterator, TypeVar

# gcsfs probes for hierarchical-namespace buckets over gRPC unless told not to; against emulators and
# most buckets that probe waits out a 60 s timeout per bucket call. Must be set before gcsfs is imported.
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")

import fsspec  # noqa: E402
from fsspec.implementations.local import LocalFileSystem  # noqa: E402

from .backends import check_backend  # noqa: E402
from .errors import DamagedObjectError, StorageError  # noqa: E402
from .hashing import Buffer, is_object_id, object_id  # noqa: E402

log = logging.getLogger("spotwarp")

MANIFEST_SUFFIX = ".json"
_TMP_MARK = ".tmp-"
TEMPORARY_GRACE_S = 3600.0
# this host in temporaries' and locks' names (no '-': the name's parts are split on it)
HOST_TAG = "".join(c if c.isalnum() else "_" for c in socket.gethostname())[:40] or "host"
T = TypeVar("T")

# On S3, objects above this size go up as multipart uploads in parts of PART_SIZE, sent in parallel.
# Chunks of large buffers are 64 MiB (persist.CHUNK_SIZE), so this catches big pickle streams.
MULTIPART_THRESHOLD = 64 * 1024 * 1024 + 1
PART_SIZE = 16 * 1024 * 1024
# Objects from this size up are looked for before they are sent (smaller ones are just sent).
ASK_BEFORE_UPLOAD = 8 * 1024 * 1024
# On GCS, objects from this size up go as resumable uploads in chunks of GCS_CHUNK_SIZE (a multiple of 256 KiB).
GCS_RESUMABLE_THRESHOLD = 1024 * 1024
GCS_CHUNK_SIZE = 8 * 1024 * 1024


def _env_int(name: str, default: int, lowest: int) -> int:
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    try:
        return max(lowest, int(text))
    except ValueError:
        log.warning("ignoring %s=%r: not a whole number", name, text)
        return default


def _env_float(name: str, default: float) -> float:
    text = os.environ.get(name, "").strip()
    try:
        return max(0.0, float(text)) if text else default
    except ValueError:
        log.warning("ignoring %s=%r: not a number", name, text)
        return default


def _modified(info: dict[str, Any]) -> float | None:
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


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    if len(text) > 300:
        text = text[:297] + "..."
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


_PERMANENT = (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError, FileExistsError,
              ValueError, TypeError, KeyError, AttributeError, NotImplementedError, DamagedObjectError, StorageError)


_TRANSIENT_WORDS = ("connect", "timeout", "disconnect", "payload", "throttl", "unavailable", "incomplete",
                    "reset", "protocolerror", "chunkedencoding", "brokenpipe")


def is_transient(exc: BaseException) -> bool:
    """True for failures worth retrying: connection trouble, timeouts, throttling, server errors."""
    code = getattr(exc, "code", None) or getattr(exc, "status", None)
    if isinstance(code, int) and 400 <= code < 600:
        return code in (408, 429) or code >= 500
    if isinstance(exc, _PERMANENT):
        return False
    if isinstance(exc, (OSError, TimeoutError, ConnectionError)):
        return True  # socket errors, and s3fs's translation of 5xx / SlowDown
    # backend exception types (botocore, aiohttp, requests) we cannot import without requiring them
    names = " ".join(t.__name__.lower() for t in type(exc).__mro__)
    return any(word in names for word in _TRANSIENT_WORDS)


class RetryPolicy:
    """How often and how patiently a storage call is retried (SPOTWARP_STORAGE_RETRIES / _BACKOFF)."""

    def __init__(self, attempts: int = 3, backoff_s: float = 0.5, max_backoff_s: float = 8.0):
        self.attempts = attempts
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s

    @classmethod
    def from_env(cls) -> "RetryPolicy":
        """Attempts per call from SPOTWARP_STORAGE_RETRIES (default 3), first pause from SPOTWARP_STORAGE_BACKOFF."""
        return cls(_env_int("SPOTWARP_STORAGE_RETRIES", 3, 1), _env_float("SPOTWARP_STORAGE_BACKOFF", 0.5))

    def pause(self, attempt: int) -> float:
        """Seconds to wait after failed attempt number `attempt` (1-based): exponential, with jitter."""
        return min(self.max_backoff_s, self.backoff_s * 2 ** (attempt - 1)) * (0.5 + random.random() / 2)


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
        try:
            self._fs, base = fsspec.core.url_to_fs(url, **options)
            self._fs_pid = os.getpid()
        except (ImportError, ValueError, TypeError) as exc:
            raise StorageError(f"cannot use storage {url!r}: {_one_line(exc)}") from None
        except Exception as exc:  # noqa: BLE001 - any backend failure is a storage error
            raise StorageError(f"cannot open storage {url!r}: {_one_line(exc)}") from None
        self.local = isinstance(self.fs, LocalFileSystem)
        self._s3 = protocol in ("s3", "s3a")
        self._gcs = protocol in ("gs", "gcs")
        self.retry = RetryPolicy(attempts=1) if self.local else RetryPolicy.from_env()
        self.workers = _env_int("SPOTWARP_STORAGE_WORKERS", 2 if self.local else 8, 1)
        self.base = base.rstrip("/")
        self.root = posixpath.join(self.base, project) if base else project
        self.objects_dir = posixpath.join(self.root, "objects")
        self.snapshots_dir = posixpath.join(self.root, "snapshots")
        self.locks_dir = posixpath.join(self.root, "locks")
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
            raise StorageError(f"storage {self.url!r} refuses access (check credentials): {_one_line(exc)}") from None
        except Exception as exc:  # noqa: BLE001
            raise StorageError(f"storage {self.url!r} is unreachable: {_one_line(exc)}") from None

    def _reach(self) -> None:
        """List the bucket once, within SPOTWARP_STORAGE_CONNECT_TIMEOUT seconds in all (backends' own retries included)."""
        bucket = self.root.split("/")[0]
        deadline = _env_float("SPOTWARP_STORAGE_CONNECT_TIMEOUT", 10.0)
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
        """Run one storage operation, retrying transient failures; raise StorageError when attempts are spent."""
        failed = _failed or f"failed while {what}"
        attempt = 0
        while True:
            attempt += 1
            try:
                return fn(*args, **kwargs)
            except (FileNotFoundError, DamagedObjectError, StorageError):
                raise
            except PermissionError as exc:
                raise StorageError(f"storage {self.url!r} refuses access (check credentials) while {what}: "
                                   f"{_one_line(exc)}") from None
            except Exception as exc:  # noqa: BLE001
                if not is_transient(exc) or attempt >= (_attempts or self.retry.attempts) or (cancel is not None and cancel.is_set()):
                    tries = f" after {attempt} attempts" if attempt > 1 else ""
                    raise StorageError(f"storage {self.url!r} {failed}{tries}: {_one_line(exc)}") from None
                pause = self.retry.pause(attempt)
                log.info("storage %s: %s failed (%s); retry %d in %.1fs", self.url, what, _one_line(exc), attempt, pause)
                if cancel is not None:
                    if cancel.wait(pause):
                        raise StorageError(f"storage {self.url!r} {failed}: {_one_line(exc)}") from None
                else:
                    time.sleep(pause)

    # -- objects --------------------------------------------------------------------------
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

    def put_object(self, data: Buffer, oid: str | None = None, cancel: threading.Event | None = None) -> tuple[str, int]:
        """Store `data` under its hash unless already there; return (id, size)."""
        oid = oid or object_id(data)
        size = memoryview(data).nbytes
        path = self.object_path(oid)
        if self.local:
            if not os.path.exists(path):
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
        if len(buffers) == 1 or workers == 1:
            return [self.put_object(b) for b in buffers]
        cancel = threading.Event()
        failures: list[BaseException] = []

        def put(data: Buffer) -> tuple[str, int]:
            if cancel.is_set():
                raise StorageError(f"storage {self.url!r}: upload abandoned after an earlier failure")
            try:
                return self.put_object(data, cancel=cancel)
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
        self._check_content(oid, data, size)
        return data

    def read_object_into(self, oid: str, target: memoryview) -> None:
        """Fill `target` with the object's bytes (no extra copy locally), checked against its hash."""
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
        self.fs.invalidate_cache(self.objects_dir)
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
        return sorted(n for n in out if n.endswith(MANIFEST_SUFFIX) and _TMP_MARK not in n)

    def read_manifest(self, name: str) -> bytes:
        """The stored bytes of manifest `name` (FileNotFoundError if a gc dropped it meanwhile)."""
        return self._call("reading a manifest", self.fs.cat_file, posixpath.join(self.snapshots_dir, name))

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

    # -- locks (leases.py) -------------------------------------------------------------------
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
                if _TMP_MARK in name or not name.endswith(".json"):
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
        return {posixpath.basename(i["name"].rstrip("/")): _modified(i) for i in listing
                if i.get("type") != "directory" and i["name"].endswith(".json")}

    def delete_lock(self, name: str) -> None:
        """Remove one lock object (gone already is fine)."""
        try:
            self._call("removing a lock", self.fs.rm, posixpath.join(self.locks_dir, name))
        except FileNotFoundError:
            pass

    # -- housekeeping ---------------------------------------------------------------------
    def stale_temporaries(self, older_than_s: float = TEMPORARY_GRACE_S) -> Iterator[str]:
        """Leftovers of interrupted local writes: old enough, or left by a process of this host that is gone.

        Object stores leave no temporaries (uploads are invisible until complete); their interrupted
        multipart uploads are cleared by `clear_interrupted_uploads`.
        """
        if not self.local:
            return
        now = time.time()
        for top in (self.objects_dir, self.snapshots_dir, self.locks_dir):
            for dirpath, _dirs, files in os.walk(top):
                for name in files:
                    if _TMP_MARK in name:
                        path = os.path.join(dirpath, name)
                        try:
                            if now - os.path.getmtime(path) > older_than_s or _writer_gone(name):
                                yield path
                        except OSError:
                            continue

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
            started = _modified({"created": upload.get("Initiated")})
            if started is not None and now - started < older_than_s:
                continue
            try:
                self._call("aborting an interrupted upload", aborter, bucket, upload["Key"], upload["UploadId"])
            except FileNotFoundError:
                pass
            cleared += 1
        return cleared

    def _write_local(self, what: str, path: str, data: Buffer) -> None:
        """A local atomic write; a full disk or a refusal becomes one StorageError line."""
        try:
            self._write_local_atomic(path, data)
        except OSError as exc:
            reason = exc.strerror or _one_line(exc)
            raise StorageError(f"storage {self.url!r} failed while {what}: {reason}") from None

    @staticmethod
    def _write_local_atomic(path: str, data: Buffer) -> None:
        directory = os.path.dirname(path)
        os.makedirs(directory, exist_ok=True)
        tmp = f"{path}{_TMP_MARK}{HOST_TAG}-{os.getpid()}-{secrets.token_hex(4)}"
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


def _writer_gone(name: str) -> bool:
    """True when a temporary's name says it was written by a process of this host that no longer runs."""
    parts = name.rsplit(_TMP_MARK, 1)[-1].split("-")
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
