"""Project snapshots: workspace files plus the kernel state of every live notebook, committed as one manifest."""

from __future__ import annotations

import time
from typing import Any, Mapping

from .errors import SnapshotNotFound
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


def kernel_state(engine: SnapshotEngine, ref: str, notebook: str) -> dict[str, Any]:
    """The kernel record of `notebook` in snapshot `ref` (what a kernel just committed)."""
    manifest = engine.get(ref)
    if notebook not in manifest.kernels:
        raise SnapshotNotFound(f"snapshot {manifest.id} holds no kernel state of {notebook!r}")
    return manifest.kernels[notebook]


def latest_kernel_state(engine: SnapshotEngine, notebook: str) -> tuple[str, dict[str, Any]] | None:
    """(snapshot id, record) of the newest committed state of `notebook`, if any."""
    listing = engine.manifests(notebook)
    return (listing[0].id, listing[0].kernels[notebook]) if listing else None


def carried_kernel_states(engine: SnapshotEngine) -> dict[str, dict[str, Any]]:
    """Every notebook's newest committed kernel record (what a newly promoted host carries on)."""
    out: dict[str, dict[str, Any]] = {}
    for manifest in engine.manifests():
        for notebook, record in manifest.kernels.items():
            out.setdefault(notebook, record)
    return out


def with_files(engine: SnapshotEngine, ref: str = "latest") -> Manifest | None:
    """The snapshot `ref`, or for `latest` the newest one holding workspace files; None when there is none."""
    if ref not in ("latest", "", None):
        return engine.get(ref)
    for manifest in engine.manifests():
        if (manifest.files or {}).get("entries") is not None and manifest.kind == PROJECT_KIND:
            return manifest
    return None


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
    previous = with_files(engine)
    files, objects, stats = backup_workspace(
        engine.store, workspace, previous.files if previous else None, ignore_rules(engine, workspace),
        chunk_size=chunk_size, progress=progress,
    )
    kernels = {nb: dict(rec) for nb, rec in (kernels or {}).items()}
    if only_if_changed and previous is not None and not files_changed(previous.files, files) \
            and previous.kernels == kernels:
        return None
    for record in kernels.values():
        objects.update(record_objects(record))
    manifest = engine.new_manifest(PROJECT_KIND, message, parent=previous.id if previous else None,
                                   kernels=kernels, files=files, objects=objects)
    manifest.stats = {**stats.as_dict(), "bytes_written": stats.bytes_written,
                      "objects_written": stats.objects_written, "bytes_total": manifest.size,
                      "variables": sum(len(r.get("variables", {})) for r in kernels.values()),
                      **(extra_stats or {})}
    manifest.stats["duration_s"] = round(time.perf_counter() - started, 4)
    return engine.commit_manifest(manifest)


def restore_project_files(engine: SnapshotEngine, manifest: Manifest, workspace: str,
                          progress: Progress | None = None) -> FileRestoreReport:
    """Bring the snapshot's files back into `workspace` (checked, verified, never outside it)."""
    return restore_files(engine.store, manifest.files or {}, workspace, progress=progress)
