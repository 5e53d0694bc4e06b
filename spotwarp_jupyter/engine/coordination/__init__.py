"""Coordination between hosts and processes that share one project's storage.

Write locks between snapshot writers and gc (locks), the failover lease and the fence that keeps one writer
per project (fence), and the heartbeats each server writes for the orchestrator (heartbeats).

May import: storage and the engine's base modules.
"""

from .fence import (
    FENCED,
    HOLDER,
    SERVING,
    STANDBY,
    WRITERS,
    DamagedLease,
    Fence,
    Fenced,
    Lease,
    highest_lease_generation,
    lease_generations,
    prune_leases,
    read_lease,
    validate_candidate_id,
    write_lease,
)
from .heartbeats import age, host_id, read_heartbeat, read_heartbeats, write_heartbeat
from .locks import GC, WRITE, Lock, WriteLock, live_locks, stale_locks

__all__ = [
    "age", "DamagedLease", "Fence", "FENCED", "Fenced", "GC", "highest_lease_generation", "HOLDER", "host_id",
    "Lease", "lease_generations", "live_locks", "Lock", "prune_leases", "read_heartbeat",
    "read_heartbeats", "read_lease", "SERVING", "stale_locks", "STANDBY", "validate_candidate_id", "WRITE",
    "write_heartbeat", "write_lease", "WriteLock", "WRITERS",
]
