"""The areas of one project in the store, `{storage}/{project}/<area>`: the one place their names are written.

A stored name never changes (stores written by earlier versions must still read), so every module that
reads or writes an area names it through `Layout`, and docs/design.md's layout table follows it.
"""

from __future__ import annotations

__all__ = ["Layout"]


class Layout:
    """The top-level names of a project's folder in the store, one attribute per area."""

    OBJECTS = "objects"
    """`objects/<ab>/<object id>`: immutable blobs named by the blake3 hash of their content (storage)."""

    SNAPSHOTS = "snapshots"
    """`snapshots/<time>-<id>.json`: one manifest per committed snapshot, written last: the commit (storage)."""

    LOCKS = "locks"
    """`locks/<write|gc>-<host>-<pid>-<8 hex>.json`: snapshot writers and gc in progress (coordination/locks.py)."""

    STAGING = "staging"
    """`staging/<snapshot id>/`: a local store only, the DCP files of a collective snapshot being written,
    moved into objects/ (training/collective.py)."""

    LEASE = "lease"
    """`lease/<generation, 12 digits>.json`: the failover lease, one create-only entry per generation
    (coordination/fence.py)."""

    LEGACY_LEASE = "lease.json"
    """`lease.json`, a file: the lease before it became entries; read while no entry exists, never written."""

    HEAD = "head"
    """`head/<counter, 12 digits>.json`: the newest commit, signed, one create-only entry per commit made with
    a key (coordination/head.py)."""

    HOSTS = "hosts"
    """`hosts/<host id>.json`: each server's latest heartbeat (coordination/heartbeats.py)."""

    WATCHERS = "watchers"
    """`watchers/<host>-<pid>.json`: each running watch's announcement (failover/announcements.py)."""

    REQUESTS = "requests"
    """`requests/<host id>.json`: a request to one host, a final snapshot before `launch --replace`
    (coordination/heartbeats.py)."""

    EVENTS = "events"
    """`events/<time>-<event>-<8 hex>.json`: the events journal, one immutable record per event (journal/events.py)."""

    ALL = (OBJECTS, SNAPSHOTS, LOCKS, STAGING, LEASE, LEGACY_LEASE, HEAD, HOSTS, WATCHERS, REQUESTS, EVENTS)
    """Every area, in the order docs/design.md lists them."""
