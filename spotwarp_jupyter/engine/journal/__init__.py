"""The journal: what happened to a project across hosts (events), and what preemptions cost (report).

May import: manifests, storage and the engine's base modules.
"""

from .events import (
    CANDIDATE_READY,
    FAILOVER_FINISHED,
    FINAL_SNAPSHOT_COMMITTED,
    HOST_LOST,
    KERNEL_RESUMED,
    NOTICE_SEEN,
    PREEMPTION_DETECTED,
    PROMOTED,
    RACE_STARTED,
    TRAINING_RESUMED,
    Event,
    Journal,
    restoring,
)
from .report import capture_time, failover_rows, loss_without_notice, report, resume_rows

__all__ = [
    "CANDIDATE_READY", "capture_time", "Event", "FAILOVER_FINISHED", "failover_rows", "FINAL_SNAPSHOT_COMMITTED",
    "HOST_LOST", "Journal", "KERNEL_RESUMED", "loss_without_notice", "NOTICE_SEEN", "PREEMPTION_DETECTED", "PROMOTED", "RACE_STARTED", "report", "restoring",
    "resume_rows", "TRAINING_RESUMED",
]
