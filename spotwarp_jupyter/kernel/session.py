"""The SpotWarp state of one kernel: settings, policy, the engine, and what the last snapshot did.

Magics, the Python API, the widget and the server's requests all go through one KernelSession: it takes and
restores snapshots, and captures the state a background writer commits. When an automatic snapshot is due, and
the one in flight, are its AutomaticSnapshots' part (automatic.py); what a snapshot reuses is increments.py's.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from types import ModuleType
from typing import Any, Callable, Mapping

from ..engine import CaptureOptions, Manifest, Settings, SnapshotEngine, SpotWarpError
from ..engine.files import Cut
from ..engine.incremental import StaleBaseline
from ..engine.manifests import package_versions
from ..engine.variables import KernelImage, LoadResult, OnWritten
from ..engine.writers import BackgroundSnapshot
from ..service.records import KernelStatus, RestoreProgress, SnapshotSummary
from ..service.wire import kernel_status_json
from ..training.resumable import positions as resumable_positions
from .arrivals import Arrivals
from .automatic import AutomaticSnapshots, BackgroundCapture
from .busy import cell_ended as busy_cell_ended
from .busy import cell_started as busy_cell_started
from .increments import Increments
from .notebooks import describe_notebooks, notebook_name
from .outputs import CellOutputs
from .policy import Policy
from .retention import Pruner

# name -> (capture() -> picklable state, restore(state) -> None); filled by deep-learning modules
StateProvider = tuple[Callable[[], Any], Callable[[Any], None]]
STATE_PROVIDERS: dict[str, StateProvider] = {}

_current: "KernelSession | None" = None
URGENT_FILE_BYTES = 64 * 1024 * 1024  # changed files a notice's kernel snapshot stores itself, at most


def current() -> "KernelSession":
    """The session of this kernel; raises when SpotWarp is not loaded."""
    if _current is None:
        from ..engine import SpotWarpError

        raise SpotWarpError("SpotWarp is not loaded in this kernel: run %load_ext spotwarp")
    return _current


def set_current(session: "KernelSession | None") -> None:
    global _current
    _current = session


class KernelSession:
    """Everything SpotWarp knows and does inside one kernel."""

    key_line: str | None = None  # no key for the project here: why (settle_key), for status and the widget
    _key_settled = False

    def __init__(self, namespace: dict[str, Any], hidden: Mapping[str, Any] | None, settings: Settings,
                 policy: Policy | None = None, notebook: str | None = None):
        self.namespace = namespace
        self.hidden = hidden or {}
        self.settings = settings
        self.policy = policy or Policy()
        self.notebook = notebook or notebook_name()
        self.aliases: list[str] = []  # the notebook's former names: renamed or moved while this kernel ran
        self._known_names: set[str] = set()  # former names read from snapshots (a rename on another host)
        self.cells_run: dict[str, str] = {}  # cell id -> source, of the notebook's cells this kernel ran
        self.running: tuple[str | None, str] | None = None  # (cell id, source as sent) of the cell running now
        self.outputs = CellOutputs()  # what the running cell has published so far (kernel/outputs.py)
        # (cell id, outputs) of the cell a restored snapshot was taken in: they lead its outputs when it runs again
        self.carried_outputs: tuple[str | None, list[dict[str, Any]]] | None = None
        self.last: Manifest | None = None
        self.last_restore: tuple[Manifest, LoadResult] | None = None
        self.arrivals = Arrivals(namespace)  # large variables of the last restore, still loading
        self.last_error: str | None = None
        self.last_snapshot_at: float | None = None
        self.last_started_at: float | None = None
        self.last_pause_s: float | None = None
        self.restored_at: float | None = None
        self.resumed: dict[str, Any] | None = None  # restored by the server on a new host (kernel/resume.py)
        self.automatic = AutomaticSnapshots(self)  # when one is due at a safe point, and the one in flight
        self._engine: SnapshotEngine | None = None
        self.pruner = Pruner()  # --keep, off the user's cell
        self.increments = Increments()
        self.access = self.increments.access  # fed each cell's code by the extension (kernel/extension.py)
        # package versions are recorded with each snapshot; learn them once, off the main thread
        threading.Thread(target=package_versions, name="spotwarp-env", daemon=True).start()
        self.lock = threading.RLock()  # held while a snapshot is captured or a restore binds its variables
        self.run_id = secrets.token_hex(6)  # this kernel's run: its records' `state_at` compare with each other

    @property
    def full_every(self) -> int:
        """Every how many snapshots one is a full pass (`SPOTWARP_FULL_EVERY`)."""
        return self.increments.full_every

    @property
    def engine(self) -> SnapshotEngine:
        if self._engine is None:
            self._engine = SnapshotEngine(self.settings)
        return self._engine

    def settle_key(self) -> None:
        """Once, before this kernel first writes or says its status (the widget `%load_ext` shows): a new
        project's key is created here when no server made it (engine/keys.py); without one, `key_line` says why."""
        if self._key_settled:
            return
        try:
            key = self.engine.settle_key()
        except SpotWarpError:  # storage unusable: the status says so; settled at the next look
            return
        self._key_settled = True
        if key.line:
            logging.getLogger("spotwarp").warning("SpotWarp: %s", key.line)
        self.key_line = None if key.key else key.line

    def configure(self, project: str | None = None, storage: str | None = None) -> None:
        """Switch project or storage; the new location is checked before anything changes."""
        settings = Settings.resolve(
            project=project or self.settings.project,
            storage=storage or self.settings.storage,
            storage_options=self.settings.storage_options,
            workspace=self.settings.workspace,
            env={},
        )
        engine = SnapshotEngine(settings)
        self.settings, self._engine, self._key_settled = settings, engine, False
        self.increments.baseline = None

    def annotations(self, at: str = "call") -> dict[str, Any]:
        """What a snapshot's kernel record says of this kernel beyond its variables (docs/design.md): the
        notebook's former names, the policy (a restored kernel keeps it), training positions (the widget's offer),
        the cell running when it was taken and where (`at`: `step` of a resumable loop, `cell` end, other `call`),
        and the instant of the state in this kernel's run (`state_at`, `kernel_run`: one of its records committed
        later may hold older state, see engine/manifests/manifest.py's newest_kernel_records)."""
        running = self.running
        return {"state_at": time.time(), "kernel_run": self.run_id,
                "aliases": sorted(set(self.aliases) - {self.notebook}), "policy": self.policy.as_dict(),
                "positions": resumable_positions(),
                "cells": [{"id": cell_id, "source": source} for cell_id, source in list(self.cells_run.items())],
                "running": None if running is None else self._running_record(running),
                "at": "cell" if running is None else ("step" if at == "step" else "call"),
                "damaged": self.damaged_carry()}

    def damaged_carry(self) -> dict[str, Any]:
        """Variables the last restore could not bring back and nothing has assigned since: name -> why, the
        snapshot that holds them, and their group record there. Each snapshot carries them forward (marked
        damaged), so none is dropped silently and retention keeps the snapshot that holds them."""
        if self.last_restore is None or not self.last_restore[1].failed:
            return {}
        manifest, result = self.last_restore
        source = next((nb for nb in (self.name_in(manifest), self.source_notebook(manifest)) if nb in manifest.kernels),
                      None)
        if source is None:
            return {}
        record = manifest.kernels[source]
        earlier, groups, variables = record.get("damaged") or {}, record.get("groups") or [], record.get("variables") or {}
        out: dict[str, Any] = {}
        for name, why in dict(result.failed).items():
            index = (variables.get(name) or {}).get("group")
            if name in self.namespace or not isinstance(index, int) or not 0 <= index < len(groups):
                continue
            origin = (earlier.get(name) or {}).get("from") or manifest.id
            out[name] = {"why": why, "from": origin, "group": groups[index]}
        return out

    def cut(self) -> Cut | None:
        """The workspace at this instant, committed with the snapshot taken now (engine/files/cut.py): a stat of
        every file, and the small files changed since this kernel's last snapshot read now; None without a
        workspace (SPOTWARP_WORKSPACE, which the server gives its kernels) or when it cannot be read."""
        try:
            return self.engine.cut_workspace(self.last if self.last is not None and self.last.files else None)
        except (OSError, SpotWarpError) as exc:
            self.last_error = f"workspace files not in this snapshot: {type(exc).__name__}: {exc}"
            return None

    def _running_record(self, running: tuple[str | None, str]) -> dict[str, Any]:
        """The running cell's id and source as sent, with what it has printed and displayed so far."""
        outputs = self.outputs.items()
        return {"id": running[0], "source": running[1], **({"outputs": outputs} if outputs else {})}

    def cell_ran(self, cell_id: str | None, source: str) -> None:
        """A notebook cell ran (JupyterLab's cell id): its source is kept with the next snapshot (service/run_cells.py)."""
        if cell_id:
            self.cells_run.pop(cell_id, None)  # in the order they were last run
            self.cells_run[cell_id] = source

    def cell_started(self, cell_id: str | None, source: str, request_id: str | None = None) -> None:
        """A cell starts running: recorded as run, and as the running cell of snapshots taken until it ends
        (a new host re-runs it from there when the snapshot was at a resumable step: server/resume.py), with the
        outputs its execute request (`request_id`) publishes meanwhile."""
        self.cell_ran(cell_id, source)
        carried, self.carried_outputs = self.carried_outputs, None
        self.outputs.start(request_id, carried[1] if carried is not None and carried[0] == cell_id else None)
        self.running = (cell_id, source)
        self.automatic.new_cell()
        busy_cell_started()

    def cell_ended(self) -> None:
        self.running = None
        self.automatic.new_cell()
        busy_cell_ended()

    def capture_options(self) -> CaptureOptions:
        return CaptureOptions(include=self.policy.include, exclude=self.policy.exclude,
                              max_var_size=self.policy.max_var_size)

    def extras(self) -> dict[str, Any]:
        out = {}
        for name, (capture, _restore) in STATE_PROVIDERS.items():
            out[name] = capture()
        return out

    def snapshot(self, message: str | None = None, requests: list[str] | None = None,
                 full: bool = False, at: str = "call") -> Manifest:
        """A synchronous snapshot of this kernel's variables (waits for one in flight, and for a restore, first).

        `full`: serialize every variable, reusing nothing of the previous snapshot (engine/incremental/reuse.py).
        """
        self.settle_key()
        self.wait_in_flight()
        self.arrivals.finish()
        with self.lock:
            started = time.perf_counter()
            self.last_started_at = time.time()  # the instant of the state this snapshot holds
            options = self.capture_options()
            plan, stats = self.increments.plan(self.namespace, options, full)
            try:
                manifest = self.engine.snapshot_kernel(
                    self.namespace, self.notebook, message, self.hidden, options, self.extras(), reuse=plan, stats=stats,
                    requests=requests, annotations=self.annotations(at), cut=self.cut(),
                )
            except Exception as exc:
                self.last_error = f"{type(exc).__name__}: {exc}"
                if isinstance(exc, StaleBaseline):
                    self.increments.baseline = None
                raise
            self.last_pause_s = time.perf_counter() - started
            manifest.stats.setdefault("pause_s", round(self.last_pause_s, 4))
            self.committed(manifest)
            return manifest

    def committed(self, manifest: Manifest) -> None:
        """A snapshot of this kernel was committed: the baseline of the next one, the last one status shows,
        and with `--keep` a gc pass."""
        self.increments.remember(manifest, self.name_in(manifest))
        self.last = manifest
        self.last_error = None
        self.last_snapshot_at = time.time()
        if self.policy.keep:
            engine = self.engine
            # its own engine: a gc pass never holds the lock the next snapshot needs
            self.pruner.after_commit(lambda: SnapshotEngine(engine.settings, key=engine.key, fence=engine.fence),
                                     self.policy.keep)

    def restore(self, ref: str = "latest", variables: list[str] | None = None,
                wait: bool = False) -> tuple[Manifest, LoadResult]:
        """Bring a snapshot's variables (all, or `variables`) back; engine state too on a full restore.

        Small variables are bound before this returns; large ones arrive behind them (see arrivals.py),
        unless `wait`, or the rest of the cell running the restore may use them.
        """
        with self.lock:
            self.arrivals.finish()
            listing = self.engine.manifests()  # one LIST of the store for the whole restore
            notebook = self.notebook
            if (ref or "latest").strip() == "latest":
                self._refuse_another_notebooks_latest(listing)
                own = self.own_manifests(listing)
                if own:  # the notebook's newest state, under whichever of its names it was saved
                    ref, notebook = own[0].id, self.name_in(own[0])
            manifest, result, load = self.engine.restore_kernel_progressive(ref, self.namespace, notebook, variables,
                                                                            listing=listing)
            self.increments.restart()  # restored values are new objects: the next snapshot is full
            if variables is None:
                saved_policy = self.engine.kernel_record(manifest, notebook).get("policy")
                if saved_policy:  # the session goes on as it was configured, not with the defaults
                    self.policy = Policy.from_dict(saved_policy, self.policy)
                for name, state in (result.extras or {}).items():
                    provider = STATE_PROVIDERS.get(name)
                    if provider is not None:
                        provider[1](state)
            self.last_restore = (manifest, result)
            self.restored_at = time.time()  # the restored state is stored: the next automatic one is an interval away
            self.arrivals.started(load)
            if wait:
                self.arrivals.finish()
            return manifest, result

    # -- which notebook this is: its name follows renames and moves (the server tells the kernel) -------
    def rename(self, notebook: str) -> bool:
        """The notebook was renamed or moved: snapshots go under the new name, the old ones stay its own."""
        notebook = notebook.strip().lstrip("/")
        if not notebook or notebook == self.notebook:
            return False
        # no lock: this runs on the control thread, which must never wait for a snapshot the main thread takes
        self.aliases = [n for n in [*self.aliases, self.notebook] if n != notebook]
        self.notebook = notebook
        self.increments.restart()  # the next snapshot is the first under this name: a full one
        return True

    def started_as(self, notebook: str) -> None:
        """The notebook's name when SpotWarp loads, as its server recorded it (renamed since the kernel started):
        this kernel saved nothing under its first name, which is therefore no alias (a former Untitled.ipynb's
        snapshots are another notebook's). A rename heard since loading already set it."""
        notebook = notebook.strip().lstrip("/")
        if notebook and not self.aliases:
            self.notebook = notebook

    def own_names(self, listing: list[Manifest]) -> set[str]:
        """Every name this notebook's state was saved under: its name, former names this kernel knows, and
        the former names recorded in those snapshots (a rename on another host)."""
        names = {self.notebook, *self.aliases, *self._known_names}
        grew = True
        while grew:
            grew = False
            for m in listing:
                for name in names & set(m.kernels):
                    more = set(m.kernels[name].get("aliases") or ()) - names
                    if more:
                        names |= more
                        grew = True
        self._known_names = names - {self.notebook}
        return names

    def own_manifests(self, listing: list[Manifest] | None = None) -> list[Manifest]:
        """This notebook's snapshots under any of its names, newest first."""
        listing = self.engine.manifests() if listing is None else listing
        names = self.own_names(listing)
        own = []
        for m in listing:
            # a name another notebook was renamed away from (a new Untitled.ipynb): what was saved under it up to
            # that rename is the other notebook's state, never offered or restored here
            if any(other not in names and names & set(record.get("aliases") or ()) for other, record in m.kernels.items()):
                break
            if names & set(m.kernels):
                own.append(m)
        return own

    def name_in(self, manifest: Manifest) -> str:
        """The name this notebook's state has in `manifest` (its current name, else a former one)."""
        if self.notebook in manifest.kernels:
            return self.notebook
        names = self.own_names([manifest])
        return next((n for n in sorted(manifest.kernels) if n in names), self.notebook)

    def _refuse_another_notebooks_latest(self, listing: list[Manifest]) -> None:
        """`latest` means this notebook's newest snapshot: never another notebook's state, silently."""
        if self.own_manifests(listing):
            return
        if not listing:
            return  # the engine says there is no snapshot at all
        newest = listing[0]
        raise SpotWarpError(
            f"notebook {self.notebook!r} has no snapshot of its own yet; the newest in project "
            f"{self.settings.project!r} is {newest.id} of {describe_notebooks(newest)} ({newest.host}, {newest.created_iso}): "
            f"pass its id to load that notebook's variables here (restore {newest.id})"
        )

    def source_notebook(self, manifest: Manifest) -> str:
        """Which notebook's state a restore of `manifest` into this kernel brings back."""
        if self.name_in(manifest) in manifest.kernels or len(manifest.kernels) != 1:
            return self.notebook
        return next(iter(manifest.kernels))

    def skipped(self) -> dict[str, str]:
        """Variables the last snapshot did not save, with the reason."""
        if self.last is None:
            return {}
        return dict(self.engine.kernel_record(self.last, self.name_in(self.last)).get("skipped", {}))

    def changed(self) -> dict[str, str]:
        """Variables the last snapshot saved, but not as they were (a tensor's autograd graph), with the reason."""
        if self.last is None:
            return {}
        record = self.engine.kernel_record(self.last, self.name_in(self.last))
        out = dict(record.get("changed", {}))
        for name, info in (record.get("damaged") or {}).items():
            out[name] = (f"not restored ({info.get('why')}): carried forward as snapshot {info.get('from')} holds it, "
                         "marked damaged")
        return out

    def status_record(self) -> KernelStatus:
        """This session's facts, as a typed record (service/records.py)."""
        self.settle_key()
        restore = None
        if self.last_restore is not None:
            manifest, result = self.last_restore
            restore = RestoreProgress(manifest.id, result.usable_s, result.complete_s, list(result.loading),
                                      dict(result.failed))
        return KernelStatus(
            project=self.settings.project, storage=self.settings.storage, notebook=self.notebook,
            policy=self.policy.as_dict(), policy_text=self.policy.describe(),
            last_snapshot=None if self.last is None else SnapshotSummary.of(self.last),
            in_flight=self.automatic.in_flight is not None, last_pause_s=self.last_pause_s, skipped=self.skipped(),
            changed=self.changed(), last_error=self.last_error, restore=restore,
            imports=self._saved_imports(), resumed=self.resumed,
            cadence=self.automatic.cadence().as_dict() if self.policy.enabled else None,
            trust=self.key_line,
        )

    def _saved_imports(self) -> dict[str, str]:
        """Modules the last snapshot saved by name (name -> the path they are imported by on restore)."""
        if self.last is None:
            return {}
        return dict(self.engine.kernel_record(self.last, self.notebook).get("imports", {}))

    def status(self) -> dict[str, Any]:
        """What `%spotwarp status`, the widget and the server's status request show (service/wire.py's JSON)."""
        return kernel_status_json(self.status_record())

    # -- snapshots in the background: captured here, started when due by AutomaticSnapshots (automatic.py) -------
    @property
    def in_flight(self) -> BackgroundSnapshot | None:
        """The background snapshot being written now, if any."""
        return self.automatic.in_flight

    def wait_in_flight(self, timeout: float | None = None) -> bool:
        """Wait until no background snapshot is running (its bookkeeping done); False on timeout."""
        return self.automatic.wait_in_flight(timeout)

    def snapshot_in_background(self, message: str | None = None, requests: list[str] | None = None,
                               urgent: bool = False, in_loop: bool = False) -> BackgroundSnapshot | Manifest | None:
        """Start a snapshot the kernel does not wait for; None if one is already in flight (AutomaticSnapshots's
        snapshot_in_background says how it is written)."""
        return self.automatic.snapshot_in_background(message, requests, urgent, in_loop)

    def background_capture(self, message: str | None, requests: list[str] | None, urgent: bool,
                           in_loop: bool) -> BackgroundCapture:
        """This instant's state for a writer that commits it in the background: its annotations, workspace cut
        (`urgent`, a notice's: only when its files are quick to store) and reuse plan, and the writer's commit."""
        with self.lock:
            engine, notebook = self.engine, self.notebook
            started = time.perf_counter()
            annotations = self.annotations("step" if in_loop else "call")
            cut = self.cut()
            if urgent and cut is not None and cut.unread_bytes > URGENT_FILE_BYTES:
                # a notice's window is short: the server's final project snapshot, right after, holds the files
                cut = None
            self.last_started_at = time.time()
            options = self.capture_options()
            plan, stats = self.increments.plan(self.namespace, options, full=False)

            def commit(image: KernelImage, on_written: OnWritten | None) -> Manifest:
                return engine.commit_image(image, notebook, message, started=started,
                                           stats={"mode": "background", **stats}, on_written=on_written, requests=requests,
                                           annotations=annotations, cut=cut)

            return BackgroundCapture(commit, plan, options)

    def holds_state(self) -> bool:
        """Whether the kernel holds anything a snapshot would save as a variable (not only imported modules)."""
        return any(not name.startswith("_") and name not in self.hidden and not isinstance(value, ModuleType)
                   for name, value in list(self.namespace.items()))
