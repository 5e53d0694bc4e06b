"""The orchestrator's side of the lease: read it, and move it to a race's winner (nobody else moves it)."""

from __future__ import annotations

import time

from ..engine.coordination import Lease, read_lease, write_lease
from ..engine.errors import SpotWarpError
from ..engine.storage import Store

__all__ = ["Lease", "LeaseConflict", "move_lease", "read_lease"]


class LeaseConflict(SpotWarpError):
    """The lease moved under this orchestrator: another `spotwarp launch` runs for the project."""


def move_lease(store: Store, generation: int, holder: str) -> Lease:
    """Give the lease to `holder` at `generation` (one above the current); read back to catch a concurrent move."""
    current = read_lease(store)
    if current.generation != generation - 1:
        raise LeaseConflict(f"the lease is at generation {current.generation} (holder {current.holder}), not "
                            f"{generation - 1}: another `spotwarp launch` runs for this project; run only one")
    lease = Lease(generation, holder, time.time())
    write_lease(store, lease)
    if read_lease(store) != lease:
        raise LeaseConflict("the lease changed while being moved: another `spotwarp launch` runs for this project")
    return lease
