"""Restore: read a kernel record's objects (verified against their hashes) and rebuild its variables.

Every object is read and checked before any variable is touched, so a damaged snapshot changes
nothing; if rebuilding fails midway, the names already bound are put back as they were.
"""

from __future__ import annotations

import importlib
import mmap
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from . import pickling
from .capture import EXTRAS_NAME
from .errors import SpotWarpError
from .store import Store

_MISSING = object()


@dataclass
class RestoreResult:
    """What a restore brought back."""

    restored: list[str] = field(default_factory=list)
    imports: dict[str, str] = field(default_factory=dict)
    skipped_at_snapshot: dict[str, str] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    extras: dict[str, Any] = field(default_factory=dict)
    bytes_read: int = 0


def _select_groups(record: dict[str, Any], variables: list[str] | None) -> list[int]:
    groups = record.get("groups", [])
    provider = {name: i for i, g in enumerate(groups) for name in g["names"]}
    if variables is None:
        wanted = list(range(len(groups)))
    else:
        missing = [v for v in variables if v not in provider]
        if missing:
            known = ", ".join(sorted(n for n in provider if n != EXTRAS_NAME)) or "none"
            raise SpotWarpError(f"not in this snapshot: {', '.join(missing)} (it holds: {known})")
        wanted = sorted({provider[v] for v in variables})
        if EXTRAS_NAME in provider:
            wanted.append(provider[EXTRAS_NAME])
    # definitions a group refers to by name come first (topological order, cycles tolerated)
    order: list[int] = []
    state: dict[int, int] = {}

    def visit(i: int) -> None:
        if state.get(i):
            return
        state[i] = 1
        for name in groups[i].get("requires", []):
            if name in provider:
                visit(provider[name])
        state[i] = 2
        order.append(i)

    for i in wanted:
        visit(i)
    return order


def _allocate(size: int) -> Any:
    """A writable buffer for a restored array; large ones are lazily zeroed pages (no up-front memset)."""
    if size < (1 << 20):
        return bytearray(size)
    return mmap.mmap(-1, size)


def _read_group(store: Store, group: dict[str, Any], pool: ThreadPoolExecutor) -> tuple[bytes, list[Any], int]:
    ref = group["pickle"]
    data_future = pool.submit(store.read_object, ref["id"], ref["size"])
    buffers: list[Any] = []
    futures = []
    for buf in group.get("buffers", []):
        target = _allocate(buf["size"])
        view = memoryview(target)
        offset = 0
        for chunk in buf["chunks"]:
            futures.append(pool.submit(store.read_object_into, chunk["id"], view[offset:offset + chunk["size"]]))
            offset += chunk["size"]
        buffers.append(target)
    for f in futures:
        f.result()
    data = data_future.result()
    return data, buffers, len(data) + sum(len(b) for b in buffers)


def restore_record(
    store: Store,
    record: dict[str, Any],
    namespace: dict[str, Any],
    variables: list[str] | None = None,
    device_map: dict[str, str] | None = None,
) -> RestoreResult:
    """Bring the record's variables (all, or `variables` and what they need) back into `namespace`."""
    result = RestoreResult(skipped_at_snapshot=dict(record.get("skipped", {})))
    groups = record.get("groups", [])
    order = _select_groups(record, variables)
    with ThreadPoolExecutor(max_workers=4, thread_name_prefix="spotwarp-get") as pool:
        loaded = {i: _read_group(store, groups[i], pool) for i in order}
    result.bytes_read = sum(v[2] for v in loaded.values())

    previous: dict[str, Any] = {}
    try:
        with pickling.main_namespace(namespace) as main, pickling.device_notes(device_map) as notes:
            for name, module in (record.get("imports") or {}).items():
                if variables is not None and name not in variables:
                    continue
                try:
                    value = importlib.import_module(module)
                except Exception as exc:  # noqa: BLE001
                    result.warnings.append(f"module {module} (as {name}) is not importable here: {exc}")
                    continue
                previous.setdefault(name, namespace.get(name, _MISSING))
                namespace[name] = value
                main.bind(name, value)
                result.imports[name] = module
            for i in order:
                data, buffers, _n = loaded[i]
                group = groups[i]
                values = pickling.loads(group["codec"], data, buffers)
                for name, value in values.items():
                    if name == EXTRAS_NAME:
                        result.extras = value
                        continue
                    previous.setdefault(name, namespace.get(name, _MISSING))
                    namespace[name] = value
                    main.bind(name, value)
                    result.restored.append(name)
            changed = record.get("changed") or {}
            for name in sorted(set(result.restored) & set(changed)):
                result.warnings.append(f"{name}: {changed[name]}")
            for device in sorted(notes.moved):
                result.warnings.append(f"tensors saved on {device} were restored to CPU: {device} is not available here")
    except SpotWarpError:
        _roll_back(namespace, previous)
        raise
    except Exception as exc:  # noqa: BLE001
        _roll_back(namespace, previous)
        raise SpotWarpError(f"restore failed and changed nothing: {type(exc).__name__}: {exc}") from exc
    return result


def _roll_back(namespace: dict[str, Any], previous: dict[str, Any]) -> None:
    for name, value in previous.items():
        if value is _MISSING:
            namespace.pop(name, None)
        else:
            namespace[name] = value
