"""The events journal: what happened to a project across hosts (notices, final snapshots, restores, resumes).

Object stores cannot append, so each event is one small immutable JSON object under
`{storage}/{project}/events/<time>-<event>-<random>.json`; names sort by time. The journal feeds `spotwarp
report` and `spotwarp status`, and the failover watch (notices, final snapshots): with SPOTWARP_KEY set, events
are signed and unsigned or altered ones are skipped (engine.signing). A damaged event is skipped, never fatal.
No Jupyter imports.
"""

from __future__ import annotations

import json
import logging
import posixpath
import secrets
import socket
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Iterator

from ..signing import RecordRefused, check_record, sign_record, signing_key
from ..storage import Layout, Store

log = logging.getLogger("spotwarp")

NOTICE_SEEN = "notice_seen"
FINAL_SNAPSHOT_COMMITTED = "final_snapshot_committed"
RESTORE_STARTED = "restore_started"
RESTORE_FINISHED = "restore_finished"
TRAINING_RESUMED = "training_resumed"
KERNEL_RESUMED = "kernel_resumed"  # a new host's server re-ran an interrupted cell by itself (docs/resume.md)
# a new host resumed from a host that stopped with no fatal notice recorded (a SIGKILL, a host lost): a preemption
PREEMPTION_DETECTED = "preemption_detected"
# failover (written by the orchestrator, `spotwarp launch`; see docs/failover.md)
HOST_LOST = "host_lost"
RACE_STARTED = "race_started"
CANDIDATE_READY = "candidate_ready"
PROMOTED = "promoted"
FAILOVER_FINISHED = "failover_finished"
EVENTS = (NOTICE_SEEN, FINAL_SNAPSHOT_COMMITTED, RESTORE_STARTED, RESTORE_FINISHED, TRAINING_RESUMED, KERNEL_RESUMED,
          PREEMPTION_DETECTED, HOST_LOST, RACE_STARTED, CANDIDATE_READY, PROMOTED, FAILOVER_FINISHED)
_REFUSED: set[tuple[str, str]] = set()  # (events folder, name) of events refused in this process: read and said once


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@dataclass
class Event:
    """One thing that happened: which, when, where, about which snapshot and notebook."""

    event: str
    time: float
    host: str
    snapshot: str | None = None
    notebook: str | None = None
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def name(self) -> str:
        """The stored name; names sort by time."""
        stamp = datetime.fromtimestamp(self.time, timezone.utc).strftime("%Y%m%dT%H%M%S")
        return f"{stamp}{int(self.time * 1000) % 1000:03d}Z-{self.event}-{secrets.token_hex(4)}.json"

    def as_dict(self) -> dict[str, Any]:
        return {"event": self.event, "time": _iso(self.time), "time_ts": self.time, "host": self.host,
                "snapshot": self.snapshot, "notebook": self.notebook, "details": self.details}

    @classmethod
    def from_dict(cls, doc: Any) -> "Event":
        if not isinstance(doc, dict) or doc.get("event") not in EVENTS:
            raise ValueError("not an event")
        details = doc.get("details") or {}
        if not isinstance(details, dict):
            raise ValueError("details is not an object")
        return cls(event=doc["event"], time=float(doc["time_ts"]), host=str(doc.get("host") or "?"),
                   snapshot=doc.get("snapshot"), notebook=doc.get("notebook"), details=details)


