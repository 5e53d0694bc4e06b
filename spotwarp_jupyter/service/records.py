"""Typed records of what the project service and a kernel's session answer: snapshot summaries, status, restore results.

They hold facts only; `wire.py` turns them into the JSON of api/openapi.yaml and of `--json`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from ..engine.files import FileRestoreReport
from ..engine.journal import Event
from ..engine.manifests import Manifest

# the doors a restore comes through, as the journal's restore events name them (`via`)
VIA_CLI = "cli"
VIA_START = "spotwarp start"
VIA_REST = "rest"
VIA_HUB = "hub"
VIAS = (VIA_CLI, VIA_START, VIA_REST, VIA_HUB)


@dataclass(frozen=True)
class SnapshotSummary:
    """One committed snapshot as a listing shows it."""

    id: str
    created: str
    created_ts: float
    host: str
    kind: str
    message: str | None
    size: int
    bytes_written: int
    duration_s: float | None
    notebooks: list[str]
    variables: list[str]
    files: int
    parent: str | None
    signed: bool
    generation: int
    holder: str | None
    stats: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, m: Manifest) -> "SnapshotSummary":
        """The summary of manifest `m`."""
        return cls(
            id=m.id, created=m.created_iso, created_ts=m.created, host=m.host, kind=m.kind, message=m.message,
            size=m.size, bytes_written=m.stats.get("bytes_written", 0), duration_s=m.stats.get("duration_s"),
            notebooks=sorted(m.kernels),
            variables=sorted({v for k in m.kernels.values() for v in k.get("variables", {})}),
            files=len(m.files.get("entries", {})) if isinstance(m.files, dict) else 0,
            parent=m.parent, signed=m.signed, generation=m.generation, holder=m.holder, stats=dict(m.stats),
        )

    def age_s(self, now: float | None = None) -> float:
        """Seconds since it was committed, to a tenth."""
        return round((time.time() if now is None else now) - self.created_ts, 1)


@dataclass(frozen=True)
class LiveKernel:
    """A kernel running in the server, the notebook of its session (None without one), its newest snapshot."""

    kernel_id: str
    notebook: str | None
    last_snapshot: str | None = None
    execution_state: str | None = None  # as the server last heard it: "busy" while a cell runs, "idle", ...
    started_at: float | None = None  # when the server started (or restarted) it; None: before this server knew
    restored_from: str | None = None  # the snapshot the server restored it from (a resume or a REST restore)
    newer: dict[str, Any] | None = None  # the notebook's stored state this kernel does not hold (Project.status)


@dataclass(frozen=True)
class KernelAnswer:
    """What one live kernel answered a snapshot request: the snapshot it committed, or why not."""

    kernel_id: str
    notebook: str | None
    committed: str | None = None
    error: str | None = None
    asked: bool = True


@dataclass(frozen=True)
class KernelRestore:
    """What one live kernel answered a restore request: the variables it restored, or why not."""

    kernel_id: str
    notebook: str | None
    snapshot: str | None = None
    restored: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    error: str | None = None


@dataclass(frozen=True)
class ProjectStatus:
    """A project as its store holds it: snapshots, the newest one and its age, recent events, the report."""

    project: str
    storage: str
    workspace: str | None
    snapshots: int
    last_snapshot: SnapshotSummary | None
    age_s: float | None
    rejected: dict[str, str]
    recent_events: list[Event]
    report: dict[str, Any] | None = None
    kernels: list[LiveKernel] = field(default_factory=list)


@dataclass(frozen=True)
class ServerFacts:
    """What only a running server knows of itself, for `GET status`."""

    version: str
    watchers: list[dict[str, Any]]
    last_error: str | None
    failover: dict[str, Any]
    resume: list[dict[str, Any]] = field(default_factory=list)  # notebooks resumed on this host (server/resume.py)
    trust: dict[str, Any] | None = None  # this host's key and whether its resume is vouched for (engine/keys.py)


@dataclass(frozen=True)
class RestoreResult:
    """One restore: the snapshot chosen, what came back into the workspace and kernels, through which door."""

    snapshot: SnapshotSummary
    via: str
    workspace: str | None
    files: FileRestoreReport | None
    kernels: list[KernelRestore]
    duration_s: float
    journaled: bool
    rebuilt: tuple[str, ...] = ()  # notebooks written from the cells their kernels ran (absent or behind)


@dataclass(frozen=True)
class RestoreProgress:
    """A kernel's last restore: the snapshot, when its variables were usable and complete, what loads or failed."""

    snapshot: str
    usable_s: float | None
    complete_s: float | None
    loading: list[str]
    failed: dict[str, str]


@dataclass(frozen=True)
class KernelStatus:
    """One kernel's SpotWarp session: what `%spotwarp status`, the widget and the server's status request show."""

    project: str
    storage: str
    notebook: str
    policy: dict[str, Any]
    policy_text: str
    last_snapshot: SnapshotSummary | None  # this kernel's last committed snapshot
    in_flight: bool
    last_pause_s: float | None
    skipped: dict[str, str]
    changed: dict[str, str]
    last_error: str | None
    restore: RestoreProgress | None
    read_at: float = field(default_factory=time.time)  # when these facts were read: ages count from here
    imports: dict[str, str] = field(default_factory=dict)  # modules the last snapshot saved by name: name -> import path
    resumed: dict[str, Any] | None = None  # restored by the server on a new host (kernel/resume.py): what it did
    cadence: dict[str, Any] | None = None  # snapshots at a loop's steps: interval_s, redo_window_s, overhead_pct, ...
    trust: str | None = None  # this host has no key for the project: what that means, what to do (engine/keys.py)
