"""Reading hosts' heartbeats for the race (who serves) and the watch (who stopped beating)."""

from __future__ import annotations

import time
from typing import Any

from ..engine.coordination import HOLDER, SERVING, STANDBY, Lease, age, read_heartbeat, read_heartbeats
from ..engine.storage import Store

__all__ = ["age", "current_holder", "ready_candidate", "read_heartbeat", "read_heartbeats"]


def ready_candidate(store: Store, candidate_id: str, generation: int) -> dict[str, Any] | None:
    """The candidate's heartbeat once it restored and serves, in standby for `generation`; None before."""
    doc = read_heartbeat(store, candidate_id)
    if doc is None or doc.get("generation") != generation or not doc.get("ready"):
        return None
    return doc if doc.get("state") in (STANDBY, HOLDER) else None


def current_holder(store: Store, lease: Lease, dead_after: float) -> dict[str, Any] | None:
    """The heartbeat of the host serving the project now: the lease's holder, or without failover yet the
    freshest host serving at generation 0; None when there is none (or it is silent past `dead_after`)."""
    if lease.holder:
        doc = read_heartbeat(store, lease.holder)
        return doc if doc is not None and doc.get("generation") == lease.generation else None
    now = time.time()
    for doc in read_heartbeats(store):
        if doc.get("state") == SERVING and not doc.get("candidate") and (age(doc, now) or 0) < dead_after:
            return doc
    return None