class Journal:
    """The events of one project in one store."""

    def __init__(self, store: Store):
        self.store = store
        self.dir = store.record_path(Layout.EVENTS)
        self._read: dict[str, Event] = {}  # events are immutable: a long-lived reader fetches each once
        self._refused: set[str] = set()

    def record(self, event: str, snapshot: str | None = None, notebook: str | None = None,
               when: float | None = None, **details: Any) -> Event:
        """Write one event now (blocking I/O: call it off any event loop)."""
        if event not in EVENTS:
            raise ValueError(f"unknown event {event!r}: one of {', '.join(EVENTS)}")
        item = Event(event, time.time() if when is None else when, socket.gethostname(), snapshot, notebook,
                     {k: v for k, v in details.items() if v is not None})
        # signed with SPOTWARP_KEY when set: notices and final snapshots drive failover (docs/failover.md)
        name = item.name  # a new random suffix at each call: the name signed is the name written
        doc = sign_record(item.as_dict(), signing_key(), self.store.project, f"{Layout.EVENTS}/{name}")
        data = json.dumps(doc, sort_keys=True).encode()
        self.store.write_record(posixpath.join(self.dir, name), data, "recording an event")
        return item

    def record_soon(self, event: str, snapshot: str | None = None, notebook: str | None = None,
                    fence: Any = None, **details: Any) -> threading.Thread:
        """Write one event from a background thread (kernels: never hold up the user's loop); errors are logged.

        With `fence` (engine.fence.Fence), nothing is written unless this host may write to the project.
        """
        when = time.time()

        def write() -> None:
            try:
                if fence is not None:
                    fence.check(self.store)
                self.record(event, snapshot, notebook, when=when, **details)
            except Exception as exc:  # noqa: BLE001 - the journal is a record, never a reason to fail
                log.warning("SpotWarp: event %s not recorded: %s", event, exc)

        thread = threading.Thread(target=write, name=f"spotwarp-event-{event}", daemon=True)
        thread.start()
        return thread

    def events(self, limit: int | None = None) -> list[Event]:
        """Recorded events, oldest first (the newest `limit` when given); damaged ones are skipped."""
        names = sorted(n for n in self.store.record_names(self.dir, "listing events")
                       if n.endswith(".json") and ".tmp-" not in n)
        key = signing_key()
        out: list[Event] = []
        for name in reversed(names):  # newest first, so `limit` counts readable events
            if limit is not None and len(out) >= limit:
                break
            if name in self._read:
                out.append(self._read[name])
                continue
            if name in self._refused or (self.dir, name) in _REFUSED:
                continue
            try:
                raw = self.store.read_whole("reading an event", posixpath.join(self.dir, name))
                doc = check_record(json.loads(raw), key, self.store.project, f"{Layout.EVENTS}/{name}")
                self._read[name] = Event.from_dict(doc)
                out.append(self._read[name])
            except FileNotFoundError:
                continue
            except RecordRefused as exc:  # someone without the key: it drives nothing, and is said once
                self._refused.add(name)
                if len(_REFUSED) < 10_000 and (self.dir, name) not in _REFUSED:
                    _REFUSED.add((self.dir, name))
                    log.warning("SpotWarp: event skipped: %s", exc)
            except (ValueError, TypeError, KeyError, UnicodeDecodeError) as exc:
                log.warning("SpotWarp: skipping damaged event %s: %s", name, exc)
        out.sort(key=lambda e: e.time)
        return out


@contextmanager
def restoring(store: Store, snapshot: str, what: str = "files", **details: Any) -> Iterator[dict[str, Any]]:
    """Record restore_started, run the restore, then restore_finished (with what the caller adds to the dict)."""
    journal = Journal(store)
    started = time.time()
    _quietly(journal.record, RESTORE_STARTED, snapshot, what=what, **details)
    outcome: dict[str, Any] = {}
    try:
        yield outcome
    except BaseException as exc:
        _quietly(journal.record, RESTORE_FINISHED, snapshot, what=what, ok=False, error=f"{type(exc).__name__}: {exc}",
                 duration_s=round(time.time() - started, 3))
        raise
    _quietly(journal.record, RESTORE_FINISHED, snapshot, what=what, ok=True, duration_s=round(time.time() - started, 3),
             **outcome)


def _quietly(fn, *args: Any, **kwargs: Any) -> None:
    try:
        fn(*args, **kwargs)
    except Exception as exc:  # noqa: BLE001 - a restore must not fail because its record could not be written
        log.warning("SpotWarp: event not recorded: %s", exc)
