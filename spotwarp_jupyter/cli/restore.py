"""`spotwarp restore` and `spotwarp start`: a snapshot back into a workspace, journaled so `report` sees it."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

from ..engine import ConfigError, ManifestError, SpotWarpError
from ..engine.coordination import Fence
from ..engine.settings import resolve_setting
from ..engine.units import format_duration, format_size
from ..service import VIA_CLI, VIA_START, Project, RestoreResult
from ..service.wire import cli_restore_json, start_restore_json
from .common import (
    EXIT_FAILURE,
    EXIT_OK,
    _engine,
    _print,
    _ProgressBar,
    _show_held_warnings,
    _stored_engine,
    _workspace,
    command,
)


@command("restore")
def cmd_restore(args: argparse.Namespace) -> int:
    engine = _stored_engine(args)
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


def _restore(project: Project, ref: str, via: str, quiet: bool, files_only: bool = False,
             past_refused: bool = False, keep_existing: bool = False) -> RestoreResult | None:
    """`project.restore`, with a progress bar on a terminal once the snapshot is chosen.

    `past_refused` (a failover candidate, restoring `latest` unattended): a newer snapshot that fails its checks
    (unsigned or altered where SPOTWARP_KEY is set, damaged) is skipped, saying so, for the newest that passes.
    """
    try:
        manifest = project.choose(ref, files_only)
    except ManifestError as exc:
        if not past_refused or ref not in ("latest", "", None) or project.workspace is None:
            raise
        manifest = project.engine.with_files(ref, past_refused=True)
        print(f"spotwarp: skipping a newer snapshot that fails its checks ({exc}): restoring "
              f"{manifest.id if manifest else 'nothing'}, the newest that passes them", file=sys.stderr)
    if manifest is None:
        return None
    bar = _ProgressBar(f"restoring {manifest.id}", enabled=False if quiet or project.workspace is None else None)
    try:
        return project.restore(ref, via=via, files_only=files_only, chosen=manifest, progress=bar,
                               keep_existing=keep_existing)
    finally:
        bar.close()


def _resumed_from(result: RestoreResult, now: float | None = None) -> str:
    """`spotwarp start`'s first word on a new host: the snapshot it resumes from, when it was taken and how old it
    is, what came back."""
    snap, report = result.snapshot, result.files
    age = max(0.0, (time.time() if now is None else now) - snap.created_ts)
    text = f"spotwarp: restored snapshot {snap.id} of {snap.created} ({format_duration(age)} old, from {snap.host})"
    if report is not None and snap.files:
        text += (f": {report.files_restored} files, {format_size(report.bytes_restored)} in "
                 f"{format_duration(report.duration_s)}")
    return text


def _rebuilt(result: RestoreResult) -> str:
    names = ", ".join(result.rebuilt)
    return (f"notebook {names} rebuilt from its recorded cells" if len(result.rebuilt) == 1
            else f"notebooks {names} rebuilt from their recorded cells")


def _restore_summary(result: RestoreResult) -> str:
    report, snap = result.files, result.snapshot
    assert report is not None
    if not snap.files:
        # a kernel snapshot taken without a workspace: what came back is the notebooks its kernels ran
        text = f"no workspace files in snapshot {snap.id} ({snap.host}, {snap.created})"
        return text + (f": {_rebuilt(result)}" if result.rebuilt else "")
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
    if args.candidate_id is not None and getattr(args, "take_over", False):
        raise ConfigError("--take-over is for a plain `spotwarp start`, not a race candidate")
    fence = Fence(args.generation or 0, args.candidate_id)
    engine = _engine(args, create=True, fence=fence)
    if fence.candidate is None:
        fence = _plain_start_fence(args, engine)
        engine.fence = fence
    workspace = _workspace(engine.settings, "start")
    if os.path.exists(workspace) and not os.path.isdir(workspace):
        raise ConfigError(f"workspace {workspace} exists and is not a folder")
    key = engine.settle_key()  # a new project gets its key; the server and its kernels inherit SPOTWARP_KEY
    if key.line and key.key:
        print(f"spotwarp: {key.line}")
    unsigned_ok = bool(getattr(args, "resume_unsigned", False)) or bool(resolve_setting("resume_unsigned"))
    started = time.perf_counter()
    summary: dict[str, Any] = {"workspace": workspace, "restored": None}
    kept = os.path.isdir(workspace) and bool(os.listdir(workspace))
    if kept:
        _start_kept(engine, workspace, args, unsigned_ok, summary)
    else:
        _start_fresh(engine, workspace, args, unsigned_ok, key, summary)
    os.makedirs(workspace, exist_ok=True)
    summary["prepared_s"] = round(time.perf_counter() - started, 3)
    if args.json:
        print(json.dumps(summary, sort_keys=True))
    env = _server_env(engine, fence, workspace, started_at, {**summary, "ref": args.snapshot})
    if getattr(args, "no_resume", False):
        env["SPOTWARP_RESUME_KERNELS"] = "false"  # the flag beats the variable and c.SpotWarp.resume_kernels
    if getattr(args, "resume_unsigned", False):
        env["SPOTWARP_RESUME_UNSIGNED"] = "true"  # the flag beats the variable and c.SpotWarp.resume_unsigned
    return _serve(args, workspace, env)


def _start_fresh(engine: Any, workspace: str, args: argparse.Namespace, unsigned_ok: bool, key: Any,
                 summary: dict[str, Any]) -> None:
    """`spotwarp start` on a missing or empty workspace (a new host): the newest snapshot's files come back, said
    with how old it is, and whether a key vouches for what the resume runs."""
    # a store rolled back is never resumed unattended: Project.choose raises RolledBack for `latest`
    # a standby candidate journals nothing (Project.restore): it writes nothing to the project
    project = Project(engine, workspace, resume_unsigned=unsigned_ok)
    result = _restore(project, args.snapshot, VIA_START, quiet=args.json, files_only=True,
                      past_refused=args.candidate_id is not None)
    if result is None:
        print(f"spotwarp: project {engine.settings.project!r} has no snapshot yet: starting with an empty workspace")
    else:
        summary["restored"] = {**start_restore_json(result), "line": _resumed_from(result)[len("spotwarp: "):]}
        trust = project.resume_trust(result.snapshot.id, args.snapshot) if result.snapshot.notebooks and \
            not getattr(args, "no_resume", False) else None
        if trust is not None and trust.line:  # unattended code no key vouches for: said before anything runs
            print(f"spotwarp: {'WARNING: ' if trust.allowed else ''}{trust.line}", file=sys.stderr)
        elif key.line and not key.key:
            print(f"spotwarp: {key.line}", file=sys.stderr)
        if trust is not None:
            summary["trust"] = trust.as_dict()
        if not args.json:
            print(_resumed_from(result))
            print(_restore_summary(result))
            if result.snapshot.notebooks and getattr(args, "no_resume", False):
                print(f"kernel state of {', '.join(result.snapshot.notebooks)} comes back when the notebook's "
                      f"kernel runs `%load_ext spotwarp` then `%spotwarp restore`")
            elif result.snapshot.notebooks and trust is not None and trust.allowed:
                print(f"kernels of {', '.join(result.snapshot.notebooks)} are started and restored by the server "
                      "(docs/resume.md; --no-resume leaves that to you)")


def _start_kept(engine: Any, workspace: str, args: argparse.Namespace, unsigned_ok: bool,
                summary: dict[str, Any]) -> None:
    """`spotwarp start` on a workspace that already holds files: what came back and whether a key vouches for
    what the resume runs go into `summary`, and are said in one line each."""
    result = _kept_home_restore(engine, workspace, args, unsigned_ok)
    if result is None:
        return
    summary["restored"] = {**start_restore_json(result), "kept": True, "line": _kept_line(result)}
    if not args.json:
        print(f"spotwarp: {summary['restored']['line']}")
    if result.snapshot.notebooks and not getattr(args, "no_resume", False):
        trust = Project(engine, workspace, resume_unsigned=unsigned_ok).resume_trust(result.snapshot.id, args.snapshot)
        summary["trust"] = trust.as_dict()
        if trust.line:
            print(f"spotwarp: {'WARNING: ' if trust.allowed else ''}{trust.line}", file=sys.stderr)


def _kept_home_restore(engine: Any, workspace: str, args: argparse.Namespace,
                       unsigned_ok: bool) -> RestoreResult | None:
    """A workspace that outlived its server (a kept home): its files stay as they are, only missing ones come
    back, and the kernels resume from the newest snapshot. None (said in one line) when there is nothing to
    resume from, or the store cannot be trusted to go on unattended: the workspace is then served as it is."""
    try:
        project = Project(engine, workspace, resume_unsigned=unsigned_ok)
        result = _restore(project, args.snapshot, VIA_START, quiet=True, files_only=True,
                          past_refused=args.candidate_id is not None, keep_existing=True)
    except SpotWarpError as exc:
        print(f"spotwarp: the workspace {workspace} already holds files; nothing resumed: {exc}", file=sys.stderr)
        return None
    if result is None:
        print(f"spotwarp: the workspace {workspace} already holds files; project {engine.settings.project!r} has no "
              "snapshot yet: serving it as it is")
    return result


def _kept_line(result: RestoreResult) -> str:
    """One sentence for a kept workspace's start: what stayed, what came back, where the kernels come from."""
    snap, files = result.snapshot, result.files
    text = (f"the workspace {result.workspace} already holds files: kept as they are "
            f"({files.files_kept if files else 0} on disk), {files.files_restored if files else 0} missing restored "
            f"from snapshot {snap.id} ({snap.host}, {snap.created})")
    if files is not None and files.server_state_skipped:
        text += f"; {len(files.server_state_skipped)} files of Jupyter's own state left as they are"
    return text + ("; kernels resume from the newest snapshot" if snap.notebooks else "")


