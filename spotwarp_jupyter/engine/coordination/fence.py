"""Fencing: one writer per project at a time, decided by a lease in the store that only the orchestrator moves.

`{storage}/{project}/lease.json` holds `{generation, holder, time}`. A host knows its own generation and
candidate id (`SPOTWARP_GENERATION`, `SPOTWARP_CANDIDATE_ID`, set by `spotwarp start --candidate-id ID
--generation G` for the server and its kernels). Its role follows from the lease:

- no candidate id (a host started without failover, generation 0): it writes while no failover ever moved
  the lease (no lease, or generation 0), exactly as before failover existed; fenced once one did;
- a candidate whose generation is above the lease's: standby (restores and serves, never writes);
- the lease names it at its generation: the holder (writes);
- anything else (a later generation, or another holder of its own): fenced (stops writing, stops itself).

No Jupyter imports.
"""

from __future__ import annotations

import json
import os
import posixpath
import re
from dataclasses import dataclass
from typing import Any, Mapping

from ..errors import ConfigError, SpotWarpError
from ..storage import Store, write_atomic

LEASE_NAME = "lease.json"
HOSTS_DIR = "hosts"
SERVING = "serving"  # no failover in use: writes as always
STANDBY = "standby"  # a candidate of a race, not promoted: serves, never writes
HOLDER = "holder"  # holds the lease: writes
FENCED = "fenced"  # lost the lease: writes nothing more, stops itself
ROLES = (SERVING, STANDBY, HOLDER, FENCED)
WRITERS = (SERVING, HOLDER)
_CANDIDATE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


class Fenced(SpotWarpError):
    """This host may not write to the project now (standby, or it lost the lease)."""


def validate_candidate_id(value: str) -> str:
    """`value` if it is a safe candidate id (letters, digits, `.`, `_`, `-`, at most 64), else ConfigError."""
    if not isinstance(value, str) or not _CANDIDATE_ID.match(value) or ".." in value:
        raise ConfigError(f"bad candidate id {value!r}: use letters, digits, '.', '_' or '-' (at most 64)")
    return value


@dataclass(frozen=True)
class Lease:
    """Who may write to the project: the holder at this generation, since `time`."""

    generation: int = 0
    holder: str | None = None
    time: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return {"generation": self.generation, "holder": self.holder, "time": self.time}


def read_small(store: Store, path: str) -> bytes | None:
    """A small object's bytes, None when it is absent (listing caches are bypassed)."""
    try:
        if store.local:
            with open(path, "rb") as f:
                return f.read()
        store.fs.invalidate_cache(posixpath.dirname(path))
        return store._call("reading " + posixpath.basename(path), store.fs.cat_file, path)
    except FileNotFoundError:
        return None


def write_small(store: Store, path: str, data: bytes) -> None:
    """Replace a small object in one atomic write (rename on disks, one PUT on object stores)."""
    if store.local:
        write_atomic(path, data)
    else:
        store._call("writing " + posixpath.basename(path), store.fs.pipe_file, path, data)


def lease_path(store: Store) -> str:
    return posixpath.join(store.root, LEASE_NAME)


def read_lease(store: Store) -> Lease:
    """The project's lease; generation 0 with no holder where failover never ran."""
    raw = read_small(store, lease_path(store))
    if raw is None:
        return Lease()
    try:
        doc = json.loads(raw)
        return Lease(int(doc["generation"]), doc.get("holder"), float(doc.get("time") or 0.0))
    except (ValueError, TypeError, KeyError, UnicodeDecodeError):
        # a damaged lease must not let every host write: nobody may, until the orchestrator rewrites it
        raise Fenced(f"the lease {lease_path(store)} is damaged: no host may write until `spotwarp launch` "
                     "moves it again") from None


def write_lease(store: Store, lease: Lease) -> None:
    """Move the lease (the orchestrator alone does this)."""
    write_small(store, lease_path(store), json.dumps(lease.as_dict(), sort_keys=True).encode())


@dataclass(frozen=True)
class Fence:
    """What this host is in the failover scheme: its generation and candidate id (none without failover)."""

    generation: int = 0
    candidate: str | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "Fence":
        """From `SPOTWARP_GENERATION` and `SPOTWARP_CANDIDATE_ID` (both unset: no failover, generation 0)."""
        env = os.environ if env is None else env
        candidate = (env.get("SPOTWARP_CANDIDATE_ID") or "").strip() or None
        text = (env.get("SPOTWARP_GENERATION") or "").strip()
        if candidate is None:
            return cls()
        validate_candidate_id(candidate)
        if not text.isdigit() or int(text) < 1:
            raise ConfigError(f"SPOTWARP_GENERATION must be a whole number of at least 1 with a candidate id, "
                              f"got {text!r}")
        return cls(int(text), candidate)

    def env(self) -> dict[str, str]:
        """The variables that give a child process (a kernel) the same fence."""
        if self.candidate is None:
            return {}
        return {"SPOTWARP_CANDIDATE_ID": self.candidate, "SPOTWARP_GENERATION": str(self.generation)}

    def role(self, lease: Lease) -> str:
        """SERVING, STANDBY, HOLDER or FENCED under `lease`."""
        if self.candidate is None:
            return SERVING if lease.generation == 0 else FENCED
        if lease.generation < self.generation:
            return STANDBY
        if lease.generation == self.generation and lease.holder == self.candidate:
            return HOLDER
        return FENCED

    def why_not(self, role: str, lease: Lease) -> str:
        """One line: why this host may not write under `lease`."""
        me = f"candidate {self.candidate} (generation {self.generation})" if self.candidate \
            else "this host (no failover)"
        if role == STANDBY:
            return f"{me} is in standby: it writes nothing until the orchestrator promotes it"
        return (f"{me} lost the lease to {lease.holder or '?'} (generation {lease.generation}): "
                "it writes nothing more")

    def check(self, store: Store) -> Lease:
        """The lease, when this host may write now; Fenced otherwise."""
        lease = read_lease(store)
        role = self.role(lease)
        if role not in WRITERS:
            raise Fenced(self.why_not(role, lease))
        return lease

    def stamp(self) -> dict[str, Any]:
        """What a manifest records of its writer."""
        return {"generation": self.generation, "holder": self.candidate}

