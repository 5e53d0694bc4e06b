"""Immutable, content-addressed objects and snapshot manifests on any fsspec filesystem.

Layout under `{storage}/{project}/`:
  objects/ab/<blake3>          one immutable blob each, named by its content hash (object_io.py)
  snapshots/<time>-<id>.json   one manifest per committed snapshot, written last (store_records.py)
  locks/<kind>-<host>-...json  leases of writers and gc in progress (see leases.py)
A snapshot exists only once its manifest exists; a manifest names only objects already durable.

On object stores (gcsfs, s3fs) there is no atomic rename, and none is needed: every object is one
PUT (or one multipart upload), visible only when complete, and the commit is a single PUT of the
manifest made after every object it names has been stored. Transient failures (connection resets,
timeouts, 5xx, throttling) are retried with exponential backoff (retries.py); when the attempts are
spent the caller gets one StorageError line and no manifest is written.
"""

from __future__ import annotations

import logging
import os
import posixpath
import threading
import time
from typing import Any, Callable, TypeVar

# gcsfs probes for hierarchical-namespace buckets over gRPC unless told not to; against emulators and
# most buckets that probe waits out a 60 s timeout per bucket call. Must be set before gcsfs is imported.
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")

import fsspec  # noqa: E402
from fsspec.implementations.local import LocalFileSystem  # noqa: E402

from .backends import check_backend  # noqa: E402
from .errors import StorageError  # noqa: E402
from .hashing import Buffer  # noqa: E402
from .local_files import HOST_TAG, TEMPORARY_GRACE_S, write_atomic  # noqa: E402
from .object_io import (  # noqa: E402,F401 - the names callers import from here
    ASK_BEFORE_UPLOAD, GCS_CHUNK_SIZE, GCS_RESUMABLE_THRESHOLD, MULTIPART_THRESHOLD, PART_SIZE, ObjectIO,
)
from .retries import RetryPolicy, call_with_retries, env_float, env_int, is_transient, log, one_line  # noqa: E402,F401
from .store_records import MANIFEST_SUFFIX, StoreRecords  # noqa: E402,F401

T = TypeVar("T")
__all__ = ["HOST_TAG", "MANIFEST_SUFFIX", "RetryPolicy", "Store", "TEMPORARY_GRACE_S", "is_transient"]


class Store(ObjectIO, StoreRecords):
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
            raise StorageError(f"cannot use storage {url!r}: {one_line(exc)}") from None
        except Exception as exc:  # noqa: BLE001 - any backend failure is a storage error
            raise StorageError(f"cannot open storage {url!r}: {one_line(exc)}") from None
        self.local = isinstance(self.fs, LocalFileSystem)
        self._s3 = protocol in ("s3", "s3a")
        self._gcs = protocol in ("gs", "gcs")
        self.retry = RetryPolicy(attempts=1) if self.local else RetryPolicy.from_env()
        self.workers = env_int("SPOTWARP_STORAGE_WORKERS", 2 if self.local else 8, 1)
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
        """Run one storage operation, retrying transient failures; raise StorageError when attempts are spent."""
        return call_with_retries(self.url, self.retry, what, fn, *args, cancel=cancel, failed=_failed,
                                 attempts=_attempts, **kwargs)

    def _write_local(self, what: str, path: str, data: Buffer) -> None:
        """A local atomic write; a full disk or a refusal becomes one StorageError line."""
        try:
            write_atomic(path, data)
        except OSError as exc:
            reason = exc.strerror or one_line(exc)
            raise StorageError(f"storage {self.url!r} failed while {what}: {reason}") from None