def _plain_start_fence(args: argparse.Namespace, engine: Any) -> Fence:
    """A plain start on a project that failed over: refused in one line (it would be fenced off at once), or
    with --take-over the lease moves to this host at a new generation (refused while the holder is live)."""
    import secrets
    import socket

    from ..engine.coordination import DamagedLease, read_lease
    from ..failover.lease import move_lease, next_generation
    from ..failover.watch import adopt

    project = engine.settings.project
    try:
        lease = read_lease(engine.store)
        held = f"lease generation {lease.generation}, holder {lease.holder or '-'}"
    except DamagedLease as exc:
        lease, held = None, f"a damaged lease at generation {exc.generation}"
    if lease is not None and lease.generation == 0:
        return Fence()
    if not getattr(args, "take_over", False):
        raise ConfigError(f"project {project!r} failed over ({held}): a plain `spotwarp start` would be fenced off "
                          "at once; `spotwarp start --take-over` makes this host the writer (refused while the "
                          "holder is live), `spotwarp hosts` shows who serves it")
    live = adopt(engine.store, TAKE_OVER_WAIT_S)
    if live is not None:
        raise ConfigError(f"project {project!r} is served by the live host {live.id} (generation {live.generation}): "
                          "stop it first, or move it with `spotwarp launch --replace`")
    name = "".join(c if c.isalnum() else "-" for c in socket.gethostname())[:40].strip("-") or "host"
    candidate = f"takeover-{name}-{secrets.token_hex(2)}"
    generation = next_generation(engine.store, lambda: max((m.generation for m in engine.manifests()), default=0))
    move_lease(engine.store, generation, candidate)
    print(f"spotwarp: took the lease over: this host is {candidate}, generation {generation}")
    return Fence(generation, candidate)


