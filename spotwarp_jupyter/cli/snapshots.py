"""`spotwarp list`, `status`, `snapshot`, `verify` and `gc`: the project's snapshots from the command line."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from ..engine import ConfigError, Settings, SpotWarpError
from ..engine.units import format_duration, format_size
from ..service import Project, SnapshotSummary
from ..service.wire import cli_status_json, list_json, snapshot_json
from .common import EXIT_FAILURE, EXIT_OK, _engine, _print, _ProgressBar, _stored_engine, _workspace, command


@command("list")
def cmd_list(args: argparse.Namespace) -> int:
    project = Project(_stored_engine(args))
    listing = project.list()
    settings = project.engine.settings
    lines = [f"{'id':<10} {'created (UTC)':<25} {'host':<20} {'size':>10} {'written':>10}  notebooks / message"]
    for s in listing:
        lines.append(f"{s.id:<10} {s.created:<25} {s.host[:20]:<20} {format_size(s.size):>10} "
                     f"{format_size(s.bytes_written):>10}  {', '.join(s.notebooks)} {s.message or ''}")
    if not listing:
        lines = [f"no snapshots in project {settings.project!r} at {settings.storage}"]
    _print(args, list_json(settings.project, settings.storage, listing), "\n".join(lines))
    return EXIT_OK


@command("status")
def cmd_status(args: argparse.Namespace) -> int:
    served = _served_project(args)
    if served is not None:  # no project named anywhere: the one the running server serves, not `default`
        args.project, args.storage = served["project"], args.storage or served["storage"]
    # the project a running server serves is there even before its first snapshot
    status = Project(_engine(args) if served else _stored_engine(args, empty_storage_ok=True)).status(recent_events=5)
    data = cli_status_json(status)
    text = [f"project  {status.project}" + (f" (served at {served['url']})" if served else ""),
            f"storage  {status.storage}", f"snapshots {status.snapshots}"]
    last = status.last_snapshot
    if last:
        text.append(f"last     {last.id} from {last.host}, {format_duration(status.age_s or 0.0)} ago, "
                    f"{format_size(last.size)}")
    else:
        text.append("last     none yet")
    for name, reason in status.rejected.items():
        text.append(f"rejected {name}: {reason}")
    text += [f"event    {e['time']} {e['host'][:20]} {e['event']} {e['snapshot'] or ''}" for e in data["events"]]
    _print(args, data, "\n".join(text))
    return EXIT_OK


def _served_project(args: argparse.Namespace) -> dict[str, Any] | None:
    """When no project is named (flag, $SPOTWARP_PROJECT, config), the one running SpotWarp servers serve:
    `{"project", "storage", "url"}`; None when none runs. Servers of several projects: name one."""
    from ..jupyter_config import server_config_layer

    if args.project or os.environ.get("SPOTWARP_PROJECT") or server_config_layer().get("project"):
        return None
    served = {}
    for info, status in _spotwarp_servers():
        served.setdefault(status.get("project"), {"project": status.get("project"), "storage": status.get("storage"),
                                                  "url": info.get("url")})
    served.pop(None, None)
    if len(served) > 1:
        raise ConfigError(f"SpotWarp servers run for projects {', '.join(sorted(served))}: pass --project-id")
    return next(iter(served.values()), None)


def _spotwarp_servers() -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """Every running Jupyter server with SpotWarp on that answers, with its status."""
    try:
        from jupyter_server.serverapp import list_running_servers
    except ImportError:
        return []
    import urllib.error

    out = []
    for info in list_running_servers():
        try:
            out.append((info, _server_call(info, "GET", "status", timeout=5)))
        except (OSError, ValueError, urllib.error.HTTPError):
            continue
    return out


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
    request = urllib.request.Request(url, data=data, method=method,  # noqa: S310 - a local server's URL
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
            manifest = Project(engine, workspace).snapshot(args.message, progress=bar)
        finally:
            bar.close()
        assert manifest is not None  # not only_if_changed: always committed
        data = snapshot_json(SnapshotSummary.of(manifest))
        where = "files only (no running server for this project)"
    stats = data.get("stats", {})
    _print(args, data, f"snapshot {data['id']}: {data['files']} files, {len(data['notebooks'])} kernels "
                       f"({', '.join(data['notebooks']) or 'none'}), {format_size(data['size'])}, wrote "
                       f"{format_size(stats.get('bytes_written', 0))} in {format_duration(stats.get('duration_s') or 0)}, "
                       f"{where}")
    return EXIT_OK


def _report_json(report: Any, *keys: str) -> dict[str, Any]:
    """`--json` of an engine report: these of its fields, each under its own name (public keys: docs/cli.md)."""
    return {key: getattr(report, key) for key in keys}


@command("verify")
def cmd_verify(args: argparse.Namespace) -> int:
    report = _stored_engine(args).verify(args.snapshot)
    data = _report_json(report, "ok", "snapshots", "objects_checked", "bytes_checked", "problems")
    if report.ok:
        text = (f"ok: {len(report.snapshots)} snapshots, {report.objects_checked} objects, "
                f"{format_size(report.bytes_checked)} re-read and re-hashed")
    else:
        text = "\n".join([f"DAMAGED: {p}" for p in report.problems]
                         + [f"{len(report.problems)} problems in {len(report.snapshots)} snapshots"])
    _print(args, data, text)
    return EXIT_OK if report.ok else EXIT_FAILURE


@command("gc")
def cmd_gc(args: argparse.Namespace) -> int:
    report = _stored_engine(args).gc(args.keep, grace_s=args.grace)
    data = _report_json(report, "kept", "dropped", "objects_deleted", "bytes_freed", "objects_left")
    text = (f"kept {len(report.kept)} snapshots, dropped {len(report.dropped)}, "
            f"deleted {report.objects_deleted} objects ({format_size(report.bytes_freed)})")
    _print(args, data, text + (f"\n{report.objects_left}" if report.objects_left else ""))
    return EXIT_OK
