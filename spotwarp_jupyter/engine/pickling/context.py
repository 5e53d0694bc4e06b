"""Where `__main__` lookups and restored devices point while pickling or unpickling (thread-local).

`main_namespace` lets the engine save and load a plain dict namespace as if it were `__main__`;
`device_notes` collects the devices a restore had to move to CPU; `stream_memo` holds, while one stream is
written, the tensor storages and arrays it has saved (views of them refer to those instead of copying).
"""

from __future__ import annotations

import sys
import threading
import types
from typing import Any

_restore_notes = threading.local()


class _NamespaceModule(types.ModuleType):
    """Stands in for `__main__` when the engine works on a plain dict namespace."""


def _main_module() -> types.ModuleType:
    override = getattr(_restore_notes, "main", None)
    return override if override is not None else sys.modules["__main__"]


class main_namespace:
    """Within this block, `__main__` lookups (save and load) use `namespace` instead of sys.modules."""

    def __init__(self, namespace: dict[str, Any] | None):
        self.namespace = namespace

    def __enter__(self) -> "main_namespace":
        main = sys.modules.get("__main__")
        if self.namespace is not None and (main is None or main.__dict__ is not self.namespace):
            module = _NamespaceModule("__main__")
            module.__dict__.update(self.namespace)
            module.__dict__["__name__"] = "__main__"
            self._module = module
            _restore_notes.main = module
        else:
            self._module = None
            _restore_notes.main = None
        return self

    def bind(self, name: str, value: Any) -> None:
        """Make `name` visible to `__main__` lookups during this block."""
        if self._module is not None:
            setattr(self._module, name, value)

    def __exit__(self, *exc: Any) -> None:
        _restore_notes.main = None


def restore_device(device: str) -> str:
    """The device a tensor saved on `device` goes to here: the same one if present, else CPU."""
    if device == "cpu" or device.startswith("cpu"):
        return "cpu"
    mapping = getattr(_restore_notes, "device_map", None)
    if mapping and device in mapping:
        return mapping[device]
    import torch

    kind, _, index = device.partition(":")
    available = False
    if kind == "cuda":
        available = torch.cuda.is_available() and int(index or 0) < torch.cuda.device_count()
    elif kind == "mps":
        available = bool(getattr(torch.backends, "mps", None)) and torch.backends.mps.is_available()
    if available:
        return device
    notes = getattr(_restore_notes, "moved", None)
    if notes is not None:
        notes.add(device)
    return "cpu"


class device_notes:
    """Collects the devices that were missing during one restore (they went to CPU), and what rebuilders `say`."""

    def __init__(self, device_map: dict[str, str] | None = None):
        self.moved: set[str] = set()
        self.said: list[str] = []
        self.device_map = device_map

    def __enter__(self) -> "device_notes":
        _restore_notes.moved = self.moved
        _restore_notes.said = self.said
        _restore_notes.device_map = self.device_map
        return self

    def __exit__(self, *exc: Any) -> None:
        _restore_notes.moved = None
        _restore_notes.said = None
        _restore_notes.device_map = None


def say(note: str) -> None:
    """A warning for the restore in progress (an object that could not come back as it was)."""
    said = getattr(_restore_notes, "said", None)
    if said is not None and note not in said:
        said.append(note)


_stream = threading.local()


class stream_memo:
    """Within this block (one pickler's dump), the storages and arrays saved so far (read with `saved`)."""

    def __enter__(self) -> "stream_memo":
        self.outer = getattr(_stream, "saved", None)
        _stream.saved = ({}, set())
        return self

    def __exit__(self, *exc: Any) -> None:
        _stream.saved = self.outer


def saved() -> tuple[dict[Any, Any], set[int]] | None:
    """(storage key -> the storage being saved, ids of the arrays saved) of the stream being written, if any."""
    return getattr(_stream, "saved", None)
