"""Project snapshots: workspace files plus the kernel state of every live notebook, committed as one manifest."""

from __future__ import annotations

import time
from typing import Any, Mapping

from .errors import SnapshotNotFound, SpotWarpError, StorageError
from .ignore import IgnoreRules
from .manifest import Manifest
from .persist import CHUNK_SIZE
from .snapshots import SnapshotEngine
from .workspace import Progress, backup_workspace, files_changed
from .workspace_restore import FileRestoreReport, restore_files

PROJECT_KIND = "project"


def record_objects(record: Mapping[str, Any]) -> dict[str, int]:
    """Every object a kernel record names, with its size."""
    out: dict[str, int] = {}
    for group in record.get("groups", []):
        refs = [group.get("pickle") or {}, *(c for b in group.get("buffers", []) for c in b.get("chunks", []))]
        for ref in refs:
            if ref.get("id"):
                out[ref["id"]] = int(ref["size"])
    return out


def committed_kernel_record(listing: list[Manifest], snapshot_id: str, notebook: str) -> dict[str, Any]:
    """The kernel record of `notebook` in snapshot `snapshot_id` of `listing` (what a kernel just committed)."""
    manifest = next((m for m in listing if m.id == snapshot_id), None)
    if manifest is None:
        raise SnapshotNotFound(f"no snapshot {snapshot_id!r} holding {notebook!r}: it was removed before the commit")
    if notebook not in manifest.kernels:
        raise SnapshotNotFound(f"snapshot {manifest.id} holds no kernel state of {notebook!r}")
    return manifest.kernels[notebook]


def newest_kernel_records(listing: list[Manifest]) -> dict[str, dict[str, Any]]:
    """Every notebook's newest committed kernel record in `listing` (newest first, as `engine.manifests()`)."""
    out: dict[str, dict[str, Any]] = {}
    for manifest in listing:
        for notebook, record in manifest.kernels.items():
            out.setdefault(notebook, record)
    return out


def with_files(engine: SnapshotEngine, ref: str = "latest") -> Manifest | None:
    """The snapshot `ref`, or for `latest` the newest one holding workspace files; None when there is none."""
    if ref not in ("latest", "", None):
        return engine.get(ref)
    found = next((m for m in engine.manifests()
                  if (m.files or {}).get("entries") is not None and m.kind == PROJECT_KIND), None)
    # a newer snapshot that fails its checks may be the one with files: refuse rather than fall back past it
    engine.refuse_newer_than(found)
    return found


def ignore_rules(engine: SnapshotEngine, workspace: str) -> IgnoreRules:
    """The workspace's rules, plus the local store itself when it lives inside the workspace."""
    excluded = [engine.store.base] if engine.store.local else []
    return IgnoreRules.for_workspace(workspace, excluded)


def snapshot_project(
    engine: SnapshotEngine,
    workspace: str,
    kernels: Mapping[str, Mapping[str, Any]] | None = None,
    message: str | None = None,
    extra_stats: Mapping[str, Any] | None = None,
    only_if_changed: bool = False,
    chunk_size: int = CHUNK_SIZE,
    progress: Progress | None = None,
) -> Manifest | None:
    """Back up the workspace (only what changed) and commit one manifest naming it and `kernels`' records.

    With `only_if_changed`, nothing is committed (None is returned) when files and kernel records
    are the same as in the previous project snapshot.
    """
    started = time.perf_counter()
    with engine.writing() as lease:  # before any presence check of what is reused: gc waits or leaves objects
        try:
            previous = with_files(engine)
        except SpotWarpError:
            previous = None  # a refused newest snapshot: back up everything afresh rather than fail
        files, objects, stats = backup_workspace(
            engine.store, workspace, previous.files if previous else None, ignore_rules(engine, workspace),
            chunk_size=chunk_size, progress=progress,
        )
        kernels = {nb: dict(rec) for nb, rec in (kernels or {}).items()}
        if only_if_changed and previous is not None and not files_changed(previous.files, files) \
                and previous.kernels == kernels:
            return None
        named_by_kernels: dict[str, int] = {}
        for record in kernels.values():
            named_by_kernels.update(record_objects(record))
        # kernels' records come from manifests a gc may have dropped (with their objects) before our lease
        missing = set(named_by_kernels) - engine.store.present(named_by_kernels)
        if missing:
            raise StorageError(f"{len(missing)} objects of the kernels' snapshots were removed by a gc meanwhile: "
                               "snapshot not committed; take it again")
        objects.update(named_by_kernels)
        manifest = engine.new_manifest(PROJECT_KIND, message, parent=previous.id if previous else None,
                                       kernels=kernels, files=files, objects=objects)
        manifest.stats = {**stats.as_dict(), "bytes_written": stats.bytes_written,
                          "objects_written": stats.objects_written, "bytes_total": manifest.size,
                          "variables": sum(len(r.get("variables", {})) for r in kernels.values()),
                          **(extra_stats or {})}
        manifest.stats["duration_s"] = round(time.perf_counter() - started, 4)
        engine.check_lease(lease, manifest)
        return engine.commit_manifest(manifest)


def restore_project_files(engine: SnapshotEngine, manifest: Manifest, workspace: str,
                          progress: Progress | None = None) -> FileRestoreReport:
    """Bring the snapshot's files back into `workspace` (checked, verified, never outside it)."""
    return restore_files(engine.store, manifest.files or {}, workspace, progress=progress)
