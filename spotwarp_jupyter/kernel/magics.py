"""The `%spotwarp` line magic: status, policy, snapshot, list, restore, on/off, widget."""

from __future__ import annotations

import shlex
import time

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring
from traitlets import Bool, Dict, Int, Unicode

from ..engine import Settings, SpotWarpError
from ..engine.settings import AUTO, LOCATION, POLICY, configured, resolve_settings
from ..engine.settings import every as parse_every
from ..engine.units import format_duration, format_size, parse_duration, parse_size
from ..service.wire import kernel_status_text, newer_snapshot_line
from . import session as session_module
from .policy import Policy
from .session import KernelSession

SUBCOMMANDS = ("status", "policy", "snapshot", "list", "restore", "on", "off", "widget")


def _unquote(text: str | None) -> str | None:
    """IPython's argument parser keeps quotes around values: `-m "a b"` arrives as `"a b"`."""
    if text and len(text) >= 2 and text[0] == text[-1] and text[0] in "\"'":
        return text[1:-1]
    return text


def _names(text: str, flag: str) -> frozenset[str]:
    names = frozenset(n.strip() for n in text.split(",") if n.strip())
    bad = [n for n in names if not n.isidentifier()]
    if bad or not names:
        raise UsageError(f"{flag} takes variable names separated by commas, got {text!r}")
    return names


# what to do about failures that come from the environment rather than from SpotWarp
_REMEDIES = (
    ("Numpy is not available", "install numpy in this kernel's environment (pip install numpy) and restart the kernel"),
    ("No space left on device", "free space where the store is (or point --storage elsewhere)"),
)


def unexpected_failure(command: str, exc: BaseException) -> str:
    """One line for an exception nobody planned for: what failed, that nothing changed, what to do."""
    reason = " ".join(f"{type(exc).__name__}: {exc}".split())
    remedy = next((todo for text, todo in _REMEDIES if text in reason), None)
    if remedy is None and isinstance(exc, MemoryError):
        remedy = "free memory, or leave large variables out with %spotwarp policy --exclude NAME"
    if remedy is None:
        remedy = ("%spotwarp status names skipped variables; %spotwarp policy --exclude NAME leaves out one "
                  "that cannot be saved")
    outcome = "; nothing was saved, the previous snapshot is intact" if command == "snapshot" else ""
    return f"%spotwarp {command} failed ({reason}){outcome}. To fix: {remedy}"


def cell_id(ipython) -> str | None:
    """The message id of the cell running now (None at kernel start or outside a kernel)."""
    try:
        return ipython.kernel.get_parent("shell").get("header", {}).get("msg_id")
    except Exception:  # noqa: BLE001 - no kernel (a terminal IPython)
        return None


