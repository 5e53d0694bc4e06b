"""The `spotwarp` command line. Exit status: 0 success, 1 failure, 2 usage error."""

from __future__ import annotations

import argparse
import json
import logging
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
    p.add_argument("--candidate-id", dest="candidate_id", type=_candidate_id,
                   help="failover: start as this race candidate, in standby until promoted (set by `spotwarp launch`)")
    p.add_argument("--generation", type=_positive_int, help="failover: the lease generation this candidate races for")

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

    for name in ("launch", "watch"):
        _launch_parser(sub, name)

    p = sub.add_parser("hosts", help="failover: who holds the session, heartbeats, candidates")
    _common(p)

    p = sub.add_parser("gc", help="drop old snapshots and unreferenced objects")
    _common(p)
    p.add_argument("--keep", required=True, type=_positive_int, help="how many of the newest snapshots to keep")
    return parser


def _launch_parser(sub: Any, name: str) -> None:
    if name == "watch":
        p = sub.add_parser("watch", help="failover: watch the live host serving the project; on its loss, race",
                           description="`spotwarp launch --watch` for a project already served: follow the live "
                                       "host, and race a replacement when it is lost (docs/failover.md).")
    else:
        p = sub.add_parser("launch", help="failover: race candidate hosts, keep the first serving a restored session",
                               description="Race candidate hosts through a provider; the first that serves the "
                                       "project's restored session is promoted, the others torn down. With --watch, "
                                       "stay on: when the host is lost, race again (docs/failover.md).")
    _common(p)
    p.add_argument("--provider", default="skypilot", help="where candidates run: local or skypilot (default)")
    p.add_argument("--candidates", type=_positive_int, default=3, help="how many candidates race (default 3)")
    p.add_argument("--gpus", help="accelerators per candidate, SkyPilot syntax, e.g. A100:1")
    p.add_argument("--clouds", type=_clouds, default=(), help="clouds to pick offers from, comma-separated")
    p.add_argument("--max-price", dest="max_price", type=_price, help="highest spot price per hour, USD")
    p.add_argument("--watch", action="store_true", help="stay on: detect the host's loss and race again")
    p.add_argument("--dead-after", dest="dead_after", type=_duration, default=20.0,
                   help="a host silent this long is lost (default 20s)")
    p.add_argument("--timeout", type=_duration, default=900.0, help="give up a race after this long (default 15m)")
    p.add_argument("--workspace-path", dest="remote_workspace", default="~/spotwarp-workspace",
                   help="the workspace folder on each candidate (default ~/spotwarp-workspace)")
    p.add_argument("--remote-port", dest="remote_port", type=_port, default=8888,
                   help="the port JupyterLab listens on, on each candidate (default 8888)")
    p.add_argument("--provider-option", dest="provider_options", action="append", default=[], type=_option,
                   metavar="KEY=VALUE", help="an option of the provider (repeatable; see docs/failover.md)")


def _port(text: str) -> int:
    if not text.isdigit() or not 0 < int(text) < 65536:
        raise argparse.ArgumentTypeError(f"expected a port number (1-65535), got {text!r}")
    return int(text)


def _clouds(text: str) -> tuple[str, ...]:
    clouds = tuple(c.strip().lower() for c in text.split(",") if c.strip())
    if not clouds or any(not c.replace("-", "").isalnum() for c in clouds):
        raise argparse.ArgumentTypeError(f"expected cloud names separated by commas, got {text!r}")
    return clouds


