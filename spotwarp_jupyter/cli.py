"""The `spotwarp` command line. Exit status: 0 success, 1 failure, 2 usage error."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any, Callable, Sequence

from . import __version__
from .engine import ConfigError, Manifest, Settings, SnapshotEngine, SpotWarpError
from .engine.journal import Journal, restoring
from .engine.journal import report as preemption_report
from .engine.project import restore_project_files, snapshot_project, with_files
from .engine.units import format_duration, format_size

EXIT_OK, EXIT_FAILURE, EXIT_USAGE = 0, 1, 2
COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {}


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2
        self.exit(EXIT_USAGE, f"{self.prog}: {message} (see {self.prog} --help)\n")


def command(name: str):
    def register(fn: Callable[[argparse.Namespace], int]):
        COMMANDS[name] = fn
        return fn
    return register


def _common(p: argparse.ArgumentParser, project: bool = True) -> None:
    if project:
        p.add_argument("--project-id", dest="project", help="project id (default: $SPOTWARP_PROJECT or 'default')")
    p.add_argument("--storage", help="storage URL, any fsspec URL (default: $SPOTWARP_STORAGE or ~/.spotwarp/store)")
    p.add_argument("--json", action="store_true", help="print machine-readable JSON")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="spotwarp", description="Keep Jupyter sessions alive across spot-instance preemptions.")
    parser.add_argument("--version", action="version", version=f"spotwarp {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    p = sub.add_parser("list", help="snapshots of a project, newest first")
    _common(p)

    p = sub.add_parser("status", help="project, storage, last snapshot and its age")
    _common(p)

    p = sub.add_parser("start", help="run JupyterLab with SpotWarp on; on an empty workspace, restore it first",
                       description="Run JupyterLab with SpotWarp on. Arguments after -- go to jupyter lab.")
    _common(p)
    p.add_argument("--workspace-path", dest="workspace", help="the workspace folder (default: $SPOTWARP_WORKSPACE)")
    p.add_argument("--port", type=_port, help="port JupyterLab listens on")
    p.add_argument("--snapshot", default="latest", help="snapshot an empty workspace is restored from (default latest)")

    p = sub.add_parser("snapshot", help="a snapshot now: files, and live kernels when a server runs the project")
    _common(p)
    p.add_argument("--workspace-path", dest="workspace", help="the workspace folder (default: $SPOTWARP_WORKSPACE)")
    p.add_argument("-m", "--message", help="a note stored with the snapshot")

    p = sub.add_parser("restore", help="restore a snapshot (kernel state is restored in the kernel)")
    _common(p)
    p.add_argument("--workspace-path", dest="workspace", help="the workspace folder files are restored into")
    p.add_argument("--snapshot", default="latest", help="snapshot id or latest (default)")

    p = sub.add_parser("verify", help="re-read and re-hash every object; non-zero exit on damage")
    _common(p)
    p.add_argument("--snapshot", help="verify only this snapshot (default: all)")

    p = sub.add_parser("report", help="preemptions survived, work lost, time to resume, compute saved")
    _common(p)

    p = sub.add_parser("gc", help="drop old snapshots and unreferenced objects")
    _common(p)
    p.add_argument("--keep", required=True, type=_positive_int, help="how many of the newest snapshots to keep")
    return parser


def _port(text: str) -> int:
    if not text.isdigit() or not 0 < int(text) < 65536:
        raise argparse.ArgumentTypeError(f"expected a port number (1-65535), got {text!r}")
    return int(text)


def _positive_int(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of at least 1, got {text!r}")
    return int(text)


def _engine(args: argparse.Namespace, create: bool = False) -> SnapshotEngine:
    settings = Settings.resolve(project=getattr(args, "project", None), storage=args.storage,
                                workspace=getattr(args, "workspace", None))
    return SnapshotEngine(settings, create=create)


def manifest_summary(m: Manifest) -> dict[str, Any]:
    """The stable JSON shape of one snapshot in `list --json` (and the REST API)."""
    variables = sorted({v for k in m.kernels.values() for v in k.get("variables", {})})
    return {
        "id": m.id,
        "created": m.created_iso,
        "host": m.host,
        "kind": m.kind,
        "message": m.message,
        "size": m.size,
        "bytes_written": m.stats.get("bytes_written", 0),
        "duration_s": m.stats.get("duration_s"),
        "notebooks": sorted(m.kernels),
        "variables": variables,
        "files": len(m.files.get("entries", {})) if isinstance(m.files, dict) else 0,
        "parent": m.parent,
        "signed": m.signed,
    }


def _print(args: argparse.Namespace, data: Any, text: str) -> None:
    print(json.dumps(data, indent=2, sort_keys=True) if args.json else text)


@command("list")
def cmd_list(args: argparse.Namespace) -> int:
    engine = _engine(args)
    listing = [manifest_summary(m) for m in engine.manifests()]
    lines = [f"{'id':<10} {'created (UTC)':<25} {'host':<20} {'size':>10} {'written':>10}  notebooks / message"]
    for s in listing:
        lines.append(f"{s['id']:<10} {s['created']:<25} {s['host'][:20]:<20} {format_size(s['size']):>10} "
                     f"{format_size(s['bytes_written']):>10}  {', '.join(s['notebooks'])} {s['message'] or ''}")
    if not listing:
        lines = [f"no snapshots in project {engine.settings.project!r} at {engine.settings.storage}"]
    _print(args, {"project": engine.settings.project, "storage": engine.settings.storage, "snapshots": listing},
           "\n".join(lines))
    return EXIT_OK


@command("status")
def cmd_status(args: argparse.Namespace) -> int:
    engine = _engine(args)
    listing = engine.manifests()
    last = listing[0] if listing else None
    data = {
        "project": engine.settings.project,
        "storage": engine.settings.storage,
        "snapshots": len(listing),
        "last_snapshot": None if last is None else {**manifest_summary(last), "age_s": round(time.time() - last.created, 1)},
        "rejected": engine.rejected,
        "events": [e.as_dict() for e in Journal(engine.store).events(limit=5)],
    }
    text = [f"project  {data['project']}", f"storage  {data['storage']}", f"snapshots {len(listing)}"]
    if last:
        text.append(f"last     {last.id} from {last.host}, {format_duration(time.time() - last.created)} ago, "
                    f"{format_size(last.size)}")
    else:
        text.append("last     none yet")
    for name, reason in engine.rejected.items():
        text.append(f"rejected {name}: {reason}")
    text += [f"event    {e['time']} {e['host'][:20]} {e['event']} {e['snapshot'] or ''}" for e in data["events"]]
    _print(args, data, "\n".join(text))
    return EXIT_OK


@command("restore")
def cmd_restore(args: argparse.Namespace) -> int:
    engine = _engine(args)
    workspace = engine.settings.workspace
    manifest = (with_files(engine, args.snapshot) if workspace else None) or engine.get(args.snapshot)
    notebooks = sorted(manifest.kernels)
    data: dict[str, Any] = {"id": manifest.id, "notebooks": notebooks, "files_restored": 0}
    lines = []
    if workspace:
        report = _restore_files(engine, manifest, workspace, quiet=args.json)
        data.update(report.as_dict())
        data["workspace"] = workspace
        lines.append(_restore_summary(manifest, report, workspace))
    lines.append(f"snapshot {manifest.id} ({manifest.host}, {manifest.created_iso}) is ready: "
                 f"kernel state of {', '.join(notebooks) or 'no notebook'} is restored in the kernel with "
                 f"`%load_ext spotwarp` then `%spotwarp restore {manifest.id}`")
    _print(args, data, "\n".join(lines))
    return EXIT_OK


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


def _restore_files(engine: SnapshotEngine, manifest: Manifest, workspace: str, quiet: bool = False):
    bar = _ProgressBar(f"restoring {manifest.id}", enabled=False if quiet else None)
    try:
        return restore_project_files(engine, manifest, workspace, progress=bar)
    finally:
        bar.close()


def _restore_summary(manifest: Manifest, report, workspace: str) -> str:
    text = (f"restored {report.files_restored} files ({format_size(report.bytes_restored)}) into {workspace} "
            f"from snapshot {manifest.id} ({manifest.host}, {manifest.created_iso}) in "
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


def _workspace(settings: Settings, command_name: str) -> str:
    if not settings.workspace:
        raise ConfigError(f"{command_name} needs --workspace-path PATH (or SPOTWARP_WORKSPACE)")
    return settings.workspace


@command("start")
def cmd_start(args: argparse.Namespace) -> int:
    engine = _engine(args, create=True)
    workspace = _workspace(engine.settings, "start")
    if os.path.exists(workspace) and not os.path.isdir(workspace):
        raise ConfigError(f"workspace {workspace} exists and is not a folder")
    started = time.perf_counter()
    summary: dict[str, Any] = {"workspace": workspace, "restored": None}
    if not os.path.isdir(workspace) or not os.listdir(workspace):
        manifest = with_files(engine, args.snapshot)
        if manifest is None:
            print(f"spotwarp: project {engine.settings.project!r} has no snapshot yet: starting with an empty workspace")
        else:
            with restoring(engine.store, manifest.id, what="files", via="spotwarp start") as outcome:
                report = _restore_files(engine, manifest, workspace, quiet=args.json)
                outcome.update(files_restored=report.files_restored, bytes_restored=report.bytes_restored)
            summary["restored"] = {"id": manifest.id, **report.as_dict()}
            if not args.json:
                print(_restore_summary(manifest, report, workspace))
                if manifest.kernels:
                    print(f"kernel state of {', '.join(sorted(manifest.kernels))} comes back when the notebook's "
                          f"kernel runs `%load_ext spotwarp` then `%spotwarp restore`")
    os.makedirs(workspace, exist_ok=True)
    summary["prepared_s"] = round(time.perf_counter() - started, 3)
    if args.json:
        print(json.dumps(summary, sort_keys=True))
    env = {**os.environ, "SPOTWARP_PROJECT": engine.settings.project, "SPOTWARP_STORAGE": engine.settings.storage,
           "SPOTWARP_WORKSPACE": workspace}
    if engine.settings.storage_options:
        env["SPOTWARP_STORAGE_OPTIONS"] = json.dumps(engine.settings.storage_options)
    argv = [sys.executable, "-m", "jupyterlab", f"--ServerApp.root_dir={workspace}",
            "--ServerApp.jpserver_extensions=spotwarp_jupyter.server=True"]
    if args.port:
        argv += [f"--port={args.port}", "--ServerApp.port_retries=0"]
    argv += list(getattr(args, "passthrough", []))
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, argv, env)  # the server takes this process's place: same pid, same signals
    return EXIT_FAILURE  # pragma: no cover - execve does not return


def _running_server(settings: Settings) -> dict[str, Any] | None:
    """The running Jupyter server serving this project's workspace with SpotWarp on, if any."""
    try:
        from jupyter_server.serverapp import list_running_servers
    except ImportError:
        return None
    import urllib.error

    for info in list_running_servers():
        try:
            status = _server_call(info, "GET", "status", timeout=5)
        except urllib.error.HTTPError as exc:
            if exc.code in (401, 403):  # a server we may not use: say so rather than fall back silently
                print(f"spotwarp: the server at {info.get('url')} refused this request ({exc.code}); "
                      "set JUPYTERHUB_API_TOKEN or use the server's token", file=sys.stderr)
            continue
        except (OSError, ValueError):
            continue
        if status.get("project") == settings.project and status.get("workspace") == settings.workspace:
            return info
    return None