TAKE_OVER_WAIT_S = 15.0  # a live holder's heartbeat changes within three default beats


def _server_env(engine: Any, fence: Fence, workspace: str, started_at: float,
                summary: dict[str, Any]) -> dict[str, str]:
    """The server's environment: the project, what start restored (for its heartbeat), the failover fence."""
    restored = summary["restored"]
    env = {**os.environ, "SPOTWARP_PROJECT": engine.settings.project, "SPOTWARP_STORAGE": engine.settings.storage,
           "SPOTWARP_WORKSPACE": workspace, "SPOTWARP_STARTED_AT": repr(started_at),
           "SPOTWARP_START_RESTORE": json.dumps(None if restored is None else {
               "snapshot": restored["id"], "duration_s": summary["prepared_s"],
               "files_restored": restored.get("files_restored"),
               "bytes_restored": restored.get("bytes_restored"), "ref": summary.get("ref", "latest"),
               "kept": bool(restored.get("kept")), "line": restored.get("line")}),
           **fence.env()}
    for name in ("SPOTWARP_CANDIDATE_ID", "SPOTWARP_GENERATION"):
        if not fence.candidate:
            env.pop(name, None)
    if engine.settings.storage_options:
        env["SPOTWARP_STORAGE_OPTIONS"] = json.dumps(engine.settings.storage_options)
    return env


def _allow_root(args: argparse.Namespace, passthrough: list[str]) -> bool:
    """Whether Jupyter gets --allow-root: asked for, or started as root (spot GPU images run as root)."""
    if any(a.split("=")[0] in ("--allow-root", "--ServerApp.allow_root") for a in passthrough):
        return False  # already among Jupyter's own flags
    if getattr(args, "allow_root", False):
        return True
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        print("spotwarp: running as root: Jupyter is started with --allow-root")
        return True
    return False


def _serve(args: argparse.Namespace, workspace: str, env: dict[str, str]) -> int:
    """Hand this process to JupyterLab with SpotWarp on: same pid, same signals."""
    argv = [sys.executable, "-m", "jupyterlab", f"--ServerApp.root_dir={workspace}",
            "--ServerApp.jpserver_extensions=spotwarp_jupyter.server=True"]
    if args.port:
        argv += [f"--port={args.port}", "--ServerApp.port_retries=0"]
    passthrough = list(getattr(args, "passthrough", []))
    if _allow_root(args, passthrough):
        argv.append("--allow-root")
    argv += passthrough
    _show_held_warnings()
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, argv, env)  # the server takes this process's place: same pid, same signals
    return EXIT_FAILURE  # pragma: no cover - execve does not return
