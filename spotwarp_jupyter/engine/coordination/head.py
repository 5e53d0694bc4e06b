"""The head: which snapshot the project's newest commit was, signed, so that a reader tells a store rolled back
(the newest manifests deleted) from one that simply has nothing newer.

Every commit made with SPOTWARP_KEY creates `head/<counter, 12 digits>.json`, `{counter, snapshot, name,
created}` signed for that name, one above the newest *signed* entry: create-only, like the lease, so an
entry is never replaced. Entries a store writer without the key plants are never counted from (one at
the top of the range would push the next counter past 12 digits, where no reader looks, and the pruning
below it would delete every signed entry); a name one took is passed over, to a random name above it, so
that no one can take in advance every name the next commit could use. A reader takes the newest *signed*
entry. Without a key nothing is written or checked: anyone who can write the store could forge the head
as well.

No Jupyter imports.
"""

from __future__ import annotations

import json
import logging
import re
import secrets
import time
from dataclasses import dataclass
from typing import Any

from ..errors import SpotWarpError
from ..signing import RecordRefused, check_record, sign_record
from ..storage import Layout, Store
from .fence import prune_numbered

log = logging.getLogger("spotwarp")

KEEP_HEADS = 16  # entries kept below the newest (older ones are pruned by the next commit)
MAX_HEAD_BYTES = 64 * 1024
_ENTRY = re.compile(r"^(\d{12})\.json$")
_TRIES = 16  # names taken by someone else passed over before a commit gives up advancing the head
_LAST = 10**12 - 1  # the highest counter a 12-digit name holds
_JUMP = 1 << 20  # past a taken name, the next try is up to this far above it, unpredictably


class RolledBack(SpotWarpError):
    """The snapshot the store's head names is missing: the store was rolled back, or a manifest deleted."""

    def __init__(self, message: str, snapshot: str):
        super().__init__(message)
        self.snapshot = snapshot


@dataclass(frozen=True)
class Head:
    """The project's newest commit as its writer recorded it."""

    counter: int
    snapshot: str  # its id
    name: str  # its manifest's name in snapshots/
    created: float

    def as_dict(self) -> dict[str, Any]:
        return {"counter": self.counter, "snapshot": self.snapshot, "name": self.name, "created": self.created}


def head_path(store: Store, counter: int | None = None) -> str:
    """The head entry of `counter`; without one, the head folder."""
    return store.record_path(Layout.HEAD, None if counter is None else f"{counter:012d}.json")


def _entries(store: Store) -> dict[int, Any]:
    """counter -> what tells this object from one re-created under its name (None when unknown)."""
    stamps = store.record_stamps(head_path(store), "listing the head", lambda name: bool(_ENTRY.match(name)))
    return {int(name[:-len(".json")]): tag for name, (_, tag) in stamps.items()}


_VERDICTS: dict[tuple[str, Any, bytes], Head | None] = {}  # (entry, its tag, key) -> the signed head


def _signed(store: Store, counter: int, tag: Any, key: bytes) -> Head | None:
    path = head_path(store, counter)
    seen = (path, tag, key)
    if tag is not None and seen in _VERDICTS:
        return _VERDICTS[seen]
    head = None
    try:
        raw = store.read_record(path, limit=MAX_HEAD_BYTES)
        if raw is not None:
            doc = check_record(json.loads(raw), key, store.project, f"{Layout.HEAD}/{counter:012d}.json")
            head = Head(int(doc["counter"]), str(doc["snapshot"]), str(doc["name"]), float(doc["created"]))
            if head.counter != counter or "/" in head.name:
                head = None
    except (RecordRefused, ValueError, KeyError, TypeError, UnicodeDecodeError, RecursionError):
        head = None
    if tag is not None:
        if len(_VERDICTS) > 65536:
            _VERDICTS.clear()
        _VERDICTS[seen] = head
    return head


def read_head(store: Store, key: bytes) -> Head | None:
    """The newest head entry signed with `key`; None without a key or when no commit recorded one."""
    if not key:
        return None
    return _newest_signed(store, _entries(store), key)


def _newest_signed(store: Store, entries: dict[int, Any], key: bytes) -> Head | None:
    for counter in sorted(entries, reverse=True):
        head = _signed(store, counter, entries[counter], key)
        if head is not None:
            return head
    return None


_WRITTEN: dict[tuple[str, bytes], int] = {}  # (head folder, key) -> the counter this process last created there


def _next_counter(store: Store, entries: dict[int, Any], key: bytes) -> int:
    """One above the newest signed entry: with nothing above this process's own last entry, without a read."""
    own = _WRITTEN.get((head_path(store), key))
    if own is not None and own == max(entries, default=0):
        return own + 1
    newest = _newest_signed(store, entries, key)
    return (newest.counter if newest is not None else 0) + 1


def advance_head(store: Store, key: bytes, snapshot: str, name: str, created: float) -> Head | None:
    """Record a commit as the project's head (one small create-only write); None without a key.

    The counter is one above the newest signed entry (what a writer without the key planted counts for
    nothing); a name taken is passed over to a random one above it. An entry is never replaced.
    """
    if not key:
        return None
    entries = _entries(store)
    base = counter = _next_counter(store, entries, key)
    for _ in range(_TRIES):
        if counter > _LAST:
            break
        head = Head(counter, snapshot, name, created)
        doc = sign_record(head.as_dict(), key, store.project, f"{Layout.HEAD}/{counter:012d}.json")
        if store.create_record(head_path(store, counter), json.dumps(doc, sort_keys=True).encode()):
            _WRITTEN[(head_path(store), key)] = counter
            prune_numbered(store, "pruning the head", entries, counter - KEEP_HEADS,
                           lambda old: head_path(store, old))
            return head
        counter += 1 + secrets.randbelow(_JUMP)  # never the kernel's `random`: a user's seeded stream
    raise SpotWarpError(f"the head of project {store.project!r} could not advance: {_TRIES} names from "
                        f"{base} on were taken meanwhile")


def missing_head(head: Head | None, present: set[str], newest_valid: str | None, refused: str | None = None) -> str | None:
    """Why the store looks rolled back, in one line, or None: the head's manifest is neither present (and
    valid) nor passed by a newer valid one. `present`: names of valid manifests (before any screen);
    `refused`: why the head's manifest, present, was refused."""
    if head is None or head.name in present or (newest_valid is not None and newest_valid >= head.name):
        return None
    when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(head.created))
    state = f"is refused ({refused.rstrip('.')})" if refused else "is missing or unreadable"
    return (f"snapshot {head.snapshot} ({head.name}, {when}) named by the store's head {state}: "
            f"the store was rolled back or a manifest deleted or damaged; restore by explicit id (`--snapshot ID`, see `spotwarp list`) to accept an "
            f"older one")
