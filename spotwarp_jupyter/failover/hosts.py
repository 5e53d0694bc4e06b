"""The hosts that wrote heartbeats into a project, as `spotwarp hosts` shows them, and the pruning of old ones.

Ages are read against this machine's clock, for display only: the watch never decides on them
(failover/liveness.py judges silence on its own monotonic clock).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..engine.coordination import DamagedLease, Lease, read_lease
from ..engine.coordination.heartbeats import (
    MAX_HOSTS,
    delete_heartbeat,
    heartbeat_ids,
    heartbeat_modified,
    read_heartbeat,
    stale_after,
)
from ..engine.storage import Store


@dataclass
class Hosts:
    """The lease (and why it is damaged, if it is), the readable heartbeats newest first with their age and
    staleness, the ids of unreadable ones, those pruned, and how many were not read (over MAX_HOSTS)."""

    lease: Lease
    damaged: str | None = None
    hosts: list[dict[str, Any]] = field(default_factory=list)
    unreadable: list[str] = field(default_factory=list)
    pruned: list[str] = field(default_factory=list)
    more: int = 0


def survey(store: Store, now: float, prune_older_than: float | None = None) -> Hosts:
    """Read the lease and up to MAX_HOSTS heartbeats; with `prune_older_than` (seconds), delete the heartbeats
    older than that first (never the lease holder's)."""
    try:
        found = Hosts(read_lease(store))
    except DamagedLease as exc:
        found = Hosts(Lease(exc.generation), damaged=str(exc))
    ids = heartbeat_ids(store)
    found.more = max(0, len(ids) - MAX_HOSTS)
    found.hosts, found.unreadable = _read(store, ids[:MAX_HOSTS], now)
    if prune_older_than is not None:
        found.pruned = _prune(store, found, prune_older_than, now)
        found.hosts = [h for h in found.hosts if h["id"] not in found.pruned]
        found.unreadable = [i for i in found.unreadable if i not in found.pruned]
    found.hosts.sort(key=lambda h: -float(h["time"]))
    return found


def _read(store: Store, ids: list[str], now: float) -> tuple[list[dict[str, Any]], list[str]]:
    """The well-formed heartbeats of `ids` with their age and staleness, and the ids of unreadable ones."""
    hosts, unreadable = [], []
    for ident in ids:
        doc = read_heartbeat(store, ident)
        if doc is None:
            unreadable.append(ident)
            continue
        # the writer's clock against this one: for display only (the watch never decides on it)
        age_s = max(0.0, now - float(doc["time"]))
        stale = age_s > stale_after(doc)  # not serving, whatever its last beat said ("silent")
        hosts.append({**doc, "age_s": round(age_s, 1), "stale": stale, "silent": stale})
    return hosts, unreadable


def _prune(store: Store, found: Hosts, older_than: float, now: float) -> list[str]:
    """Delete heartbeats older than `older_than` seconds (never the lease holder's); the ids deleted."""
    lease, pruned = found.lease, []
    for h in found.hosts:
        if h["age_s"] > older_than and not (h["id"] == lease.holder and h["generation"] == lease.generation):
            delete_heartbeat(store, h["id"])
            pruned.append(h["id"])
    for ident in found.unreadable:
        written = heartbeat_modified(store, ident)
        if written is not None and now - written > older_than:
            delete_heartbeat(store, ident)
            pruned.append(ident)
    return pruned
