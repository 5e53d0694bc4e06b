"""Deep-learning state for snapshots: resumable training loops and random number generator states.

No Jupyter imports: the kernel extension registers `state_providers()` with its session.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

from .resumable import (
    Resumable,
    capture_positions,
    pending_positions,
    restore_positions,
    resumable,
)
from .rng import capture_rng, restore_rng


def _restore_rng_and_warn(state: dict[str, Any]) -> None:
    for line in restore_rng(state):
        warnings.warn(line, RuntimeWarning, stacklevel=2)


def _restore_positions_and_tell(states: dict[str, Any]) -> None:
    restore_positions(states)
    waiting = pending_positions()
    if waiting:
        where = ", ".join(f"{name!r} after step {position}" for name, position in sorted(waiting.items()))
        print(f"SpotWarp: re-run the training cell to continue its loops: {where}")


def state_providers() -> dict[str, tuple[Callable[[], Any], Callable[[Any], None]]]:
    """name -> (capture, restore) for the kernel session's STATE_PROVIDERS registry."""
    return {"rng": (capture_rng, _restore_rng_and_warn), "resumables": (capture_positions, _restore_positions_and_tell)}


def register_state_providers(registry: dict[str, Any]) -> None:
    """Add the RNG and resumable-position providers to `registry` (idempotent)."""
    registry.update(state_providers())


__all__ = [
    "Resumable", "capture_positions", "capture_rng", "pending_positions", "register_state_providers",
    "restore_positions", "restore_rng", "resumable", "state_providers",
]
