"""`spotwarp restore` and `spotwarp start`: a snapshot back into a workspace, journaled so `report` sees it."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

from ..engine import ConfigError
from ..engine.coordination import Fence
from ..engine.units import format_duration, format_size
from ..service import VIA_CLI, VIA_START, Project, RestoreResult
from ..service.wire import cli_restore_json, start_restore_json
from .common import EXIT_FAILURE, EXIT_OK, _engine, _print, _ProgressBar, _show_held_warnings, _workspace, command


@command("restore")
def cmd_restore(args: argparse.Namespace) -> int:
    engine = _engine(args)
    project = Project(engine, engine.settings.workspace)
    result = _restore(project, args.snapshot, VIA_CLI, quiet=args.json)
    assert result is not None  # not files_only: a missing snapshot raised SnapshotNotFound
    snap = result.snapshot
    lines = [_restore_summary(result)] if result.files is not None else []
    lines.append(f"snapshot {snap.id} ({snap.host}, {snap.created}) is ready: "
                 f"kernel state of {', '.join(snap.notebooks) or 'no notebook'} is restored in the kernel with "
                 f"`%load_ext spotwarp` then `%spotwarp restore {snap.id}`")
    _print(args, cli_restore_json(result), "\n".join(lines))
    return EXIT_OK


def _restore(project: Project, ref: str, via: str, quiet: bool, files_only: bool = False) -> RestoreResult | None:
    """`project.restore`, with a progress bar on a terminal once the snapshot is chosen."""
    manifest = project.choose(ref, files_only)
    if manifest is None:
        return None
    bar = _ProgressBar(f"restoring {manifest.id}", enabled=False if quiet or project.workspace is None else None)
    try:
        return project.restore(ref, via=via, files_only=files_only, chosen=manifest, progress=bar)
    finally:
        bar.close()


def _restore_summary(result: RestoreResult) -> str:
    report, snap = result.files, result.snapshot
    assert report is not None
    text = (f"restored {report.files_restored} files ({format_size(report.bytes_restored)}) into {result.workspace} "
            f"from snapshot {snap.id} ({snap.host}, {snap.created}) in "
            f"{format_duration(report.duration_s)}")
    if report.files_unchanged:
        text += f"; {report.files_unchanged} already up to date"
    if report.links_restored:
        text += f"; {report.links_restored} links"
    if report.temporaries_removed:
        text += f"; removed {report.temporaries_removed} temporaries an interrupted restore left"
    if report.unstable:
        text += f"; changing while backed up (may be inconsistent): {', '.join(report.unstable[:5])}"
    return text


@command("start")
def cmd_start(args: argparse.Namespace) -> int:
    started_at = time.time()
    if (args.candidate_id is None) != (args.generation is None):
        raise ConfigError("--candidate-id and --generation go together (both are set by `spotwarp launch`)")
    fence = Fence(args.generation or 0, args.candidate_id)
    engine = _engine(args, create=True, fence=fence)
    workspace = _workspace(engine.settings, "start")
    if os.path.exists(workspace) and not os.path.isdir(workspace):
        raise ConfigError(f"workspace {workspace} exists and is not a folder")
    started = time.perf_counter()
    summary: dict[str, Any] = {"workspace": workspace, "restored": None}
    if not os.path.isdir(workspace) or not os.listdir(workspace):
        # a standby candidate journals nothing (Project.restore): it writes nothing to the project
        result = _restore(Project(engine, workspace), args.snapshot, VIA_START, quiet=args.json, files_only=True)
        if result is None:
            print(f"spotwarp: project {engine.settings.project!r} has no snapshot yet: starting with an empty workspace")
        else:
            summary["restored"] = start_restore_json(result)
            if not args.json:
                print(_restore_summary(result))
                if result.snapshot.notebooks:
                    print(f"kernel state of {', '.join(result.snapshot.notebooks)} comes back when the notebook's "
                          f"kernel runs `%load_ext spotwarp` then `%spotwarp restore`")
    os.makedirs(workspace, exist_ok=True)
    summary["prepared_s"] = round(time.perf_counter() - started, 3)
    if args.json:
        print(json.dumps(summary, sort_keys=True))
    return _serve(args, workspace, _server_env(engine, fence, workspace, started_at, summary))


def _server_env(engine: Any, fence: Fence, workspace: str, started_at: float,
                summary: dict[str, Any]) -> dict[str, str]:
    """The server's environment: the project, what start restored (for its heartbeat), the failover fence."""
    restored = summary["restored"]
    env = {**os.environ, "SPOTWARP_PROJECT": engine.settings.project, "SPOTWARP_STORAGE": engine.settings.storage,
           "SPOTWARP_WORKSPACE": workspace, "SPOTWARP_STARTED_AT": repr(started_at),
           "SPOTWARP_START_RESTORE": json.dumps(None if restored is None else {
               "snapshot": restored["id"], "duration_s": summary["prepared_s"],
               "files_restored": restored.get("files_restored"),
               "bytes_restored": restored.get("bytes_restored")}), **fence.env()}
    for name in ("SPOTWARP_CANDIDATE_ID", "SPOTWARP_GENERATION"):
        if not fence.candidate:
            env.pop(name, None)
    if engine.settings.storage_options:
        env["SPOTWARP_STORAGE_OPTIONS"] = json.dumps(engine.settings.storage_options)
    return env


def _serve(args: argparse.Namespace, workspace: str, env: dict[str, str]) -> int:
    """Hand this process to JupyterLab with SpotWarp on: same pid, same signals."""
    argv = [sys.executable, "-m", "jupyterlab", f"--ServerApp.root_dir={workspace}",
            "--ServerApp.jpserver_extensions=spotwarp_jupyter.server=True"]
    if args.port:
        argv += [f"--port={args.port}", "--ServerApp.port_retries=0"]
    argv += list(getattr(args, "passthrough", []))
    _show_held_warnings()
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, argv, env)  # the server takes this process's place: same pid, same signals
    return EXIT_FAILURE  # pragma: no cover - execve does not return
