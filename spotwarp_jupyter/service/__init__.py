"""The project service: one synchronous core behind the CLI, the REST API and the hub (no Jupyter imports)."""

from .project import KernelRestorer, Project
from .records import (
    VIA_CLI,
    VIA_HUB,
    VIA_REST,
    VIA_START,
    KernelAnswer,
    KernelRestore,
    KernelStatus,
    LiveKernel,
    ProjectStatus,
    RestoreProgress,
    RestoreResult,
    ServerFacts,
    SnapshotSummary,
)
from .wire import manifest_summary

__all__ = [
    "VIA_CLI", "VIA_HUB", "VIA_REST", "VIA_START", "KernelAnswer", "KernelRestore", "KernelRestorer", "KernelStatus",
    "LiveKernel", "Project", "ProjectStatus", "RestoreProgress", "RestoreResult", "ServerFacts", "SnapshotSummary",
    "manifest_summary",
]
