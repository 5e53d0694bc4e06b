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
import logging
import math
import os
import re
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping

from ..errors import ConfigError, SpotWarpError
from ..signing import RecordRefused, check_record, sign_record, signing_key
from ..storage import Layout, Store

log = logging.getLogger("spotwarp")

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


_LEASE_ENTRY = re.compile(r"^(\d{1,15})\.json$")
MAX_LEASE_BYTES = 64 * 1024  # an entry is under 200 bytes: a bigger one is damaged, never read whole
KEEP_LEASES = 16  # lease entries kept below the current one (older ones are pruned by the orchestrator)


def lease_path(store: Store, generation: int | None = None) -> str:
    """The lease entry of `generation`; without one, the lease folder."""
    return store.record_path(Layout.LEASE, None if generation is None else f"{generation:012d}.json")


def legacy_lease_path(store: Store) -> str:
    """`lease.json`: where the lease was kept before it became one entry per generation (read, never written)."""
    return store.record_path(Layout.LEGACY_LEASE)


def lease_generations(store: Store) -> list[int]:
    """The generations that have a lease entry, lowest first (whatever their content)."""
    out = []
    for name in store.record_names(lease_path(store), "listing the lease"):
        m = _LEASE_ENTRY.match(name)
        if m:
            out.append(int(m.group(1)))
    return sorted(out)


def lease_entry_times(store: Store, key: bytes | None = None) -> dict[int, float | None]:
    """Each lease entry's generation -> when the store says it was created (the store's clock). With a key
    (SPOTWARP_KEY when not given), only the entries signed with it: an unsigned one moved no lease."""
    key = key if key is not None else signing_key()
    entries = _lease_entry_times(store)
    if not key:
        return {generation: when for generation, (when, _) in entries.items()}
    return {generation: when for generation, (when, tag) in entries.items()
            if _signed_entry(store, generation, tag, key) is not None}


def _signed_entry(store: Store, generation: int, tag: Any, key: bytes) -> Lease | None:
    """The entry of `generation` when it is signed with `key`, else None. Entries are create-only, so a verdict
    holds while the object does (one re-created has another tag): each entry is read once per process, and a
    flood of unsigned entries costs a reader one read each, once."""
    path = lease_path(store, generation)
    seen = (path, tag, key)
    if tag is not None and seen in _VERDICTS:
        return _VERDICTS[seen]
    lease: Lease | None = None
    try:
        raw = store.read_record(path, limit=MAX_LEASE_BYTES)
        lease = parse_lease(raw, generation, store, key) if raw is not None else None
    except (RecordRefused, ValueError):
        lease = None
    if tag is not None:  # without a tag a re-created entry could not be told apart
        if len(_VERDICTS) > 65536:
            _VERDICTS.clear()
        _VERDICTS[seen] = lease
    return lease


_VERDICTS: dict[tuple[str, Any, bytes], Lease | None] = {}  # (entry, its object's tag, key) -> the signed lease


def _lease_entry_times(store: Store) -> dict[int, tuple[float | None, Any]]:
    """generation -> (store time, what tells this object from one re-created under its name)."""
    stamps = store.record_stamps(lease_path(store), "listing the lease", lambda name: bool(_LEASE_ENTRY.match(name)))
    return {int(name[:-len(".json")]): stamp for name, stamp in stamps.items()}


class DamagedLease(Fenced):
    """The newest lease entry does not parse: nobody may write until `spotwarp launch` moves the lease past it."""

    def __init__(self, message: str, generation: int):
        super().__init__(message)
        self.generation = generation


def parse_lease(raw: bytes, generation: int | None = None, store: Store | None = None,
                key: bytes | None = None) -> Lease:
    """A lease entry's content; ValueError when it is damaged (or names another generation than its file).

    With `key` (and the `store` it was read from), RecordRefused unless the entry is signed with it for its name.
    """
    try:
        doc = json.loads(raw)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise ValueError(str(exc)) from None
    if key:
        assert store is not None
        name = Layout.LEGACY_LEASE if generation is None else f"{Layout.LEASE}/{generation:012d}.json"
        doc = check_record(doc, key, store.project, name)
    try:
        if not isinstance(doc, dict):
            raise ValueError("not an object")
        gen, holder, when = doc["generation"], doc.get("holder"), doc.get("time") or 0.0
        if isinstance(gen, bool) or not isinstance(gen, int) or gen < 0:
            raise ValueError("bad generation")
        if holder is not None and (not isinstance(holder, str) or not _CANDIDATE_ID.match(holder)):
            raise ValueError("bad holder")
        if isinstance(when, bool) or not isinstance(when, (int, float)) or not math.isfinite(when):
            raise ValueError("bad time")
    except (ValueError, TypeError, KeyError) as exc:
        raise ValueError(str(exc)) from None
    if generation is not None and gen != generation:
        raise ValueError(f"it says generation {gen}")
    return Lease(gen, holder, float(when))


_refusals_said: set[str] = set()
_skipped_said: dict[str, int] = {}  # store root -> how many unsigned entries above the holder were last said


def _refused(what: str, exc: Exception) -> None:
    """Log a refused lease entry once per process (the heartbeat reads the lease every few seconds)."""
    if what not in _refusals_said:
        _refusals_said.add(what)
        log.warning("SpotWarp: lease entry skipped: %s", exc)


