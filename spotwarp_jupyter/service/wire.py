"""The one place records become JSON: the answers of api/openapi.yaml, of `spotwarp ... --json`, and of a
kernel's status (`%spotwarp status`, the widget, the server's status request), with that status's text.

Keys here are public (SPEC.md, docs/cli.md, the panel's types generated from openapi.yaml): add, never rename.
"""

from __future__ import annotations

from typing import Any, Sequence

from ..engine.manifests import Manifest
from ..engine.units import format_duration, format_size
from .records import (
    KernelRestore,
    KernelStatus,
    ProjectStatus,
    RestoreProgress,
    RestoreResult,
    ServerFacts,
    SnapshotSummary,
)


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
        "kernels": [{"kernel_id": k.kernel_id, "notebook": k.notebook, "last_snapshot": k.last_snapshot,
                     "execution_state": k.execution_state, "newer": k.newer} for k in status.kernels],
        "watchers": list(server.watchers), "last_error": server.last_error, "report": status.report,
        "failover": server.failover, "resume": [dict(e) for e in server.resume], "rejected": dict(status.rejected),
        "trust": dict(server.trust) if server.trust is not None else None,
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
            "files_kept": files.files_kept if files else 0,
            "server_state_skipped": list(files.server_state_skipped) if files else [],
            "duration_s": round(r.duration_s, 3)}


def _rounded(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


def restore_progress_json(r: RestoreProgress) -> dict[str, Any]:
    """`restore` in a kernel's status: snapshot id, usable_s, complete_s, loading, failed."""
    return {"id": r.snapshot, "usable_s": _rounded(r.usable_s, 3), "complete_s": _rounded(r.complete_s, 3),
            "loading": list(r.loading), "failed": dict(r.failed)}


def kernel_last_snapshot_json(s: SnapshotSummary, now: float) -> dict[str, Any]:
    """`last_snapshot` in a kernel's status: the kernel's own last snapshot and what taking it cost."""
    return {"id": s.id, "created": s.created, "age_s": s.age_s(now), "size": s.size,
            "bytes_written": s.stats.get("bytes_written"), "duration_s": s.duration_s,
            "pause_s": s.stats.get("pause_s")}


def kernel_status_json(k: KernelStatus) -> dict[str, Any]:
    """A kernel's status: `%spotwarp status`, the widget's `status`, the kernel's answer to a status request."""
    return {
        "project": k.project, "storage": k.storage, "notebook": k.notebook, "policy": dict(k.policy),
        "last_snapshot": None if k.last_snapshot is None else kernel_last_snapshot_json(k.last_snapshot, k.read_at),
        "in_flight": k.in_flight, "last_pause_s": _rounded(k.last_pause_s, 4),
        "skipped": dict(k.skipped), "changed": dict(k.changed), "last_error": k.last_error,
        "restore": None if k.restore is None else restore_progress_json(k.restore),
        "imports": dict(k.imports), "resumed": None if k.resumed is None else dict(k.resumed),
        "cadence": None if k.cadence is None else dict(k.cadence), "trust": k.trust,
    }


def newer_snapshot_line(newer: dict[str, Any]) -> str:
    """`%spotwarp status`'s line for a newer snapshot of the notebook than the kernel's state (the widget's offer)."""
    return (f"  newer     a newer snapshot of this notebook: {newer['id']}, {format_duration(newer['age_s'])} old, "
            f"from {newer['host']}; %spotwarp restore latest brings it back")


def kernel_status_text(k: KernelStatus) -> str:
    """What `%spotwarp status` prints."""
    s = kernel_status_json(k)
    lines = [f"SpotWarp: project {s['project']} · notebook {s['notebook']}", f"  storage   {s['storage']}",
             f"  policy    {k.policy_text}"]
    if k.cadence:
        lines.append(f"  cadence   {k.cadence['text']}")
    last = s["last_snapshot"]
    if last:
        pause = f" · paused the kernel {format_duration(last['pause_s'])}" if last.get("pause_s") is not None else ""
        lines.append(f"  last      {last['id']} · {format_duration(last['age_s'])} ago · {format_size(last['size'])}"
                     f" · wrote {format_size(last['bytes_written'] or 0)} in {format_duration(last['duration_s'] or 0)}"
                     f"{pause}")
    else:
        lines.append("  last      no snapshot from this kernel yet")
    if s.get("in_flight"):
        lines.append("  now       a background snapshot is being written")
    if s["last_error"]:
        lines.append(f"  error     {s['last_error']}")
    if s.get("resumed"):
        lines.append(f"  resumed   {s['resumed']['line']}")
    if s.get("trust"):
        lines.append(f"  key       {s['trust']}")
    restore = s.get("restore")
    if restore and (restore["loading"] or restore["failed"] or restore["complete_s"] != restore["usable_s"]):
        done = (f"complete in {format_duration(restore['complete_s'])}" if restore["complete_s"] is not None
                else "still loading " + ", ".join(restore["loading"]))
        lines.append(f"  restore   {restore['id']}: usable in {format_duration(restore['usable_s'])}, {done}"
                     + (f"; failed: {', '.join(sorted(restore['failed']))}" if restore["failed"] else ""))
    for key, title in (("skipped", "  skipped   (not saved)"), ("changed", "  changed   (saved, but not as they were)")):
        if s[key]:
            lines.append(title)
            lines += [f"    {name}: {reason}" for name, reason in sorted(s[key].items())]
    if s["imports"]:  # modules come back by import: `np` as numpy, `trainers` as tokenizers.trainers
        lines.append("  modules   " + ", ".join(name if name == path else f"{name} ({path})"
                                                for name, path in sorted(s["imports"].items())))
    return "\n".join(lines)
