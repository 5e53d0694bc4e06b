"""The `spotwarp` command line. Exit status: 0 success, 1 failure, 2 usage error.

One module per group of commands; each registers itself in `common.COMMANDS`. `main` is the console script.
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Sequence

from ..engine import SpotWarpError
from . import failover, keys, report, restore, snapshots  # noqa: F401 - registers the commands
from .common import COMMANDS, EXIT_FAILURE, EXIT_OK, EXIT_USAGE, HeldWarnings
from .parser import build_parser

__all__ = ["COMMANDS", "EXIT_FAILURE", "EXIT_OK", "EXIT_USAGE", "build_parser", "main"]

SERVING_COMMANDS = ("launch", "watch")  # long-running: their warnings are shown as they happen


def main(argv: Sequence[str] | None = None) -> int:
    """The `spotwarp` console script: parse, run one command, exit 0, 1 or 2 (130 when interrupted)."""
    if hasattr(sys.stdout, "reconfigure"):  # a file name that is not UTF-8 is printed escaped, not a traceback
        sys.stdout.reconfigure(errors="backslashreplace")
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    passthrough: list[str] = []
    if "--" in argv:  # everything after `--` belongs to jupyter lab
        cut = argv.index("--")
        argv, passthrough = argv[:cut], argv[cut + 1:]
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        hint = (f"; Jupyter's own flags go after --: spotwarp start ... -- {' '.join(unknown)}"
                if args.command == "start" else "")
        parser.error(f"unrecognized arguments: {' '.join(unknown)}{hint}")
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
