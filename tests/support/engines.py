"""The engines tests build: one project in one store, with the key and settings the test names.

What a key means differs by its value, so tests say which they want: `None` (the default, as in SnapshotEngine)
takes this host's key, `SPOTWARP_KEY` or else the one kept for the project (what a kernel the test started
settled in the session's SPOTWARP_CONFIG_DIR), and signs and checks with it when there is one; `UNSIGNED`
(b"") signs and checks nothing, whatever the environment or the kept keys say.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from spotwarp_jupyter.engine import Settings, SnapshotEngine
from spotwarp_jupyter.engine.coordination.fence import Fence

from storage_servers import StorageTarget

UNSIGNED = b""


def engine_settings(storage: str | Path | StorageTarget, project: str = "proj", *, resolved: bool = True,
                    **fields: Any) -> Settings:
    """The settings of `project` in `storage`, with none taken from this process's environment.

    A `StorageTarget` brings its own storage options. `resolved` goes through `Settings.resolve` as a host's
    start does (the project name checked, a local path made absolute, `~` expanded); `resolved=False` is the
    dataclass as given, for tests that build it so.
    """
    if isinstance(storage, StorageTarget):
        storage, fields = storage.url, {"storage_options": storage.options, **fields}
    if resolved:
        return Settings.resolve(project=project, storage=str(storage), env={}, **fields)
    return Settings(project=project, storage=str(storage), **fields)


def make_engine(storage: str | Path | StorageTarget, project: str = "proj", *, key: bytes | str | None = None,
                fence: Fence | None = None, create: bool = True, resolved: bool = True,
                **fields: Any) -> SnapshotEngine:
    """An engine of `project` in `storage`, of its own (its own Store and caches, as another host or process
    has): `key` None for this host's key, `UNSIGNED` for none, or the key itself (text is encoded); `fields`
    are the other settings (`storage_options`, `workspace`)."""
    key = key.encode() if isinstance(key, str) else key
    settings = engine_settings(storage, project, resolved=resolved, **fields)
    return SnapshotEngine(settings, key=key, create=create, fence=fence)