def _server_call(info: dict[str, Any], method: str, path: str, body: dict | None = None, timeout: float = 600) -> Any:
    import urllib.request

    url = info["url"].rstrip("/") + "/spotwarp/api/" + path
    data = json.dumps(body).encode() if body is not None else (b"" if method == "POST" else None)
    # under JupyterHub the server's runtime file holds no token: the hub's API token of this user works
    token = info.get("token") or os.environ.get("JUPYTERHUB_API_TOKEN", "")
    request = urllib.request.Request(url, data=data, method=method,
                                     headers={"Authorization": f"token {token}",
                                              "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310 - a local server's URL
        return json.loads(response.read())


@command("snapshot")
def cmd_snapshot(args: argparse.Namespace) -> int:
    engine = _engine(args, create=True)
    workspace = _workspace(engine.settings, "snapshot")
    if not os.path.isdir(workspace):
        raise ConfigError(f"workspace {workspace} is not a folder")
    if args.message is not None and args.message != args.message.encode("utf-8", "replace").decode():
        raise ConfigError("--message must be text: it holds bytes that are not UTF-8")  # as the REST API says
    server = _running_server(engine.settings)
    if server is not None:
        import urllib.error

        try:
            data = _server_call(server, "POST", "snapshots", {"message": args.message} if args.message else None)
        except urllib.error.HTTPError as exc:
            detail = json.loads(exc.read() or b"{}").get("message", exc.reason)
            raise SpotWarpError(f"the server at {server['url']} refused: {detail}") from None
        where = f"through the server at {server['url']}"
    else:
        bar = _ProgressBar("backing up", enabled=False if args.json else None)
        try:
            manifest = snapshot_project(engine, workspace, message=args.message, progress=bar)
        finally:
            bar.close()
        data = {**manifest_summary(manifest), "stats": manifest.stats}
        where = "files only (no running server for this project)"
    stats = data.get("stats", {})
    _print(args, data, f"snapshot {data['id']}: {data['files']} files, {len(data['notebooks'])} kernels "
                       f"({', '.join(data['notebooks']) or 'none'}), {format_size(data['size'])}, wrote "
                       f"{format_size(stats.get('bytes_written', 0))} in {format_duration(stats.get('duration_s') or 0)}, "
                       f"{where}")
    return EXIT_OK


@command("verify")
def cmd_verify(args: argparse.Namespace) -> int:
    engine = _engine(args)
    report = engine.verify(args.snapshot)
    data = {"ok": report.ok, "snapshots": report.snapshots, "objects_checked": report.objects_checked,
            "bytes_checked": report.bytes_checked, "problems": report.problems}
    if report.ok:
        text = (f"ok: {len(report.snapshots)} snapshots, {report.objects_checked} objects, "
                f"{format_size(report.bytes_checked)} re-read and re-hashed")
    else:
        text = "\n".join([f"DAMAGED: {p}" for p in report.problems]
                         + [f"{len(report.problems)} problems in {len(report.snapshots)} snapshots"])
    _print(args, data, text)
    return EXIT_OK if report.ok else EXIT_FAILURE


@command("report")
def cmd_report(args: argparse.Namespace) -> int:
    engine = _engine(args)
    data = {"project": engine.settings.project,
            **preemption_report(Journal(engine.store).events(), engine.manifests())}
    fmt = lambda s: "-" if s is None else format_duration(s)  # noqa: E731
    lines = [f"project {data['project']}: {data['preemptions_survived']} of {data['preemptions']} preemptions "
             f"survived, work lost {fmt(data['work_lost_s'])}, median time to resume {fmt(data['resume_s_median'])}, "
             f"compute saved {fmt(data['compute_saved_s'])}"]
    if data["events"]:
        lines.append(f"{'notice (UTC)':<25} {'host':<16} {'source':<8} {'final':<10} {'restored':<10} "
                     f"{'lost':>8} {'resume':>8} {'saved':>8}")
    for r in data["events"]:
        lines.append(f"{r['notice']:<25} {r['host'][:16]:<16} {r['source'] or '?':<8} {r['final_snapshot'] or '-':<10} "
                     f"{r['restored_snapshot'] or '-':<10} {fmt(r['work_lost_s']):>8} {fmt(r['resume_s']):>8} "
                     f"{fmt(r['compute_saved_s']):>8}")
    _print(args, data, "\n".join(lines))
    return EXIT_OK


@command("gc")
def cmd_gc(args: argparse.Namespace) -> int:
    engine = _engine(args)
    report = engine.gc(args.keep)
    data = {"kept": report.kept, "dropped": report.dropped, "objects_deleted": report.objects_deleted,
            "bytes_freed": report.bytes_freed}
    _print(args, data, f"kept {len(report.kept)} snapshots, dropped {len(report.dropped)}, "
                       f"deleted {report.objects_deleted} objects ({format_size(report.bytes_freed)})")
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    if hasattr(sys.stdout, "reconfigure"):  # a file name that is not UTF-8 is printed escaped, not a traceback
        sys.stdout.reconfigure(errors="backslashreplace")
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    passthrough: list[str] = []
    if "--" in argv:  # everything after `--` belongs to jupyter lab
        cut = argv.index("--")
        argv, passthrough = argv[:cut], argv[cut + 1:]
    args = parser.parse_args(argv)
    if passthrough and args.command != "start":
        parser.error(f"only `start` takes arguments after --, got {' '.join(passthrough)!r}")
    args.passthrough = passthrough
    if not args.command:
        parser.print_help()
        return EXIT_USAGE
    try:
        return COMMANDS[args.command](args)
    except SpotWarpError as exc:
        print(f"spotwarp {args.command}: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    except KeyboardInterrupt:
        print(f"spotwarp {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
