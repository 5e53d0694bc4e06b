"""A manifest's workspace files as one content-addressed object the manifest names: `files.record`.

A workspace of 10,000 files has a files record of megabytes; written inline, every kernel snapshot with a cut
would serialize, sign, write and parse it again. Stored as an object (canonical JSON of the `entries`, named by
its blake3 id), an unchanged workspace names the previous record's id again without serializing anything, and
the manifest stays small. The manifest keeps `record`, `record_size`, `count` (entries) and `bytes` (their sizes), plus the
scan's own facts (`scanned_at_ns`, `chunk_size`, `skipped`, `unstable`); its `objects` list the record, not the
chunks the record names. Signing covers the manifest, which names the record's id; the record is checked against
that id when read, like every object. In memory a manifest's `files` always holds `entries` and its `objects`
every chunk (`resolve`), so readers see one shape whatever the format on storage (inline records still load).
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from typing import Any

from ..errors import ManifestError, SpotWarpError
from ..storage import Store

__all__ = ["RECORD", "chunk_ids", "record_chunks", "resolve", "stored_form", "with_record"]

RECORD = "record"
_CACHE_SIZE = 6
_cache: OrderedDict[str, dict[str, Any]] = OrderedDict()  # record id -> its entries (a record never changes)
_lock = threading.Lock()


def _remember(oid: str, entries: dict[str, Any]) -> None:
    with _lock:
        _cache[oid] = entries
        _cache.move_to_end(oid)
        while len(_cache) > _CACHE_SIZE:
            _cache.popitem(last=False)


def _cached(oid: str) -> dict[str, Any] | None:
    with _lock:
        entries = _cache.get(oid)
        if entries is not None:
            _cache.move_to_end(oid)
        return entries


_chunks: list[tuple[Any, dict[str, int]]] = []


def chunk_ids(entries: dict[str, Any]) -> dict[str, int]:
    """Every chunk the entries name, with its size (kept for the last few entries: they never change)."""
    for known, ids in _chunks:
        if known is entries:
            return ids
    ids = {c["id"]: int(c["size"]) for e in entries.values() if isinstance(e, dict)
           for c in e.get("chunks", ()) if isinstance(c, dict) and "id" in c}
    with _lock:
        _chunks[:] = [(entries, ids), *_chunks[:3]]
    return ids


def with_record(store: Store, files: dict[str, Any], previous: dict[str, Any] | None) -> dict[str, Any]:
    """`files` (a backup's record, entries inline) naming its entries' object: the previous record's id when the
    entries are the previous ones (no serializing), else a new object written now (durable before returning)."""
    entries = files.get("entries") or {}
    prev_entries = (previous or {}).get("entries")
    oid = (previous or {}).get(RECORD)
    same = (isinstance(oid, str) and isinstance(prev_entries, dict) and len(prev_entries) == len(entries)
            and isinstance((previous or {}).get("record_size"), int)
            and (prev_entries is entries
                 or all((old := prev_entries.get(p)) is e or old == e for p, e in entries.items())))
    if same:
        entries, size = prev_entries, previous["record_size"]
        total = previous.get("bytes")
    else:
        data = json.dumps(entries, sort_keys=True, separators=(",", ":")).encode()
        oid, size = store.put_object(data)
        _remember(oid, entries)
        total = None
    if not isinstance(total, int):
        total = sum(int(e.get("size", 0)) for e in entries.values())
    return {**files, "entries": entries, RECORD: oid, "record_size": size, "count": len(entries), "bytes": total}


def stored_form(files: dict[str, Any], objects: dict[str, int]) -> tuple[dict[str, Any], dict[str, int]]:
    """The manifest's `files` and `objects` as written: a record's entries and chunks left to its object."""
    if not isinstance(files, dict) or RECORD not in files:
        return files, objects
    chunks = chunk_ids(files.get("entries") or {})
    oid = files[RECORD]
    kept = objects.keys() - chunks.keys()  # one pass in C over a workspace's 10,000 chunks (the order is the JSON's)
    if oid in objects:
        kept.add(oid)
    return {k: v for k, v in files.items() if k != "entries"}, {o: objects[o] for o in kept}


def resolve(store: Store, files: dict[str, Any], objects: dict[str, int], name: str) -> dict[str, Any]:
    """The manifest's `files` with its entries (read from the record object it names, checked against its id),
    and adds the chunks they name to `objects`; ManifestError when the record is missing, damaged or malformed."""
    if not isinstance(files, dict) or RECORD not in files:
        return files
    oid = files[RECORD]
    entries = _cached(oid) if isinstance(oid, str) else None
    if entries is None:
        if not isinstance(oid, str):
            raise ManifestError(f"snapshot manifest {name}: its files record is malformed")
        try:
            entries = json.loads(store.read_object(oid))
        except FileNotFoundError:
            raise ManifestError(f"snapshot manifest {name}: its files record (object {oid[:12]}) is missing") from None
        except (SpotWarpError, ValueError, UnicodeDecodeError) as exc:
            raise ManifestError(f"snapshot manifest {name}: its files record (object {oid[:12]}) cannot be read "
                                f"({exc})") from None
        if not isinstance(entries, dict):
            raise ManifestError(f"snapshot manifest {name}: its files record (object {oid[:12]}) is malformed")
        _remember(oid, entries)
    objects.update(chunk_ids(entries))
    return {**files, "entries": entries}


def record_chunks(store: Store, oid: str) -> set[str]:
    """Object ids a stored files record names (for gc, which reads every manifest afresh); raises when unreadable."""
    entries = _cached(oid)
    if entries is None:
        entries = json.loads(store.read_object(oid))
        if not isinstance(entries, dict):
            raise ValueError("malformed files record")
        _remember(oid, entries)
    return set(chunk_ids(entries))
