"""Watches announce themselves: one `spotwarp launch --watch` / `spotwarp watch` per project (the preemption
watchers of a server are server/watchers/, another thing).

Each watch writes `{storage}/{project}/watchers/<id>.json` (`{id, host, pid, started, beat, time}`) every
`WATCHER_BEAT_S` seconds from a thread and deletes it when it ends. A new watch first looks for a live
one (an announcement whose `beat` changes, on this machine's monotonic clock) and refuses to start when
it finds one. Two failovers for one loss came from two watches racing the same generation.
"""

from __future__ import annotations

import json
import os
import re
import socket
import threading
import time
from typing import Any

from ..engine.coordination.heartbeats import record_ids
from ..engine.errors import SpotWarpError
from ..engine.signing import check_record, sign_record, signing_key
from ..engine.storage import Layout, Store
from .liveness import BeatClock

WATCHER_BEAT_S = 2.0
_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,100}$")


class AnotherWatch(SpotWarpError):
    """A live watch follows the project already."""


def watcher_id() -> str:
    host = "".join(c if c.isalnum() or c in "._-" else "-" for c in socket.gethostname())[:48] or "host"
    return f"{host}-{os.getpid()}"


def _path(store: Store, ident: str) -> str:
    return store.record_path(Layout.WATCHERS, f"{ident}.json")


def _name(ident: str) -> str:
    return f"{Layout.WATCHERS}/{ident}.json"


def _read(store: Store, ident: str) -> dict[str, Any] | None:
    """A watch's announcement; None when absent, damaged or (with SPOTWARP_KEY set) not signed with the key."""
    try:
        raw = store.read_record(_path(store, ident), limit=4096)
        doc = check_record(json.loads(raw), signing_key(), store.project, _name(ident)) if raw is not None else None
    except (ValueError, UnicodeDecodeError, RecursionError, SpotWarpError):
        return None
    if not isinstance(doc, dict) or not isinstance(doc.get("beat"), int) or isinstance(doc.get("beat"), bool):
        return None
    return doc


def watcher_ids(store: Store) -> list[str]:
    return record_ids(store, Layout.WATCHERS, "listing watchers", lambda ident: bool(_ID.match(ident)))[:100]


def live_watchers(store: Store, exclude: str | None = None, within: float = 2 * WATCHER_BEAT_S + 1.0,
                  stop: threading.Event | None = None, poll_s: float = 0.25) -> list[dict[str, Any]]:
    """The announcements of watches that are alive: each one's beat changes within `within` seconds."""
    ids = [i for i in watcher_ids(store) if i != exclude]
    if not ids:
        return []
    clocks = {i: BeatClock() for i in ids}
    for i in ids:
        clocks[i].see(_read(store, i))
    live: dict[str, dict[str, Any]] = {}
    deadline = time.monotonic() + within
    stop = stop or threading.Event()
    while len(live) < len(ids) and time.monotonic() < deadline and not stop.is_set():
        stop.wait(poll_s)
        for i, clock in clocks.items():
            if i not in live:
                doc = _read(store, i)
                if clock.see(doc) and doc is not None:
                    live[i] = doc
    return list(live.values())


class Announcement:
    """This watch's announcement, rewritten every WATCHER_BEAT_S seconds from a thread until `end`."""

    def __init__(self, store: Store, project: str, interval: float = WATCHER_BEAT_S):
        self.store, self.interval = store, interval
        self.id = watcher_id()
        self.doc: dict[str, Any] = {"id": self.id, "host": socket.gethostname(), "pid": os.getpid(),
                                    "project": project, "started": time.time(), "beat": 0}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="spotwarp-watcher", daemon=True)

    def start(self) -> "Announcement":
        self.beat()
        self._thread.start()
        return self

    def beat(self) -> None:
        self.doc["beat"] += 1
        self.doc["time"] = time.time()
        try:
            doc = sign_record(self.doc, signing_key(), self.store.project, _name(self.id))
            self.store.write_record(_path(self.store, self.id), json.dumps(doc, sort_keys=True).encode())
        except Exception:  # noqa: BLE001 - an unreachable store: the watch says so itself
            pass

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.beat()

    def end(self) -> None:
        self._stop.set()
        try:
            self.store.delete_record(_path(self.store, self.id), "removing the watcher")
        except Exception:  # noqa: BLE001 - gone already, or the store unreachable: it goes stale
            pass


def refuse_second_watch(store: Store, project: str, stop: threading.Event | None = None) -> None:
    """AnotherWatch (one line naming it) when a live watch follows `project` already."""
    live = live_watchers(store, stop=stop)
    if live:
        w = live[0]
        raise AnotherWatch(f"another watch follows project {project!r} already (host {w.get('host')}, pid "
                           f"{w.get('pid')}): run only one `spotwarp launch --watch` or `spotwarp watch` per project")
