"""The `spotwarp` command line. Exit status: 0 success, 1 failure, 2 usage error."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any, Callable, Sequence

from . import __version__
from .engine import Manifest, Settings, SnapshotEngine, SpotWarpError
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

    p = sub.add_parser("restore", help="restore a snapshot (kernel state is restored in the kernel)")
    _common(p)
    p.add_argument("--workspace-path", dest="workspace", help="the workspace folder files are restored into")
    p.add_argument("--snapshot", default="latest", help="snapshot id or latest (default)")

    p = sub.add_parser("verify", help="re-read and re-hash every object; non-zero exit on damage")
    _common(p)
    p.add_argument("--snapshot", help="verify only this snapshot (default: all)")

    p = sub.add_parser("gc", help="drop old snapshots and unreferenced objects")
    _common(p)
    p.add_argument("--keep", required=True, type=_positive_int, help="how many of the newest snapshots to keep")
    return parser


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
    }
    text = [f"project  {data['project']}", f"storage  {data['storage']}", f"snapshots {len(listing)}"]
    if last:
        text.append(f"last     {last.id} from {last.host}, {format_duration(time.time() - last.created)} ago, "
                    f"{format_size(last.size)}")
    else:
        text.append("last     none yet")
    for name, reason in engine.rejected.items():
        text.append(f"rejected {name}: {reason}")
    _print(args, data, "\n".join(text))
    return EXIT_OK


@command("restore")
def cmd_restore(args: argparse.Namespace) -> int:
    engine = _engine(args)
    manifest = engine.get(args.snapshot)
    notebooks = sorted(manifest.kernels)
    data = {"id": manifest.id, "notebooks": notebooks, "files_restored": 0}
    text = (f"snapshot {manifest.id} ({manifest.host}, {manifest.created_iso}) is ready: "
            f"kernel state of {', '.join(notebooks) or 'no notebook'} is restored in the kernel with "
            f"`%load_ext spotwarp` then `%spotwarp restore {manifest.id}`")
    _print(args, data, text)
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
    parser = build_parser()
    args = parser.parse_args(argv)
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
