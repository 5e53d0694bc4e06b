"""The Python API behind `import spotwarp`: snapshot, restore (and resumable, for training loops)."""

from __future__ import annotations

from typing import Any

from .engine import Manifest
from .training import resumable  # noqa: F401 - part of the `spotwarp` API


def _session():
    from .kernel import session as session_module

    if session_module._current is None:
        try:
            from IPython import get_ipython
        except ImportError:  # pragma: no cover
            get_ipython = lambda: None  # noqa: E731
        shell = get_ipython()
        if shell is not None:
            shell.extension_manager.load_extension("spotwarp")
    return session_module.current()


def snapshot(message: str | None = None) -> Manifest:
    """Take a snapshot of this kernel's variables now; returns its manifest (id, size, stats)."""
    return _session().snapshot(message)


def restore(snapshot: str = "latest", variables: list[str] | None = None) -> Any:
    """Restore this kernel's variables from a snapshot (all, or the names in `variables`)."""
    if isinstance(variables, str):
        variables = [v.strip() for v in variables.split(",") if v.strip()]
    return _session().restore(snapshot, variables)
