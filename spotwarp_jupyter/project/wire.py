"""The one place records become JSON: the answers of api/openapi.yaml and of `spotwarp ... --json`.

Keys here are public (SPEC.md, docs/cli.md, the panel's types generated from openapi.yaml): add, never rename.
"""

from __future__ import annotations

from typing import Any, Sequence

from ..engine.manifest import Manifest
from .records import KernelRestore, ProjectStatus, RestoreResult, ServerFacts, SnapshotSummary


def summary_json(s: SnapshotSummary) -> dict[str, Any]:
    """The stable JSON shape of one snapshot in `list --json` and the REST API (`SnapshotSummary`)."""
    return {
        "id": s.id, "created": s.created, "host": s.host, "kind": s.kind, "message": s.message, "size": s.size,
        "bytes_written": s.bytes_written, "duration_s": s.duration_s, "notebooks": list(s.notebooks),
        "variables": list(s.variables), "files": s.files, "parent": s.parent, "signed": s.signed,
        "generation": s.generation, "holder": s.holder,
    }


def manifest_summary(m: Manifest) -> dict[str, Any]:
    """`summary_json` of a manifest."""
    return summary_json(SnapshotSummary.of(m))


def snapshot_json(s: SnapshotSummary) -> dict[str, Any]:
    """A snapshot just taken: its summary and the stats of taking it (`POST snapshots`, `spotwarp snapshot`)."""
    return {**summary_json(s), "stats": dict(s.stats)}


def list_json(project: str, storage: str, snapshots: Sequence[SnapshotSummary]) -> dict[str, Any]:
    """`spotwarp list --json`."""
    return {"project": project, "storage": storage, "snapshots": [summary_json(s) for s in snapshots]}


def _last_snapshot(status: ProjectStatus) -> dict[str, Any] | None:
    if status.last_snapshot is None:
        return None
    return {**summary_json(status.last_snapshot), "age_s": status.age_s}


def cli_status_json(status: ProjectStatus) -> dict[str, Any]:
    """`spotwarp status --json`."""
    return {
        "project": status.project, "storage": status.storage, "snapshots": status.snapshots,
        "last_snapshot": _last_snapshot(status), "rejected": dict(status.rejected),
        "events": [e.as_dict() for e in status.recent_events],
    }


def rest_status_json(status: ProjectStatus, server: ServerFacts) -> dict[str, Any]:
    """`GET status` (schema `Status`), less `start_restore`, which the handler adds."""
    return {
        "version": server.version, "project": status.project, "storage": status.storage,
        "workspace": status.workspace, "last_snapshot": _last_snapshot(status),
        "kernels": [{"kernel_id": k.kernel_id, "notebook": k.notebook, "last_snapshot": k.last_snapshot}
                    for k in status.kernels],
        "watchers": list(server.watchers), "last_error": server.last_error, "report": status.report,
        "failover": server.failover,
    }


def kernel_restore_json(k: KernelRestore) -> dict[str, Any]:
    """One kernel of a REST restore: what it restored, or its error."""
    out: dict[str, Any] = {"kernel_id": k.kernel_id, "notebook": k.notebook}
    if k.error is not None:
        return {**out, "restored": list(k.restored), "error": k.error}
    return {**out, "id": k.snapshot, "restored": list(k.restored), "warnings": list(k.warnings)}


def rest_restore_json(r: RestoreResult) -> dict[str, Any]:
    """`POST snapshots/{id}/restore` (schema `RestoreResult`)."""
    files = r.files
    return {"id": r.snapshot.id, "files_restored": files.files_restored if files else 0,
            "files_unchanged": files.files_unchanged if files else 0,
            "bytes_restored": files.bytes_restored if files else 0,
            "duration_s": round(files.duration_s, 3) if files else 0.0,
            "kernels": [kernel_restore_json(k) for k in r.kernels]}


def cli_restore_json(r: RestoreResult) -> dict[str, Any]:
    """`spotwarp restore --json`."""
    data: dict[str, Any] = {"id": r.snapshot.id, "notebooks": list(r.snapshot.notebooks), "files_restored": 0}
    if r.files is not None:
        data.update(r.files.as_dict())
        data["workspace"] = r.workspace
    return data


def start_restore_json(r: RestoreResult) -> dict[str, Any]:
    """`restored` in `spotwarp start --json`."""
    return {"id": r.snapshot.id, **(r.files.as_dict() if r.files else {})}


def hub_restore_json(r: RestoreResult) -> dict[str, Any]:
    """`start_restore` in `GET status` after a restore-on-start."""
    files = r.files
    return {"restored": True, "id": r.snapshot.id, "host": r.snapshot.host, "created": r.snapshot.created,
            "files_restored": files.files_restored if files else 0,
            "files_unchanged": files.files_unchanged if files else 0,
            "bytes_restored": files.bytes_restored if files else 0, "notebooks": list(r.snapshot.notebooks),
            "duration_s": round(r.duration_s, 3)}
