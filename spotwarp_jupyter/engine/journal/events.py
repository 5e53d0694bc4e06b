"""The events journal: what happened to a project across hosts (notices, final snapshots, restores, resumes).

Object stores cannot append, so each event is one small immutable JSON object under
`{storage}/{project}/events/<time>-<event>-<random>.json`; names sort by time. The journal only feeds
`spotwarp report` and `spotwarp status`: a damaged event is skipped, never fatal. No Jupyter imports.
"""

from __future__ import annotations

import json
import logging
import posixpath
import secrets
import socket
import statistics
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Iterator, Sequence

from .manifest import Manifest
from .local_files import write_atomic
from .store import Store

log = logging.getLogger("spotwarp")

NOTICE_SEEN = "notice_seen"
FINAL_SNAPSHOT_COMMITTED = "final_snapshot_committed"
RESTORE_STARTED = "restore_started"
RESTORE_FINISHED = "restore_finished"
TRAINING_RESUMED = "training_resumed"
# failover (written by the orchestrator, `spotwarp launch`; see docs/failover.md)
HOST_LOST = "host_lost"
RACE_STARTED = "race_started"
CANDIDATE_READY = "candidate_ready"
PROMOTED = "promoted"
FAILOVER_FINISHED = "failover_finished"
EVENTS = (NOTICE_SEEN, FINAL_SNAPSHOT_COMMITTED, RESTORE_STARTED, RESTORE_FINISHED, TRAINING_RESUMED,
          HOST_LOST, RACE_STARTED, CANDIDATE_READY, PROMOTED, FAILOVER_FINISHED)
EVENTS_DIR = "events"


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
        self.dir = posixpath.join(store.root, EVENTS_DIR)
        self._read: dict[str, Event] = {}  # events are immutable: a long-lived reader fetches each once

    def record(self, event: str, snapshot: str | None = None, notebook: str | None = None,
               when: float | None = None, **details: Any) -> Event:
        """Write one event now (blocking I/O: call it off any event loop)."""
        if event not in EVENTS:
            raise ValueError(f"unknown event {event!r}: one of {', '.join(EVENTS)}")
        item = Event(event, time.time() if when is None else when, socket.gethostname(), snapshot, notebook,
                     {k: v for k, v in details.items() if v is not None})
        data = json.dumps(item.as_dict(), sort_keys=True).encode()
        path = posixpath.join(self.dir, item.name)
        if self.store.local:
            write_atomic(path, data)
        else:
            self.store._call("recording an event", self.store.fs.pipe_file, path, data)
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
        self.store.fs.invalidate_cache(self.dir)
        try:
            listing = self.store._call("listing events", self.store.fs.ls, self.dir, detail=False)
            names = sorted(posixpath.basename(p.rstrip("/")) for p in listing)
        except FileNotFoundError:
            return []
        names = [n for n in names if n.endswith(".json") and ".tmp-" not in n]
        out: list[Event] = []
        for name in reversed(names):  # newest first, so `limit` counts readable events
            if limit is not None and len(out) >= limit:
                break
            if name in self._read:
                out.append(self._read[name])
                continue
            try:
                raw = self.store._call("reading an event", self.store.fs.cat_file, posixpath.join(self.dir, name))
                self._read[name] = Event.from_dict(json.loads(raw))
                out.append(self._read[name])
            except FileNotFoundError:
                continue
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


# -- the report: what preemptions cost and what SpotWarp saved ------------------------------------------

def capture_time(manifests: Sequence[Manifest], snapshot_id: str | None, notebook: str | None) -> float | None:
    """When the kernel state in `snapshot_id` (for `notebook`) was captured.

    A project snapshot copies kernel records: the state's moment is that of the earliest snapshot holding the
    same record. A kernel snapshot's capture began `duration_s` before its commit.
    """
    by_id = {m.id: m for m in manifests}
    target = by_id.get(snapshot_id or "")
    if target is None:
        return None
    if notebook is None or notebook not in target.kernels:
        notebook = next(iter(target.kernels), None)
    if notebook is None:
        return target.created
    record = target.kernels[notebook]
    times = [m.created - (float(m.stats.get("duration_s") or 0) if m.kind == "kernel" else 0.0)
             for m in manifests if m.kernels.get(notebook) == record]
    return min(times) if times else target.created


def _first_fatal_notice_per_run(events: Sequence[Event]) -> list[tuple[Event, Event | None]]:
    """The first fatal notice of each server run, with that run's final snapshot (if one was committed)."""
    notices: dict[Any, Event] = {}
    finals: dict[Any, Event] = {}
    for e in events:
        run = (e.host, e.details.get("run"))
        if e.event == NOTICE_SEEN and e.details.get("fatal", True) and run not in notices:
            notices[run] = e
        elif e.event == FINAL_SNAPSHOT_COMMITTED and e.details.get("fatal", True) and run in notices \
                and run not in finals:
            finals[run] = e
    return [(n, finals.get(run)) for run, n in notices.items()]


