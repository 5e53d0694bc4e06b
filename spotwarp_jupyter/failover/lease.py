"""The orchestrator's side of the lease: read it, and move it to a race's winner (nobody else moves it).

Moving the lease is a compare-and-set: each generation is one create-only object (`lease/<G>.json`), and
of two orchestrators claiming the same generation exactly one creates it (docs/failover.md).
"""

from __future__ import annotations

import time
from typing import Any, Callable

from ..engine.coordination import (
    FENCED,
    HOLDER,
    DamagedLease,
    Lease,
    highest_lease_generation,
    lease_generations,
    prune_leases,
    read_heartbeats,
    read_lease,
    write_lease,
)
from ..engine.coordination.fence import free_generation, lease_path, parse_lease
from ..engine.errors import SpotWarpError
from ..engine.signing import RecordRefused, signing_key
from ..engine.storage import Store

__all__ = ["Lease", "LeaseConflict", "move_lease", "next_generation", "read_lease", "taken_generation"]


class LeaseConflict(SpotWarpError):
    """The lease moved under this orchestrator: another `spotwarp launch` runs for the project."""


def next_generation(store: Store, manifests_floor: Callable[[], int] | None = None) -> int:
    """One above every generation the project ever recorded: lease entries (without SPOTWARP_KEY damaged ones
    too; with it, signed ones only), the old `lease.json`, manifests (`manifests_floor`) and the heartbeats of
    hosts that held the lease; with a name an unsigned entry took skipped.

    So a deleted or damaged lease never sends generations back: what the next holder writes ranks above
    everything written before; and entries a store writer without the key adds move no generation.
    """
    seen = [highest_lease_generation(store)]
    if manifests_floor is not None:
        seen.append(manifests_floor())
    for doc in read_heartbeats(store):
        gen = doc.get("generation")
        if (doc.get("state") in (HOLDER, FENCED) or doc.get("lease_lost") is True) and isinstance(gen, int) and not isinstance(gen, bool):
            seen.append(gen)
    return free_generation(store, max(seen) + 1)


class UnsignedEntry(SpotWarpError):
    """The generation raced for was taken by an entry not signed with SPOTWARP_KEY: no orchestrator's (race again)."""


def taken_generation(store: Store) -> int:
    """The newest generation an orchestrator took: the newest lease entry; with SPOTWARP_KEY set, the newest
    signed with it (an unsigned entry is a store writer's without the key, and moves nothing)."""
    if not signing_key():
        taken = lease_generations(store)
        return taken[-1] if taken else 0
    try:
        return read_lease(store).generation
    except DamagedLease as exc:
        return exc.generation


def _signed_entry(store: Store, generation: int) -> bool:
    try:
        raw = store.read_record(lease_path(store, generation))
        return raw is not None and parse_lease(raw, generation, store, signing_key()) is not None
    except (RecordRefused, ValueError):
        return False


def move_lease(store: Store, generation: int, holder: str) -> Lease:
    """Give the lease to `holder` at `generation`: create its entry (signed with SPOTWARP_KEY when set), which
    succeeds for one orchestrator only.

    LeaseConflict when the generation was taken, or when a later one exists (another orchestrator moved on);
    UnsignedEntry when, with a key, an unsigned entry took the generation first (a race above it is needed).
    """
    if taken_generation(store) >= generation:
        raise LeaseConflict(_conflict(store, generation))
    lease = Lease(generation, holder, time.time())
    if not write_lease(store, lease):
        if signing_key() and not _signed_entry(store, generation):
            raise UnsignedEntry(f"generation {generation} was taken by a lease entry not signed with this "
                                "SPOTWARP_KEY (a store writer without the key): it changes nothing; racing again "
                                "above it")
        raise LeaseConflict(_conflict(store, generation))
    if taken_generation(store) > generation:
        raise LeaseConflict(_conflict(store, generation))
    prune_leases(store, generation)
    return lease


def _conflict(store: Store, generation: int) -> str:
    try:
        current: Any = read_lease(store)
        now = f"generation {current.generation} (holder {current.holder})"
    except SpotWarpError as exc:
        now = str(exc)
    return (f"the lease could not move to generation {generation}: it is at {now}: another `spotwarp launch` "
            "runs for this project; run only one")