def read_lease(store: Store, key: bytes | None = None) -> Lease:
    """The project's lease: its newest entry; generation 0 with no holder where failover never ran.

    Without a key, a damaged newest entry raises DamagedLease (a Fenced): no host may write, since skipping it
    could hand the project back to an older holder. With a key (`SPOTWARP_KEY`, read from the environment
    when not given), the lease is the newest entry signed with it, however many unsigned, altered or damaged
    ones lie above it: those are a store writer's without the key and change nothing (skipped, said in one line).
    """
    key = key if key is not None else signing_key()
    if key:
        return _newest_signed_lease(store, key)
    for _ in range(3):
        generations = lease_generations(store)
        if not generations:
            return _read_legacy_lease(store, key)
        try:
            return _newest_lease(store, generations)
        except FileNotFoundError:
            continue  # pruned or deleted between the listing and the read: list again
    return _read_legacy_lease(store, key)


def _newest_signed_lease(store: Store, key: bytes) -> Lease:
    entries = _lease_entry_times(store)
    skipped = 0
    for generation in sorted(entries, reverse=True):
        lease = _signed_entry(store, generation, entries[generation][1], key)
        if lease is not None:
            _say_skipped(store, skipped, generation)
            return lease
        skipped += 1
    _say_skipped(store, skipped, 0)
    return _read_legacy_lease(store, key)  # no signed entry: as if failover never ran (or the old lease.json)


def _say_skipped(store: Store, skipped: int, generation: int) -> None:
    if skipped and _skipped_said.get(store.root) != skipped:
        log.warning("SpotWarp: %d lease entries above generation %d are not signed with this SPOTWARP_KEY: "
                    "skipped (a store writer without the key; they move nothing)", skipped, generation)
    _skipped_said[store.root] = skipped


def _newest_lease(store: Store, generations: list[int]) -> Lease:
    generation = generations[-1]
    path = lease_path(store, generation)
    try:
        raw = store.read_record(path, limit=MAX_LEASE_BYTES)
        if raw is None:
            raise FileNotFoundError(path)
        return parse_lease(raw, generation, store, None)
    except ValueError as exc:
        raise DamagedLease(f"the lease {path} is damaged ({exc}): no host writes until `spotwarp launch` moves "
                           f"the lease past it (to generation {generation + 1} or above)", generation) from None


def _read_legacy_lease(store: Store, key: bytes | None = None) -> Lease:
    try:
        raw = store.read_record(legacy_lease_path(store), limit=MAX_LEASE_BYTES)
        if raw is None:
            return Lease()
        return parse_lease(raw, None, store, key)
    except RecordRefused as exc:
        _refused(legacy_lease_path(store), exc)
        return Lease()
    except ValueError as exc:
        if key:
            _refused(legacy_lease_path(store), exc)
            return Lease()
        raise DamagedLease(f"the lease {legacy_lease_path(store)} is damaged ({exc}): no host writes until "
                           "`spotwarp launch` moves the lease past it", 0) from None


def highest_lease_generation(store: Store, key: bytes | None = None) -> int:
    """The highest generation the lease ever recorded. Without a key, any entry (or the old `lease.json`),
    damaged ones included; with one (SPOTWARP_KEY when not given), only those signed with it: an unsigned
    entry never moves generations."""
    key = key if key is not None else signing_key()
    if key:
        return read_lease(store, key).generation
    generations = lease_generations(store)
    legacy = 0
    try:
        raw = store.read_record(legacy_lease_path(store), limit=MAX_LEASE_BYTES)
        legacy = parse_lease(raw).generation if raw is not None else 0
    except ValueError:
        pass
    return max(generations[-1] if generations else 0, legacy)


def free_generation(store: Store, generation: int) -> int:
    """`generation`, or the lowest above it whose lease entry name nothing has taken: with a key, names taken by
    unsigned entries are skipped (a create-only write there could never succeed), and real contenders still
    meet on the same name."""
    taken = set(lease_generations(store))
    while generation in taken:
        generation += 1
    return generation


def lease_bytes(lease: Lease, store: Store, key: bytes | None = None) -> bytes:
    """A lease entry's bytes, signed with `key` (SPOTWARP_KEY from the environment when not given) if there is one."""
    key = key if key is not None else signing_key()
    doc = sign_record(lease.as_dict(), key, store.project, f"{Layout.LEASE}/{lease.generation:012d}.json")
    return json.dumps(doc, sort_keys=True).encode()


def write_lease(store: Store, lease: Lease, key: bytes | None = None) -> bool:
    """Create the lease entry of `lease.generation` (the orchestrator alone does this), signed with the key:
    True when this call created it, False when that generation was taken already (never replaced)."""
    return store.create_record(lease_path(store, lease.generation), lease_bytes(lease, store, key))


def prune_leases(store: Store, below: int) -> None:
    """Delete lease entries more than KEEP_LEASES generations below `below` (best effort)."""
    prune_numbered(store, "pruning the lease", lease_generations(store), below - KEEP_LEASES,
                   lambda generation: lease_path(store, generation))


def prune_numbered(store: Store, what: str, numbers: Iterable[int], keep_from: int,
                   path_of: Callable[[int], str]) -> None:
    """Delete the create-only entries numbered below `keep_from`, oldest first (best effort: old entries are
    harmless, and the next write that prunes tries again)."""
    for number in sorted(numbers):
        if number >= keep_from:
            return
        try:
            if not store.delete_record(path_of(number), what):
                return
        except Exception:  # noqa: BLE001 - stop at the first that fails; it is tried again next time
            return


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

