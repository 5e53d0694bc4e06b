"""Locks between snapshot writers and gc: small lock objects under `{project}/locks/`, honoured by both.

A writer reuses objects it found stored; gc deletes objects no manifest names. Without coordination a gc
can delete an object between a writer's presence check and its commit. The protocol (as restic's locks):

- every party first PUTs its own lock object, then lists the locks (stores list strongly consistently);
  so of a writer and a gc that overlap, at least one sees the other's lock;
- a gc that sees a live writer lock deletes no object (and stops deleting when one appears while it runs);
- a writer that sees a gc lock waits until that gc is done (or its lock has gone stale) before it checks
  which objects are stored, so no deletion of that gc can follow its checks;
- locks are refreshed in the background; one not refreshed for its stale time belongs to a dead process
  and is ignored (and removed by gc). A party whose own refreshes lapsed checks again before it acts.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import socket
import threading
import time
from typing import Any

from ..errors import StorageError
from ..settings import env_float as _env_float
from ..storage import HOST_TAG, Store

log = logging.getLogger("spotwarp")

WRITE, GC = "write", "gc"


def stale_after(kind: str) -> float:
    """Seconds without a refresh after which a lock of `kind` is taken for a dead process's."""
    if kind == GC:
        return max(2.0, _env_float("SPOTWARP_GC_LEASE_S", 60.0))
    return max(2.0, _env_float("SPOTWARP_WRITE_LEASE_S", 600.0))


def _kind_of(name: str) -> str:
    return name.split("-", 1)[0]


def live_locks(store: Store, kind: str, now: float | None = None) -> dict[str, float]:
    """Locks of `kind` refreshed within their stale time: name -> last refresh (epoch seconds)."""
    now = time.time() if now is None else now
    limit = stale_after(kind)
    out = {}
    for name, mtime in store.list_locks().items():
        if _kind_of(name) == kind and (mtime is None or now - mtime < limit):
            out[name] = mtime if mtime is not None else now
    return out


def stale_locks(store: Store, now: float | None = None) -> list[str]:
    """Locks of dead processes (not refreshed within their stale time)."""
    now = time.time() if now is None else now
    return [name for name, mtime in store.list_locks().items()
            if mtime is not None and now - mtime >= stale_after(_kind_of(name))]


class Lock:
    """This process's lock of one kind in one store, refreshed in the background while held."""

    def __init__(self, store: Store, kind: str):
        self.store = store
        self.kind = kind
        self.name = f"{kind}-{HOST_TAG}-{os.getpid()}-{secrets.token_hex(4)}.json"
        self.stale_s = stale_after(kind)
        self._refreshed = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def acquire(self) -> "Lock":
        """Write the lock and start refreshing it."""
        self._write()
        self._thread = threading.Thread(target=self._refresh_loop, name=f"spotwarp-lock-{self.kind}", daemon=True)
        self._thread.start()
        return self

    def _write(self) -> None:
        body = {"kind": self.kind, "host": socket.gethostname(), "pid": os.getpid(), "time": time.time()}
        self.store.put_lock(self.name, json.dumps(body).encode())
        self._refreshed = time.monotonic()

    def _refresh_loop(self) -> None:
        while not self._stop.wait(self.stale_s / 4):
            try:
                self._write()
            except Exception as exc:  # noqa: BLE001 - a lapsed lock is noticed by lapsed()
                log.warning("SpotWarp: could not refresh lock %s: %s", self.name, exc)

    def lapsed(self) -> bool:
        """True when the lock may have looked stale to others (refreshes failed or the process stood still)."""
        return time.monotonic() - self._refreshed > self.stale_s * 0.75

    def release(self) -> None:
        """Stop refreshing and remove the lock."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        try:
            self.store.delete_lock(self.name)
        except StorageError as exc:  # it goes stale and gc removes it
            log.warning("SpotWarp: could not remove lock %s: %s", self.name, exc)

    def __enter__(self) -> "Lock":
        return self.acquire()

    def __exit__(self, *exc: Any) -> None:
        self.release()


def wait_for_gc(store: Store, poll_s: float = 0.2) -> None:
    """After writing a write lock: wait until every gc that was running then has finished or gone stale.

    A gc that starts later lists our lock after writing its own, so it deletes nothing: no need to wait for it.
    A running gc stops deleting within a second of seeing our lock; one that holds on past
    SPOTWARP_GC_WAIT_S (default 300) fails this snapshot rather than risk it.
    """
    running = live_locks(store, GC)
    deadline = time.monotonic() + _env_float("SPOTWARP_GC_WAIT_S", 300.0)
    while running:
        if time.monotonic() > deadline:
            raise StorageError(f"storage {store.url!r}: a gc ({', '.join(sorted(running))}) still runs after "
                               "SPOTWARP_GC_WAIT_S: snapshot not taken; try again when it is done")
        time.sleep(poll_s)
        poll_s = min(poll_s * 1.5, 2.0)
        still = live_locks(store, GC)
        running = {name: t for name, t in still.items() if name in running}


class WriteLock(Lock):
    """What a snapshot writer holds from before its first presence check until its manifest is committed."""

    def __init__(self, store: Store):
        super().__init__(store, WRITE)

    def acquire(self) -> "WriteLock":
        super().acquire()
        try:
            wait_for_gc(self.store)
        except BaseException:
            self.release()
            raise
        return self