def _price(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a price in USD per hour above 0, got {text!r}")
    return value


def _duration(text: str) -> float:
    from .engine.units import parse_duration

    try:
        return parse_duration(text)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _option(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key.strip(), value


def _candidate_id(text: str) -> str:
    from .engine.fence import validate_candidate_id

    try:
        return validate_candidate_id(text)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _positive_int(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of at least 1, got {text!r}")
    return int(text)


def _engine(args: argparse.Namespace, create: bool = False, fence: Any = None) -> SnapshotEngine:
    from .jupyter_config import server_config_layer

    settings = Settings.resolve(project=getattr(args, "project", None), storage=args.storage,
                                workspace=getattr(args, "workspace", None), config=server_config_layer())
    return SnapshotEngine(settings, create=create, fence=fence)


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
        "generation": m.generation,
        "holder": m.holder,
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
    from .engine.fence import Fence

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
        manifest = with_files(engine, args.snapshot)
        if manifest is None:
            print(f"spotwarp: project {engine.settings.project!r} has no snapshot yet: starting with an empty workspace")
        else:
            if fence.candidate:  # a standby candidate writes nothing to the project, not even the journal
                report = _restore_files(engine, manifest, workspace, quiet=args.json)
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
           "SPOTWARP_WORKSPACE": workspace, "SPOTWARP_STARTED_AT": repr(started_at),
           "SPOTWARP_START_RESTORE": json.dumps(None if summary["restored"] is None else {
               "snapshot": summary["restored"]["id"], "duration_s": summary["prepared_s"],
               "files_restored": summary["restored"].get("files_restored"),
               "bytes_restored": summary["restored"].get("bytes_restored")}), **fence.env()}
    for name in ("SPOTWARP_CANDIDATE_ID", "SPOTWARP_GENERATION"):
        if not fence.candidate:
            env.pop(name, None)
    if engine.settings.storage_options:
        env["SPOTWARP_STORAGE_OPTIONS"] = json.dumps(engine.settings.storage_options)
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
    if data["failovers"]:
        lines.append(f"failovers: {sum(1 for f in data['failovers'] if f['ok'])} of {len(data['failovers'])} races "
                     "served the session")
        lines.append(f"{'time (UTC)':<25} {'reason':<13} {'provider':<9} {'candidate':<16} {'offer':<24} "
                     f"{'detect':>8} {'provision':>9} {'restore+serve':>13} {'total':>8}  outcome")
    for f in data["failovers"]:
        lines.append(f"{f['time']:<25} {f['reason'] or '-':<13} {f['provider'] or '-':<9} {'(race)':<16} {'':<24} "
                     f"{fmt(f['detect_s']):>8} {fmt(f['provision_s']):>9} {fmt(f['restore_serve_s']):>13} "
                     f"{fmt(f['total_s']):>8}  {'winner ' + f['winner'] if f['ok'] else f['error'] or 'failed'}")
        for c in f["candidates"]:
            lines.append(f"{'':<25} {'':<13} {'':<9} {c['id'][:16]:<16} {(c['offer'] or '')[:24]:<24} {'':>8} "
                         f"{fmt(c['provision_s']):>9} {fmt(c['restore_serve_s']):>13} {'':>8}  "
                         f"{c['state']}{': ' + c['message'] if c.get('message') else ''}")
    _print(args, data, "\n".join(lines))
    return EXIT_OK


@command("watch")
def cmd_watch(args: argparse.Namespace) -> int:
    args.watch, args.adopt_only = True, True
    return cmd_launch(args)


@command("launch")
def cmd_launch(args: argparse.Namespace) -> int:
    import signal
    import threading

    from .failover.provider import LaunchSpec
    from .failover.race import finish, race, wait_promotion_seen
    from .failover.registry import make_provider
    from .failover.watch import adopt, holder_of, watch

    engine = _engine(args, create=True)
    provider = make_provider(args.provider, dict(args.provider_options))
    passed = ("SPOTWARP_KEY", "SPOTWARP_STORAGE_OPTIONS", "SPOTWARP_HEARTBEAT_INTERVAL")
    env = {name: os.environ[name] for name in passed if os.environ.get(name)}
    from .engine.units import parse_duration

    beat = parse_duration(env["SPOTWARP_HEARTBEAT_INTERVAL"]) if env.get("SPOTWARP_HEARTBEAT_INTERVAL", "0") != "0" \
        else 5.0
    if args.dead_after < 2 * beat:
        raise ConfigError(f"--dead-after {format_duration(args.dead_after)} is too short for heartbeats every "
                          f"{format_duration(beat)} (SPOTWARP_HEARTBEAT_INTERVAL): give at least twice that")
    if engine.settings.storage_options:
        env["SPOTWARP_STORAGE_OPTIONS"] = json.dumps(engine.settings.storage_options)
    spec = LaunchSpec(engine.settings.project, engine.settings.storage, args.gpus, tuple(args.clouds), args.max_price,
                      args.remote_workspace, env, args.remote_port)
    store = engine.store

    def say(kind: str, data: dict[str, Any]) -> None:
        if args.json:
            print(json.dumps({"event": kind, "time": round(time.time(), 3), **data}, sort_keys=True, default=str),
                  flush=True)
            return
        print(_launch_line(kind, data), flush=True)

    stop = threading.Event()
    if args.watch:
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
    holder = adopt(store, args.dead_after) if args.watch else None
    if holder is None and getattr(args, "adopt_only", False):
        raise SpotWarpError(f"no live host serves project {engine.settings.project!r} (no heartbeat within "
                            f"{format_duration(args.dead_after)}): start one with `spotwarp launch`")
    if holder is not None:
        say("adopted", {"holder": holder.id, "generation": holder.generation})
    else:
        result = race(provider, spec, store, args.candidates, timeout=args.timeout, on_event=say)
        wait_promotion_seen(store, result, timeout=min(30.0, max(5.0, args.dead_after)))
        say("failover_finished", finish(store, result, "launch"))
        holder = holder_of(result)
    if args.watch:
        try:
            holder = watch(provider, spec, store, args.candidates, holder, args.dead_after, stop, say,
                           race_timeout=args.timeout)
        except KeyboardInterrupt:
            stop.set()
        say("stopped", {"holder": holder.id, "leaks": provider.leaks()})
    leaks = provider.leaks()
    if leaks:
        print(f"spotwarp launch: still up after teardown: {'; '.join(leaks)}", file=sys.stderr)
        return EXIT_FAILURE
    return EXIT_OK


def _launch_line(kind: str, d: dict[str, Any]) -> str:
    fmt = lambda s: "-" if s is None else format_duration(s)  # noqa: E731
    if kind == "race_started":
        return (f"race for generation {d['generation']}: "
                + ", ".join(f"{c['id']} ({c['offer']})" for c in d["candidates"]))
    if kind == "candidate_failed":
        return f"candidate {d['id']} dropped: {d.get('message') or d.get('state')}"
    if kind == "candidate_ready":
        return (f"candidate {d['id']} serves the restored session (provision {fmt(d.get('provision_s'))}, "
                f"restore and serve {fmt(d.get('restore_serve_s'))})")
    if kind == "promoted":
        return f"promoted {d['candidate']} (generation {d['generation']}): {d.get('url') or ''}"
    if kind == "failover_finished":
        return (f"session served by {d['winner']} on {d['offer']}: detect {fmt(d.get('detect_s'))}, provision "
                f"{fmt(d.get('provision_s'))}, restore and serve {fmt(d.get('restore_serve_s'))}, race "
                f"{fmt(d.get('race_s'))}, total {fmt(d.get('total_s'))}")
    if kind == "host_lost":
        return f"host {d['lost']} lost ({d['reason']}), detected {fmt(d.get('detect_s'))} after its last sign"
    if kind == "race_failed":
        return f"race failed: {d['error']}; trying again"
    if kind == "adopted":
        return f"watching {d['holder']} (generation {d['generation']}), already serving"
    return f"{kind}: {json.dumps(d, default=str)}"


@command("hosts")
def cmd_hosts(args: argparse.Namespace) -> int:
    from .engine.fence import read_lease
    from .engine.hosts import age, read_heartbeats

    engine = _engine(args)
    lease = read_lease(engine.store)
    now = time.time()
    hosts = [{**doc, "age_s": round(age(doc, now) or 0.0, 1)} for doc in read_heartbeats(engine.store)]
    data = {"project": engine.settings.project, "lease": lease.as_dict(), "hosts": hosts}
    lines = [f"lease    generation {lease.generation}, holder {lease.holder or '- (no failover yet)'}"
             + (f", since {format_duration(now - lease.time)} ago" if lease.time else "")]
    if hosts:
        lines.append(f"{'id':<22} {'state':<9} {'gen':>4} {'beat':>8} {'restored':<10} {'restore':>8}  url")
    for h in hosts:
        restore = h.get("restore") or {}
        mark = " *" if h.get("id") == lease.holder else ""
        lines.append(f"{str(h.get('id'))[:22]:<22} {str(h.get('state')):<9} {h.get('generation', 0):>4} "
                     f"{format_duration(h['age_s']) + ' ago':>8} {restore.get('snapshot') or '-':<10} "
                     f"{format_duration(restore['duration_s']) if restore.get('duration_s') is not None else '-':>8}  "
                     f"{h.get('url') or ''}{mark}")
    if not hosts:
        lines.append("no host has written a heartbeat for this project")
    _print(args, data, "\n".join(lines))
    return EXIT_OK


@command("gc")
def cmd_gc(args: argparse.Namespace) -> int:
    engine = _engine(args)
    report = engine.gc(args.keep)
    data = {"kept": report.kept, "dropped": report.dropped, "objects_deleted": report.objects_deleted,
            "bytes_freed": report.bytes_freed, "objects_left": report.objects_left}
    text = (f"kept {len(report.kept)} snapshots, dropped {len(report.dropped)}, "
            f"deleted {report.objects_deleted} objects ({format_size(report.bytes_freed)})")
    _print(args, data, text + (f"\n{report.objects_left}" if report.objects_left else ""))
    return EXIT_OK


SERVING_COMMANDS = ("launch", "watch")  # long-running: their warnings are shown as they happen


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
    if args.command in SERVING_COMMANDS:
        return _run(args)
    held, logger = HeldWarnings(), logging.getLogger("spotwarp")
    logger.addHandler(held)
    logger.propagate = False
    try:
        code = _run(args)
    finally:
        logger.removeHandler(held)
        logger.propagate = True
    if code == EXIT_OK:
        held.flush_to_stderr()
    return code


def _run(args: argparse.Namespace) -> int:
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
