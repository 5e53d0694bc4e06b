"""Heartbeats: each server writes `{storage}/{project}/hosts/<id>.json` every few seconds; the orchestrator reads them.

A heartbeat says who the host is (candidate id, generation), its role under the lease (standby, serving,
holder, fenced), whether it serves, the restore it did at start and where it listens. No Jupyter imports.
"""

from __future__ import annotations

import json
import logging
import posixpath
import socket
import time
from typing import Any

from ..storage import Store
from .fence import HOSTS_DIR, read_small, validate_candidate_id, write_small

log = logging.getLogger("spotwarp")


def host_id(candidate: str | None, port: int | None) -> str:
    """The name a host's heartbeat goes under: its candidate id, else host name and port."""
    if candidate:
        return candidate
    name = "".join(c if c.isalnum() or c in "._-" else "-" for c in socket.gethostname())[:48] or "host"
    return f"{name}-{port or 0}"


def heartbeat_path(store: Store, ident: str) -> str:
    return posixpath.join(store.root, HOSTS_DIR, f"{validate_candidate_id(ident)}.json")


def write_heartbeat(store: Store, doc: dict[str, Any]) -> None:
    """Write one heartbeat (blocking I/O: call it from a thread)."""
    write_small(store, heartbeat_path(store, doc["id"]), json.dumps(doc, sort_keys=True).encode())


def read_heartbeat(store: Store, ident: str) -> dict[str, Any] | None:
    """The newest heartbeat of host `ident`, None when it never wrote one (or it is damaged)."""
    raw = read_small(store, heartbeat_path(store, ident))
    if raw is None:
        return None
    try:
        doc = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        log.warning("SpotWarp: damaged heartbeat of %s skipped", ident)
        return None
    return doc if isinstance(doc, dict) else None


def read_heartbeats(store: Store) -> list[dict[str, Any]]:
    """Every host's newest heartbeat, the most recent first."""
    folder = posixpath.join(store.root, HOSTS_DIR)
    store.fs.invalidate_cache(folder)
    try:
        names = store._call("listing hosts", store.fs.ls, folder, detail=False)
    except FileNotFoundError:
        return []
    out = []
    for path in names:
        name = posixpath.basename(path.rstrip("/"))
        if name.endswith(".json") and ".tmp-" not in name:
            doc = read_heartbeat(store, name[:-5])
            if doc is not None:
                out.append(doc)
    return sorted(out, key=lambda d: -float(d.get("time") or 0))


def age(doc: dict[str, Any] | None, now: float | None = None) -> float | None:
    """Seconds since the heartbeat was written."""
    if doc is None:
        return None
    return max(0.0, (time.time() if now is None else now) - float(doc.get("time") or 0))
