"""The `spotwarp` argument parser: commands, flags, and the checks of flag values (usage errors exit 2)."""

from __future__ import annotations

import argparse
from typing import Any, Callable, TypeVar

from .. import __version__
from ..engine import ConfigError
from ..engine.coordination import validate_candidate_id
from ..engine.units import parse_duration
from .common import EXIT_USAGE

T = TypeVar("T")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2
        self.exit(EXIT_USAGE, f"{self.prog}: {message} (see {self.prog} --help)\n")


def _common(p: argparse.ArgumentParser, project: bool = True) -> None:
    if project:
        p.add_argument("--project-id", dest="project", type=_project_id, help="project id (default: $SPOTWARP_PROJECT or 'default')")
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

    _start_parser(sub)

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

    _key_parser(sub)
    p = sub.add_parser("hosts", help="failover: who holds the session, heartbeats, candidates")
    _common(p)
    p.add_argument("--prune", nargs="?", const=3600.0, type=_duration, metavar="AGE",
                   help="delete heartbeats (and unreadable files in hosts/) not written for AGE (default 1h), "
                        "except the lease holder's")

    _gc_parser(sub)
    return parser


def _gc_parser(sub: Any) -> None:
    p = sub.add_parser("gc", help="drop old snapshots and unreferenced objects")
    _common(p)
    p.add_argument("--keep", required=True, type=_positive_int, help="how many of the newest snapshots to keep")
    p.add_argument("--grace", type=_grace, default=3600.0, metavar="AGE",
                   help="delete unreferenced objects only once older than AGE (default 1h: a snapshot being written "
                        "may be about to name younger ones); shorten it (0s: all) only while no host or kernel "
                        "writes to the project")


def _start_parser(sub: Any) -> None:
    p = sub.add_parser("start", help="run JupyterLab with SpotWarp on; on an empty workspace, restore it first",
                       description="Run JupyterLab with SpotWarp on. Jupyter's own flags go after --, "
                                   "e.g. spotwarp start --workspace-path W -- --ServerApp.ip=0.0.0.0")
    _common(p)
    p.add_argument("--workspace-path", dest="workspace", help="the workspace folder (default: $SPOTWARP_WORKSPACE)")
    p.add_argument("--port", type=_port, help="port JupyterLab listens on")
    p.add_argument("--snapshot", default="latest", help="snapshot an empty workspace is restored from (default latest)")
    p.add_argument("--candidate-id", dest="candidate_id", type=_candidate_id,
                   help="failover: start as this race candidate, in standby until promoted (set by `spotwarp launch`)")
    p.add_argument("--generation", type=_positive_int, help="failover: the lease generation this candidate races for")
    p.add_argument("--take-over", dest="take_over", action="store_true",
                   help="failover: on a project that failed over, move the lease to this host (refused while its "
                        "holder is live)")
    p.add_argument("--allow-root", dest="allow_root", action="store_true",
                   help="let Jupyter run as root (the default when started as root, e.g. on a spot GPU image)")
    p.add_argument("--no-resume", dest="no_resume", action="store_true",
                   help="restore files only: start no kernel, run no cell (docs/resume.md)")
    p.add_argument("--resume-unsigned", dest="resume_unsigned", action="store_true",
                   help="resume kernels from snapshots no key vouches for too: anyone who can write the store "
                        "can then run code here (docs/threat-model.md)")


def _key_parser(sub: Any) -> None:
    p = sub.add_parser("key", help="the project's signing key here, and how to carry it to another host")
    _common(p)
    p.add_argument("--create", action="store_true", help="create a key for the project when this host has none")


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
    p.add_argument("--candidates", type=_candidates, default=3,
                   help=f"how many candidates race (default 3, at most {MAX_CANDIDATES})")
    p.add_argument("--gpus", help="accelerators per candidate, SkyPilot syntax, e.g. A100:1")
    p.add_argument("--clouds", type=_clouds, default=(), help="clouds to pick offers from, comma-separated")
    p.add_argument("--max-price", dest="max_price", type=_price, help="highest spot price per hour, USD")
    p.add_argument("--watch", action="store_true", help="stay on: detect the host's loss and race again")
    p.add_argument("--standby", type=_standby, default=0,
                   help="with --watch: keep this many candidates running in standby (each a machine, billed) for "
                        "the next race, so a loss promotes one at once (default 0)")
    if name == "launch":
        p.add_argument("--allow-empty", dest="allow_empty", action="store_true",
                       help="race even though the project has no snapshot yet (candidates start empty)")
        p.add_argument("--replace", action="store_true",
                       help="a live host serves the project: ask it for a final snapshot, then race its replacement")
    p.add_argument("--dead-after", dest="dead_after", type=_duration, default=20.0,
                   help="a host silent this long is lost (default 20s)")
    p.add_argument("--timeout", type=_duration, default=900.0, help="give up a race after this long (default 15m)")
    p.add_argument("--workspace-path", dest="remote_workspace", default="~/spotwarp-workspace",
                   help="the workspace folder on each candidate (default ~/spotwarp-workspace)")
    p.add_argument("--remote-port", dest="remote_port", type=_port, default=8888,
                   help="the port JupyterLab listens on, on each candidate (default 8888)")
    p.add_argument("--provider-option", dest="provider_options", action="append", default=[], type=_option,
                   metavar="KEY=VALUE", help="an option of the provider (repeatable; see docs/failover.md)")


def _flag_type(parse: Callable[[str], T]) -> Callable[[str], T]:
    """An engine parser as a flag's type: its one-line ConfigError becomes a usage error (exit 2)."""
    def parse_flag(text: str) -> T:
        try:
            return parse(text)
        except ConfigError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    return parse_flag


_duration = _flag_type(parse_duration)
# a grace may be zero (`0s`: every unreferenced object, for when nothing writes to the project)
_grace = _flag_type(lambda text: 0.0 if str(text).strip().lower() in ("0", "0s") else parse_duration(text))
_candidate_id = _flag_type(validate_candidate_id)


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
    if not 0 < value <= MAX_PRICE:
        raise argparse.ArgumentTypeError(f"expected a price in USD per hour above 0 and at most {MAX_PRICE:g}, "
                                         f"got {text[:40]!r}")
    return value


MAX_PRICE = 1000.0  # USD per hour: no spot machine costs more; 1e309 (infinity) is a typo
MAX_CANDIDATES = 16  # each is a machine (or a local server): more is a typo, not a race


def _candidates(text: str) -> int:
    value = _positive_int(text)
    if value > MAX_CANDIDATES:
        raise argparse.ArgumentTypeError(f"expected at most {MAX_CANDIDATES} candidates, got {text[:20]!r}")
    return value


def _standby(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number of standby candidates, got {text[:20]!r}") from None
    if not 0 <= value <= MAX_CANDIDATES:
        raise argparse.ArgumentTypeError(f"expected 0 to {MAX_CANDIDATES} standby candidates, got {text[:20]!r}")
    return value


def _project_id(text: str) -> str:
    if not text.strip():
        raise argparse.ArgumentTypeError("expected a project id, got an empty one")
    return text


def _option(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key.strip(), value


def _positive_int(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of at least 1, got {text!r}")
    return int(text)
