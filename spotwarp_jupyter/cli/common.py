"""What every `spotwarp` command shares: exit codes, the command registry, the engine from flags, output."""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from typing import Any, Callable

from ..engine import ConfigError, Settings, SnapshotEngine, SpotWarpError
from ..engine.keys import use_key
from ..engine.storage import Layout
from ..engine.units import format_size

EXIT_OK, EXIT_FAILURE, EXIT_USAGE = 0, 1, 2
COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {}


def command(name: str):
    """Register the decorated function as `spotwarp NAME`."""
    def register(fn: Callable[[argparse.Namespace], int]):
        COMMANDS[name] = fn
        return fn
    return register


def _engine(args: argparse.Namespace, create: bool = False, fence: Any = None) -> SnapshotEngine:
    from ..jupyter_config import server_config_layer

    settings = Settings.resolve(project=getattr(args, "project", None), storage=args.storage,
                                workspace=getattr(args, "workspace", None), config=server_config_layer())
    engine = SnapshotEngine(settings, create=create, fence=fence)
    if engine.key:  # the project's kept key signs this command's lease entries and events too
        use_key(engine.key)
    return engine


# what a project's folder holds once anything of it is stored (snapshots, objects, a host's heartbeat, the
# journal, the lease); a folder with only `locks` holds nothing of a project
PROJECT_MARKS = frozenset({Layout.SNAPSHOTS, Layout.OBJECTS, Layout.HOSTS, Layout.EVENTS, Layout.LEASE, Layout.LEGACY_LEASE})


class UnknownProject(SpotWarpError):
    """A command that reads a project's snapshots names one the storage holds nothing of (a typo, most often)."""


def _stored_engine(args: argparse.Namespace, empty_storage_ok: bool = False) -> SnapshotEngine:
    """The engine of a project the storage holds, for the commands that read (or prune) what it stored.

    A project id the storage holds nothing of is refused in one line naming the projects there, so a typo
    (`dmeo` for `demo`) never reads as "no snapshots, my data is gone"; in a storage that holds no project at
    all, refused too unless `empty_storage_ok` (`status`: where a first project will go). Nothing is created."""
    engine = _engine(args)
    store = engine.store
    if store.entries(store.project) & PROJECT_MARKS:
        return engine
    where = engine.settings.storage
    others = _projects_there(engine)
    if others:
        raise UnknownProject(f"project {store.project!r} has no snapshots in {where}; projects there: "
                             f"{', '.join(others)}")
    if empty_storage_ok:
        return engine
    raise UnknownProject(f"project {store.project!r} has no snapshots in {where}, which holds no project yet "
                         "(`spotwarp start` or `spotwarp snapshot` creates one)")


def _projects_there(engine: SnapshotEngine) -> list[str]:
    """The other projects the engine's storage holds anything of, by name."""
    store = engine.store
    return sorted(name for name in store.entries() if name != store.project and store.entries(name) & PROJECT_MARKS)


def _print(args: argparse.Namespace, data: Any, text: str) -> None:
    print(json.dumps(data, indent=2, sort_keys=True) if args.json else text)


def _workspace(settings: Settings, command_name: str) -> str:
    if not settings.workspace:
        raise ConfigError(f"{command_name} needs --workspace-path PATH (or SPOTWARP_WORKSPACE)")
    return settings.workspace


class _ProgressBar:
    """A one-line progress bar on stderr, drawn only on a terminal and at most ten times a second."""

    def __init__(self, label: str, enabled: bool | None = None):
        self.label = label
        self.enabled = sys.stderr.isatty() if enabled is None else enabled
        self._last = 0.0

    def __call__(self, done: int, total: int, path: str) -> None:
        now = time.monotonic()
        if not self.enabled or (now - self._last < 0.1 and done < total):
            return
        self._last = now
        share = done / total if total else 1.0
        bar = "#" * int(share * 30)
        sys.stderr.write(f"\r{self.label} [{bar:<30}] {share:4.0%} {format_size(done)}/{format_size(total)} "
                         f"{path[-40:]:<40}")
        sys.stderr.flush()

    def close(self) -> None:
        if self.enabled:
            sys.stderr.write("\n")
            sys.stderr.flush()


class HeldWarnings(logging.Handler):
    """The engine's warnings during a one-shot command: shown after a success, dropped after a failure,
    whose one-line error already says what went wrong (e.g. the damaged snapshot a warning named too)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())

    def flush_to_stderr(self) -> None:
        for line in self.lines:
            print(line, file=sys.stderr)
        self.lines.clear()


def _show_held_warnings() -> None:
    """Print what the engine warned about so far (before `start` hands its process to the server)."""
    for handler in logging.getLogger("spotwarp").handlers:
        if isinstance(handler, HeldWarnings):
            handler.flush_to_stderr()