def _work_origin(manifests: Sequence[Manifest]) -> float | None:
    """When the project's work began: its first snapshot, less the time a kernel snapshot took to capture."""
    return min((m.created - (float(m.stats.get("duration_s") or 0) if m.kind == "kernel" else 0.0)
                for m in manifests), default=None)


def _recovery(notice: Event, next_notice: float, restores: Sequence[Event], used: set[int],
              events: Sequence[Event]) -> tuple[Event | None, Event | None, Event | None]:
    """The recovery from one notice: the restore that began it, that restore's end, and the training resumed."""
    # the first restore after the notice on another run, before the next notice
    start = next((r for r in restores if notice.time <= r.time < next_notice and id(r) not in used
                  and (r.host, r.details.get("run")) != (notice.host, notice.details.get("run"))), None)
    if start is not None:
        used.add(id(start))
    later = [e for e in events if e.time >= (start.time if start else notice.time) and e.time < next_notice]
    finished = next((e for e in later if e.event == RESTORE_FINISHED and start is not None
                     and e.host == start.host and e.details.get("ok", True)), None)
    resumed = next((e for e in later if e.event == TRAINING_RESUMED), None)
    return start, finished, resumed


def _totals(rows: list[dict[str, Any]], events: Sequence[Event]) -> dict[str, Any]:
    survived_rows = [r for r in rows if r["survived"]]
    resumes = [r["resume_s"] for r in survived_rows if r["resume_s"] is not None]
    return {
        "preemptions": len(rows),
        "preemptions_survived": len(survived_rows),
        "work_lost_s": round(sum(r["work_lost_s"] or 0.0 for r in survived_rows), 3),
        "resume_s_median": round(statistics.median(resumes), 3) if resumes else None,
        "compute_saved_s": round(sum(r["compute_saved_s"] or 0.0 for r in survived_rows), 3),
        "warnings": sum(1 for e in events if e.event == NOTICE_SEEN and not e.details.get("fatal", True)),
    }


def report(events: Sequence[Event], manifests: Sequence[Manifest]) -> dict[str, Any]:
    """Per project: preemptions survived, work lost per event, time to resume, compute saved (see docs/preemption.md)."""
    events = sorted(events, key=lambda e: e.time)
    preemptions = _first_fatal_notice_per_run(events)
    restores = [e for e in events if e.event == RESTORE_STARTED]
    rows: list[dict[str, Any]] = []
    embodied = 0.0  # compute held by the restored state: what restarting from scratch would have to redo
    work_since = _work_origin(manifests)  # when the current run's work started
    used: set[int] = set()
    for index, (notice, final) in enumerate(preemptions):
        next_notice = preemptions[index + 1][0].time if index + 1 < len(preemptions) else float("inf")
        start, finished, resumed = _recovery(notice, next_notice, restores, used, events)
        restored_id = (resumed.snapshot if resumed and resumed.snapshot else None) or (start.snapshot if start else None)
        captured = capture_time(manifests, restored_id, resumed.notebook if resumed else None)
        alive_until = final.time if final is not None else notice.time
        running_again = resumed or finished
        saved = None
        if running_again is not None and captured is not None and work_since is not None:
            embodied += max(0.0, captured - work_since)
            saved = round(embodied, 3)
            work_since = running_again.time
        rows.append({
            "notice": notice.as_dict()["time"], "host": notice.host, "source": notice.details.get("source"),
            "final_snapshot": final.snapshot if final else None,
            "notice_to_final_s": final.details.get("notice_to_commit_s") if final else None,
            "restored_snapshot": restored_id, "restored_on": start.host if start else (resumed.host if resumed else None),
            "survived": running_again is not None,
            "work_lost_s": None if captured is None else round(max(0.0, alive_until - captured), 3),
            "resume_s": round(running_again.time - start.time, 3) if running_again and start else None,
            "compute_saved_s": saved,
            "resumed_at_step": resumed.details.get("position") if resumed else None,
        })
    return {**_totals(rows, events), "events": rows, "failovers": failover_rows(events)}


def failover_rows(events: Sequence[Event]) -> list[dict[str, Any]]:
    """One row per race of `spotwarp launch`: why, and detect / provision / restore-and-serve / total seconds."""
    rows = []
    for e in events:
        if e.event != FAILOVER_FINISHED:
            continue
        d = e.details
        rows.append({
            "time": e.as_dict()["time"], "race": d.get("race"), "reason": d.get("reason"), "lost": d.get("lost"),
            "provider": d.get("provider"), "generation": d.get("generation"), "ok": d.get("ok", False),
            "winner": d.get("winner"), "offer": d.get("offer"), "detect_s": d.get("detect_s"),
            "provision_s": d.get("provision_s"), "restore_serve_s": d.get("restore_serve_s"),
            "total_s": d.get("total_s"), "error": d.get("error"), "candidates": d.get("candidates") or [],
        })
    return rows