@magics_class
class SpotWarpMagics(Magics):
    """`%spotwarp`: keep this kernel's state in durable storage. Configurable as `c.SpotWarpMagics.*` (IPython config)."""

    # None means "not in a config file": SPOTWARP_* variables beat these, %spotwarp policy flags beat both
    project = Unicode(None, allow_none=True, help="Project id ($SPOTWARP_PROJECT overrides it).").tag(config=True)
    storage = Unicode(None, allow_none=True,
                      help="Storage URL, any fsspec URL ($SPOTWARP_STORAGE overrides it).").tag(config=True)
    storage_options = Dict(default_value=None, allow_none=True,
                           help="fsspec storage options ($SPOTWARP_STORAGE_OPTIONS overrides it).").tag(config=True)
    every = Unicode(None, allow_none=True, help="A fixed interval between automatic snapshots, e.g. 30s, 5m, 1h, or "
                                                "auto (the default: adapted at a loop's steps, 5m between cells; "
                                                "$SPOTWARP_EVERY overrides it).").tag(config=True)
    max_redo = Unicode(None, allow_none=True, help="The most training a loss redoes with the adaptive cadence, e.g. 60s "
                                                   "(default 60s; $SPOTWARP_MAX_REDO overrides it).").tag(config=True)
    after_cell = Bool(None, allow_none=True, help="Take automatic snapshots after cells once the interval has passed "
                                                  "(default on; $SPOTWARP_AFTER_CELL overrides it).").tag(config=True)
    autosnapshot = Bool(None, allow_none=True, help="Automatic snapshots on when the extension loads "
                                                    "(default on; $SPOTWARP_AUTOSNAPSHOT overrides it).").tag(config=True)
    max_var_size = Unicode(None, allow_none=True, help="Variables larger than this are skipped "
                                                       "(default 8GB; $SPOTWARP_MAX_VAR_SIZE overrides it).").tag(config=True)
    keep = Int(None, allow_none=True, help="Keep only the newest N snapshots of the project, 0 keeps all "
                                           "(default 0; $SPOTWARP_KEEP overrides it).").tag(config=True)
    show_widget = Bool(True, help="Show the status widget when the extension is first loaded in a notebook.").tag(config=True)

    def __init__(self, shell=None, **kwargs):
        super().__init__(shell=shell, **kwargs)
        try:
            layer = configured(self, LOCATION + POLICY)
            settings = Settings.resolve(config=layer)
            policy = Policy.from_settings(resolve_settings(POLICY, config=layer))
        except SpotWarpError as exc:
            raise UsageError(str(exc)) from None
        self.session = KernelSession(shell.user_ns, shell.user_ns_hidden, settings, policy)
        self.widget_shown_in: str | None = None  # the cell in which the widget was shown on load
        session_module.set_current(self.session)

    # -- dispatch -----------------------------------------------------------------------------
    @line_magic
    def spotwarp(self, line: str = ""):
        """Keep this kernel's state safe. Subcommands: status, policy, snapshot, list, restore, on, off, widget."""
        try:
            words = shlex.split(line)
        except ValueError as exc:
            raise UsageError(f"%spotwarp: {exc}") from None
        command = words[0] if words else "status"
        if command not in SUBCOMMANDS:
            raise UsageError(f"%spotwarp: unknown command {command!r}; use one of {', '.join(SUBCOMMANDS)}")
        rest = line.strip()[len(command):] if words else ""
        try:
            return getattr(self, f"_do_{command}")(rest)
        except SpotWarpError as exc:
            raise UsageError(f"%spotwarp {command}: {exc}") from None
        except UsageError:
            raise
        except Exception as exc:  # noqa: BLE001 - a failure nobody planned for is one line saying what to do
            raise UsageError(unexpected_failure(command, exc)) from None

    def _no_args(self, command: str, rest: str) -> None:
        if rest.strip():
            raise UsageError(f"%spotwarp {command} takes no arguments, got {rest.strip()!r}")

    # -- subcommands --------------------------------------------------------------------------
    def _do_status(self, rest: str) -> None:
        self._no_args("status", rest)
        text = kernel_status_text(self.session.status_record())
        from ..widget.status import newer_snapshot  # the widget's offer; loaded only when asked

        try:  # a kept home or --no-resume: the store may hold newer state of this notebook than the kernel
            newer = newer_snapshot(self.session)
        except SpotWarpError:
            newer = None  # the store unreadable now: the status says the rest
        print(text + ("\n" + newer_snapshot_line(newer) if newer else ""))

    @magic_arguments()
    @argument("--every", help="a fixed interval between automatic snapshots, e.g. 30s, 5m, 1h; auto: adapted")
    @argument("--max-redo", dest="max_redo", help="the most training a loss redoes (adaptive cadence), e.g. 60s")
    @argument("--after-cell", dest="after_cell", action="store_true", default=None, help="snapshot after cells")
    @argument("--no-after-cell", dest="after_cell", action="store_false", help="not after cells")
    @argument("--exclude", help="variables never saved, comma separated")
    @argument("--include", help="save only these variables, comma separated")
    @argument("--max-var-size", dest="max_var_size", help="skip variables larger than this, e.g. 8GB")
    @argument("--keep", type=str, help="keep only the newest N snapshots of the project")
    @argument("--resume", dest="resume", action="store_true", default=None,
              help="a new host re-runs a cell interrupted inside a resumable loop (the default)")
    @argument("--no-resume", dest="resume", action="store_false", help="a new host restores, runs nothing")
    @argument("--project", help="project id")
    @argument("--storage", help="storage URL (fsspec)")
    def _policy(self, line):  # pragma: no cover - parser holder
        """%spotwarp policy: set the snapshot policy; with no flags, print it."""

    def _do_policy(self, rest: str) -> None:
        args = parse_argstring(self._policy, rest)
        p = self.session.policy
        # validate everything before changing anything
        every = parse_every(_unquote(args.every)) if args.every is not None else p.every_s
        every_s = None if every == AUTO else every
        max_redo = parse_duration(_unquote(args.max_redo)) if args.max_redo is not None else p.max_redo_s
        max_size = parse_size(args.max_var_size) if args.max_var_size is not None else p.max_var_size
        include = _names(args.include, "--include") if args.include is not None else p.include
        exclude = _names(args.exclude, "--exclude") if args.exclude is not None else p.exclude
        keep = p.keep
        if args.keep is not None:
            if not args.keep.isdigit() or int(args.keep) < 1:
                raise UsageError(f"--keep takes a whole number of at least 1, got {args.keep!r}")
            keep = int(args.keep)
        if args.project is not None or args.storage is not None:
            self.session.configure(project=_unquote(args.project), storage=_unquote(args.storage))
        p.every_s, p.max_var_size, p.include, p.exclude, p.keep = every_s, max_size, include, exclude, keep
        p.max_redo_s = max_redo
        if args.after_cell is not None:
            p.after_cell = args.after_cell
        if args.resume is not None:
            p.resume = args.resume
        print(f"SpotWarp policy: {p.describe()}")
        print(f"  project {self.session.settings.project} · storage {self.session.settings.storage}")

    @magic_arguments()
    @argument("-m", "--message", help="a note stored with the snapshot")
    @argument("--full", action="store_true", help="serialize every variable again (see docs/incremental.md)")
    def _snapshot(self, line):  # pragma: no cover - parser holder
        """%spotwarp snapshot: take a snapshot now."""

    def _do_snapshot(self, rest: str):
        args = parse_argstring(self._snapshot, rest)
        started = time.perf_counter()
        manifest = self.session.snapshot(_unquote(args.message), full=args.full)
        took = time.perf_counter() - started
        skipped, changed = self.session.skipped(), self.session.changed()
        print(f"SpotWarp snapshot {manifest.id}: {format_size(manifest.size)}, "
              f"wrote {format_size(manifest.stats.get('bytes_written', 0))} in {format_duration(took)}"
              + (f"; skipped {', '.join(sorted(skipped))}" if skipped else "")
              + (f"; changed {', '.join(sorted(changed))}" if changed else "")
              + (" (see %spotwarp status)" if skipped or changed else ""))

    def _do_list(self, rest: str) -> None:
        self._no_args("list", rest)
        listing = self.session.own_manifests()
        if not listing:
            print(f"No snapshots of notebook {self.session.notebook!r} in project {self.session.settings.project!r} yet.")
            return
        former = sorted({self.session.name_in(m) for m in listing} - {self.session.notebook})
        if former:
            print(f"Notebook {self.session.notebook!r}, formerly {', '.join(map(repr, former))}:")
        print(f"{'id':<10} {'created (UTC)':<24} {'host':<20} {'size':>10} {'written':>10}  message")
        for m in listing:
            print(f"{m.id:<10} {m.created_iso:<24} {m.host[:20]:<20} {format_size(m.size):>10} "
                  f"{format_size(m.stats.get('bytes_written', 0)):>10}  {m.message or ''}")

    @magic_arguments()
    @argument("snapshot", nargs="?", default="latest", help="snapshot id or latest")
    @argument("--vars", help="restore only these variables, comma separated")
    def _restore(self, line):  # pragma: no cover - parser holder
        """%spotwarp restore: bring variables back from a snapshot."""

    def _do_restore(self, rest: str) -> None:
        args = parse_argstring(self._restore, rest)
        variables = sorted(_names(args.vars, "--vars")) if args.vars is not None else None
        started = time.perf_counter()
        manifest, result = self.session.restore(args.snapshot, variables)
        took = time.perf_counter() - started
        source = self.session.source_notebook(manifest)
        whose = "" if source == self.session.notebook else f"notebook {source!r}, "
        # a short summary line first, then the details one per line (not one long sentence)
        print(f"SpotWarp restored {len(result.restored)} variables from {manifest.id} "
              f"({whose}{manifest.host}, {manifest.created_iso}) in {format_duration(took)}")
        if result.restored:
            print("  variables " + ", ".join(result.restored[:20]) + (" ..." if len(result.restored) > 20 else ""))
        if result.loading:
            print(f"  loading   {', '.join(result.loading)} in the background; a cell that uses them waits for them")
        skipped = result.skipped_at_snapshot
        if skipped and variables is None:
            print("  not in the snapshot: " + "; ".join(f"{n} ({r})" for n, r in sorted(skipped.items())))
        for line in result.warnings:
            print(f"  warning: {line}")

    def _do_on(self, rest: str) -> None:
        self._no_args("on", rest)
        self.session.policy.enabled = True
        print(f"SpotWarp automatic snapshots on: {self.session.policy.describe()}")

    def _do_off(self, rest: str) -> None:
        self._no_args("off", rest)
        self.session.policy.enabled = False
        print("SpotWarp automatic snapshots off (%spotwarp snapshot still works)")

    def _do_widget(self, rest: str):
        self._no_args("widget", rest)
        if self.widget_shown_in is not None and self.widget_shown_in == cell_id(self.shell):
            return None  # `%load_ext spotwarp` has just shown it in this cell: once is enough
        try:
            from ..widget import StatusWidget
        except ImportError as exc:
            raise UsageError(f"%spotwarp widget needs anywidget: pip install anywidget ({exc})") from None
        return StatusWidget(self.session)
