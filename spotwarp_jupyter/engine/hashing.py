"""Content hashes: blake3 names stored objects (tamper-evident); xxh3 spots changes cheaply."""

from __future__ import annotations

import re
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Iterable

import blake3
import xxhash

Buffer = bytes | bytearray | memoryview


@dataclass
class HashCount:
    """blake3 passes made by `object_id` in this process (calls and bytes): what change detection saves."""

    calls: int = 0
    nbytes: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, nbytes: int) -> None:
        with self._lock:
            self.calls += 1
            self.nbytes += nbytes


blake3_passes = HashCount()


def object_id(data: Buffer) -> str:
    """The content address of `data`: its blake3 digest in hex."""
    blake3_passes.add(memoryview(data).nbytes if not isinstance(data, bytes) else len(data))
    # blake3 releases the GIL on large inputs, so writer threads hash in parallel.
    return blake3.blake3(data).hexdigest()


def object_hasher() -> "blake3.blake3":
    """An incremental hasher whose hexdigest() is the object id of everything fed to update()."""
    return blake3.blake3()


def fingerprint(data: Buffer) -> str:
    """A fast change-detection digest (xxh3-128); not a security boundary."""
    return xxhash.xxh3_128_hexdigest(data)


# Entries kept per store: 64 MiB chunks of 8 TB of state, at about 0.2 KB each.
DETECTED_MAX = 1 << 17


class ChangeDetector:
    """(xxh3-128 digest, length) -> the object id this process computed with blake3 for those bytes and stored.

    An unchanged buffer is then known by its xxh3 digest (half blake3's cost) and named by its object id again,
    with no blake3 pass and no write. Entries come only from this process (and the forked writers it reaped):
    never from a store, so nothing a store holds can make a buffer pass for another; the caller still checks
    that the store holds the object. Bounded: the oldest entries go first beyond DETECTED_MAX.
    """

    def __init__(self, limit: int = DETECTED_MAX):
        self.limit = limit
        self._ids: OrderedDict[tuple[str, int], str] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, digest: str, nbytes: int) -> str | None:
        with self._lock:
            return self._ids.get((digest, nbytes))

    def learn(self, entries: Iterable[tuple[str, int, str]]) -> None:
        """Remember (digest, length, object id) triples, newest last."""
        with self._lock:
            for digest, nbytes, oid in entries:
                self._ids[(digest, nbytes)] = oid
                self._ids.move_to_end((digest, nbytes))
            while len(self._ids) > self.limit:
                self._ids.popitem(last=False)

    def __len__(self) -> int:
        return len(self._ids)


_detectors: dict[str, ChangeDetector] = {}
_journal: list[tuple[str, str, int, str]] | None = None  # what a forked writer learnt, for its parent
_detectors_lock = threading.Lock()


def detector(scope: str) -> ChangeDetector:
    """This process's change detector for one store (`scope` names it)."""
    with _detectors_lock:
        return _detectors.setdefault(scope, ChangeDetector())


def learn(scope: str, entries: list[tuple[str, int, str]]) -> None:
    """Remember entries for `scope` (and note them for the parent when this is a forked writer)."""
    detector(scope).learn(entries)
    if _journal is not None:
        _journal.extend((scope, *e) for e in entries)


def start_journal() -> None:
    """In a forked writer: from now on note what is learnt, for `journal()` to hand to the parent."""
    global _journal
    _journal = []


def journal() -> list[tuple[str, str, int, str]]:
    """(scope, digest, length, object id) learnt since `start_journal`."""
    return list(_journal or [])


def adopt(entries: Iterable[Iterable[object]]) -> None:
    """Take in what a forked writer of this process learnt (its `journal()`, through its pipe)."""
    by_scope: dict[str, list[tuple[str, int, str]]] = {}
    for scope, digest, nbytes, oid in entries:  # type: ignore[misc]
        if isinstance(digest, str) and isinstance(nbytes, int) and isinstance(oid, str) and is_object_id(oid):
            by_scope.setdefault(str(scope), []).append((digest, nbytes, oid))
    for scope, found in by_scope.items():
        detector(scope).learn(found)


_OBJECT_ID = re.compile("[0-9a-f]{64}")


def is_object_id(text: str) -> bool:
    """True when `text` has the shape of an object id (64 lowercase hex digits)."""
    return len(text) == 64 and _OBJECT_ID.fullmatch(text) is not None
