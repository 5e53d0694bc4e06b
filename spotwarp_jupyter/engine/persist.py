"""Persist: write a KernelImage's streams and buffers as content-addressed objects, skipping unchanged ones.

Large buffers are cut into fixed chunks, each fingerprinted with xxh3; a chunk whose fingerprint
the previous snapshot already stored is named again without being hashed or written.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

from .capture import EXTRAS_NAME, KernelImage
from .hashing import fingerprint
from .store import Store

CHUNK_SIZE = 64 * 1024 * 1024


@dataclass
class PersistStats:
    """What one persist wrote and what it reused."""

    bytes_total: int = 0
    bytes_written: int = 0
    objects_written: int = 0
    objects_reused: int = 0


def known_fingerprints(records: Iterable[dict[str, Any]]) -> dict[str, tuple[str, int]]:
    """fingerprint -> (object id, size) for every stream and chunk named by earlier kernel records."""
    known: dict[str, tuple[str, int]] = {}
    for record in records:
        for group in record.get("groups", []):
            ref = group.get("pickle") or {}
            if ref.get("fp"):
                known[ref["fp"]] = (ref["id"], ref["size"])
            for buf in group.get("buffers", []):
                for chunk in buf.get("chunks", []):
                    if chunk.get("fp"):
                        known[chunk["fp"]] = (chunk["id"], chunk["size"])
    return known


class _Plan:
    """Slots to fill with object refs; new content queued once even if it appears twice."""

    def __init__(self, store: Store, known: dict[str, tuple[str, int]]):
        self.store = store
        self.known = known
        self.pending: dict[str, memoryview] = {}
        self.slots: list[tuple[dict[str, Any], str]] = []
        self.stats = PersistStats()
        self._verified: dict[str, bool] = {}

    def add(self, view: memoryview) -> dict[str, Any]:
        fp = fingerprint(view)
        ref: dict[str, Any] = {"size": view.nbytes, "fp": fp}
        self.stats.bytes_total += view.nbytes
        hit = self.known.get(fp)
        if hit and hit[1] == view.nbytes and self._still_there(hit[0]):
            ref["id"] = hit[0]
            self.stats.objects_reused += 1
        else:
            self.pending.setdefault(fp, view)
            self.slots.append((ref, fp))
        return ref

    def _still_there(self, oid: str) -> bool:
        # a concurrent `gc` may have dropped an object only old snapshots named
        if oid not in self._verified:
            self._verified[oid] = self.store.has_object(oid)
        return self._verified[oid]

    def write(self) -> None:
        fps = list(self.pending)
        results = self.store.put_objects(self.pending[fp] for fp in fps)
        ids = {fp: oid for fp, (oid, _size) in zip(fps, results)}
        for fp, (_oid, size) in zip(fps, results):
            self.stats.bytes_written += size
            self.stats.objects_written += 1
        for ref, fp in self.slots:
            ref["id"] = ids[fp]


def persist_image(
    store: Store, image: KernelImage, previous: Iterable[dict[str, Any]] = ()
) -> tuple[dict[str, Any], dict[str, int], PersistStats]:
    """Write what is new; return (kernel record for the manifest, objects it names, stats)."""
    plan = _Plan(store, known_fingerprints(previous))
    groups: list[dict[str, Any]] = []
    for g in image.groups:
        buffers = []
        for view in g.pickled.buffers:
            view = view.cast("B") if view.format != "B" or view.ndim != 1 else view
            chunks = [plan.add(view[i:i + CHUNK_SIZE]) for i in range(0, view.nbytes, CHUNK_SIZE)]
            buffers.append({"size": view.nbytes, "chunks": chunks})
        groups.append({
            "names": g.names,
            "types": g.types,
            "codec": g.pickled.codec,
            "requires": sorted(g.pickled.requires),
            "pickle": plan.add(memoryview(g.pickled.data)),
            "buffers": buffers,
        })
    plan.write()
    objects: dict[str, int] = {}
    variables: dict[str, Any] = {}
    for index, (record, g) in enumerate(zip(groups, image.groups)):
        size = record["pickle"]["size"] + sum(b["size"] for b in record["buffers"])
        for ref in [record["pickle"], *(c for b in record["buffers"] for c in b["chunks"])]:
            objects[ref["id"]] = ref["size"]
        for name in g.names:
            if name != EXTRAS_NAME:
                variables[name] = {"type": g.types[name], "group": index, "size": size}
    kernel = {"groups": groups, "variables": variables, "imports": image.imports, "skipped": image.skipped}
    return kernel, objects, plan.stats
