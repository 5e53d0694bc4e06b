"""Pruning (`gc`): drop old snapshots, then the objects no manifest names (restic's `prune`, never what a live snapshot uses).

Objects are kept when any manifest present names them, accepted or not (unsigned, another key's, damaged but
readable); none is deleted while a manifest cannot be read at all, while a snapshot is being written
(coordination/locks.py), or when younger than the grace period (a writer may be about to commit them).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from .coordination import GC, WRITE, Lock, live_locks, stale_locks
from .errors import SpotWarpError
from .hashing import is_object_id
from .manifests import RECORD, Manifest, ManifestCatalog, record_chunks
from .storage import TEMPORARY_GRACE_S, Store
from .units import format_duration, format_size


@dataclass
class GcReport:
    """What `gc` dropped and kept."""

    kept: list[str] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)
    objects_deleted: int = 0
    bytes_freed: int = 0
    objects_left: str | None = None  # why no (or not every) unreferenced object was deleted, in one line
    objects_in_grace: int = 0  # unreferenced objects left because they are younger than the grace period
    bytes_in_grace: int = 0


def named_objects(doc: Any) -> set[str]:
    """Every object id anywhere in a parsed manifest (keys and values): what gc must keep for it."""
    found: set[str] = set()
    stack = [doc]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            found.update(k for k in item if isinstance(k, str) and is_object_id(k))
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, str) and is_object_id(item):
            found.add(item)
    return found


def collect_garbage(store: Store, catalog: ManifestCatalog, keep: int, grace_s: float = 3600.0) -> GcReport:
    """Drop all but the newest `keep` snapshots (and each notebook's newest), then objects no manifest names.

    The caller keeps its own snapshots of this project from committing meanwhile (SnapshotEngine holds its lock).
    """
    if keep < 1:
        raise SpotWarpError("--keep must be at least 1: gc never deletes the newest snapshot")
    with Lock(store, GC) as lease:
        report = GcReport()
        writers = live_locks(store, WRITE)
        listing = catalog.manifests()
        kept, dropped = _choose(listing, keep)
        for m in dropped:
            store.delete_manifest(m.name)
            catalog.forget(m.name)
            report.dropped.append(m.id)
        report.kept = [m.id for m in kept]
        if writers:
            report.objects_left = (f"no object deleted: {len(writers)} snapshot(s) being written "
                                   "(gc deletes objects when no snapshot is in progress)")
        else:
            live, unreadable = _named_by_every_manifest(store)
            if unreadable:
                more = f" nor {len(unreadable) - 1} more" if len(unreadable) > 1 else ""
                report.objects_left = (f"no object deleted: snapshot manifest {unreadable[0]} cannot be read "
                                       f"(not valid JSON, or its files record cannot be read){more}: gc keeps every object while a manifest might name it")
            else:
                _delete_unnamed(store, live, grace_s, lease, report)
        _clear_leftovers(store, grace_s, lease)
        return report


def _choose(listing: list[Manifest], keep: int) -> tuple[list[Manifest], list[Manifest]]:
    """The snapshots to keep and to drop: the newest `keep`, plus the newest with files and each notebook's newest."""
    kept, dropped = listing[:keep], listing[keep:]
    # the newest snapshot holding workspace files is what a new host restores from: never drop it
    files = next((m for m in listing if (m.files or {}).get("entries") is not None), None)
    if files is not None and files in dropped:
        dropped.remove(files)
        kept.append(files)
    # each notebook's newest state too: one kernel's --keep must not take another notebook's away
    for notebook in {nb for m in listing for nb in m.kernels}:
        newest = next(m for m in listing if notebook in m.kernels)
        if newest in dropped:
            dropped.remove(newest)
            kept.append(newest)
    # each collective loop's newest (docs/distributed.md): what its ranks continue from
    for loop in {str(m.collective.get("name")) for m in listing if m.collective}:
        newest = next(m for m in listing if m.collective and str(m.collective.get("name")) == loop)
        if newest in dropped:
            dropped.remove(newest)
            kept.append(newest)
    # a variable that failed to restore is carried forward marked damaged: the snapshot that holds it stays
    holders = {str(info.get("from")) for m in kept for record in m.kernels.values() if isinstance(record, dict)
               for info in (record.get("damaged") or {}).values() if isinstance(info, dict)}
    for m in [m for m in dropped if m.id in holders]:
        dropped.remove(m)
        kept.append(m)
    return kept, dropped


def _named_by_every_manifest(store: Store) -> tuple[set[str], list[str]]:
    """Object ids any manifest present names (read afresh, trusted or not), and manifests that cannot be parsed."""
    live: set[str] = set()
    unreadable: list[str] = []
    for name in store.manifest_names():
        try:
            data = store.read_manifest(name)
        except FileNotFoundError:
            continue  # dropped meanwhile by another gc
        try:
            doc = json.loads(data)
        except (ValueError, UnicodeDecodeError):
            unreadable.append(name)
            continue
        live |= named_objects(doc)
        record = (doc.get("files") or {}).get(RECORD) if isinstance(doc, dict) and isinstance(doc.get("files"), dict) else None
        if isinstance(record, str) and is_object_id(record):
            try:
                live |= record_chunks(store, record)  # the chunks its files record names
            except FileNotFoundError:
                continue  # gone with its manifest (another gc), or never stored: it names nothing to keep
            except (SpotWarpError, ValueError, UnicodeDecodeError):
                unreadable.append(name)  # what it names is unknown: keep every object
    return live, unreadable


def _delete_unnamed(store: Store, live: set[str], grace_s: float, lease: Lock, report: GcReport) -> None:
    """Delete unnamed objects older than `grace_s`; stop as soon as a writer starts or our lease lapses."""
    now = time.time()
    checked = 0.0  # look for writers first: reading the manifests may have taken a while
    for oid, (size, mtime) in store.list_objects_with_times().items():
        if oid in live:
            continue
        if mtime is not None and now - mtime < grace_s:
            report.objects_in_grace += 1
            report.bytes_in_grace += size
            continue
        if time.monotonic() - checked > 1.0:
            checked = time.monotonic()
            if live_locks(store, WRITE):
                report.objects_left = "deleting stopped: a snapshot started being written (the rest is left for the next gc)"
                return
        if lease.lapsed():
            report.objects_left = "deleting stopped: this gc stood still past its lease (the rest is left for the next gc)"
            return
        store.delete_object(oid)
        report.objects_deleted += 1
        report.bytes_freed += size
    if report.objects_in_grace:
        report.objects_left = (
            f"{report.objects_in_grace} unreferenced objects ({format_size(report.bytes_in_grace)}) are younger than "
            f"the grace period ({format_duration(grace_s)}) and were kept: a snapshot being written may be about to "
            "name them; a later gc deletes them, or now `spotwarp gc --keep N --grace 0s` while no host or kernel "
            "writes to this project")


def _clear_leftovers(store: Store, grace_s: float, lease: Lock) -> None:
    """Temporaries of killed writes, interrupted uploads and stale locks."""
    # a temporary is a write in progress for as long as a write can take, whatever the objects' grace
    store.delete_temporaries(max(grace_s, TEMPORARY_GRACE_S))
    store.clear_interrupted_uploads(max(grace_s, TEMPORARY_GRACE_S))  # an upload in progress, whatever `--grace`
    for name in stale_locks(store):
        if name != lease.name:
            store.delete_lock(name)
