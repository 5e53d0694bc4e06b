"""Writers: who stores a captured image while the kernel runs on, behind one job object (BackgroundSnapshot).

A forked child (Redis BGSAVE-style), a thread for few small values (background), or a staged copy written
from a thread at a training loop's step (staged).

Each stores the image through a `Commit` (the engine's commit path, bound to a notebook by the caller).

May import: variables, pickling, incremental, manifests and the engine's base modules.
"""

from .background import (
    BackgroundSnapshot,
    Commit,
    cuda_in_use,
    fork_unavailable_reason,
    start_background,
    start_in_thread,
)
from .staged import start_staged

__all__ = [
    "BackgroundSnapshot", "Commit", "cuda_in_use", "fork_unavailable_reason", "start_background", "start_in_thread",
    "start_staged",
]
