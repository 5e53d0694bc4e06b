"""Content-addressed chunks of workspace files: new ones written in batches, known ones named again."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from .hashing import fingerprint
from .store import Store

if TYPE_CHECKING:
    from .workspace import FileBackupStats

BATCH_BYTES = 256 * 1024 * 1024


class Uploads:
    """New chunks queued for writing in batches; content already known is named, not written."""

    def __init__(self, store: Store, known: dict[str, tuple[str, int]], stats: "FileBackupStats", present: set[str]):
        self.store = store
        self.known = known
        self.stats = stats
        self.present = present
        self.pending: dict[str, bytes] = {}
        self.pending_bytes = 0
        self.waiting: list[tuple[dict[str, Any], str]] = []

    def add(self, data: bytes) -> dict[str, Any]:
        fp = fingerprint(data)
        ref: dict[str, Any] = {"size": len(data), "fp": fp}
        hit = self.known.get(fp)
        if hit is not None and hit[1] == len(data) and self._still_there(hit[0]):
            ref["id"] = hit[0]
            self.stats.objects_reused += 1
        elif fp in self.pending:
            self.waiting.append((ref, fp))
        else:
            self.pending[fp] = data
            self.pending_bytes += len(data)
            self.waiting.append((ref, fp))
            if self.pending_bytes >= BATCH_BYTES:
                self.flush()
        return ref

    def _still_there(self, oid: str) -> bool:
        # a concurrent or earlier gc may have dropped what only old snapshots named
        if oid not in self.present:
            if not self.store.has_object(oid):
                return False
            self.present.add(oid)
        return True

    def flush(self) -> None:
        if not self.pending:
            return
        fps = list(self.pending)
        results = self.store.put_objects([self.pending[fp] for fp in fps])
        for fp, (oid, size) in zip(fps, results):
            self.known[fp] = (oid, size)
            self.present.add(oid)
            self.stats.bytes_written += size
            self.stats.objects_written += 1
        for ref, fp in self.waiting:
            ref["id"] = self.known[fp][0]
        self.pending.clear()
        self.waiting.clear()
        self.pending_bytes = 0


def known_chunks(previous: dict[str, Any] | None) -> dict[str, tuple[str, int]]:
    """Fingerprint -> (object id, size) of every chunk the previous `files` record names."""
    known: dict[str, tuple[str, int]] = {}
    for entry in ((previous or {}).get("entries") or {}).values():
        for chunk in entry.get("chunks", []):
            if chunk.get("fp") and chunk.get("id"):
                known[chunk["fp"]] = (chunk["id"], int(chunk["size"]))
    return known


def present_objects(store: Store, oids: set[str]) -> set[str]:
    """Which of `oids` are still stored (a gc may have dropped what only old snapshots named)."""
    if not oids:
        return set()
    ordered = sorted(oids)
    if store.local:
        return {o for o in ordered if store.has_object(o)}
    with ThreadPoolExecutor(max_workers=16, thread_name_prefix="spotwarp-check") as pool:
        return {o for o, ok in zip(ordered, pool.map(store.has_object, ordered)) if ok}
