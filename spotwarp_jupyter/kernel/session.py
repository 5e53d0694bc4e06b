"""The SpotWarp state of one kernel: settings, policy, the engine, and what the last snapshot did.

Magics, the Python API, the widget and the server's requests all go through one KernelSession.
Automatic and background snapshots are automatic.py's part of it; what a snapshot reuses, increments.py's.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, Mapping

from ..engine import CaptureOptions, Manifest, Settings, SnapshotEngine, SpotWarpError
from ..engine.environment import package_versions
from ..engine.restore import RestoreResult
from ..engine.reuse import StaleBaseline
from ..project.records import KernelStatus, RestoreProgress, SnapshotSummary
from ..project.wire import kernel_status_json
from .arrivals import Arrivals
from .automatic import AutomaticSnapshots
from .increments import Increments
from .notebooks import describe_notebooks, notebook_name
from .policy import Policy
from .retention import Pruner

# name -> (capture() -> picklable state, restore(state) -> None); filled by deep-learning modules
StateProvider = tuple[Callable[[], Any], Callable[[Any], None]]
STATE_PROVIDERS: dict[str, StateProvider] = {}

_current: "KernelSession | None" = None


def current() -> "KernelSession":
    """The session of this kernel; raises when SpotWarp is not loaded."""
    if _current is None:
        from ..engine import SpotWarpError

        raise SpotWarpError("SpotWarp is not loaded in this kernel: run %load_ext spotwarp")
    return _current


def set_current(session: "KernelSession | None") -> None:
    global _current
    _current = session


class KernelSession(AutomaticSnapshots):
    """Everything SpotWarp knows and does inside one kernel."""

    def __init__(self, namespace: dict[str, Any], hidden: Mapping[str, Any] | None, settings: Settings,
                 policy: Policy | None = None, notebook: str | None = None):
        self.namespace = namespace
        self.hidden = hidden or {}
        self.settings = settings
        self.policy = policy or Policy()
        self.notebook = notebook or notebook_name()
        self.last: Manifest | None = None
        self.last_restore: tuple[Manifest, RestoreResult] | None = None
        self.arrivals = Arrivals(namespace)  # large variables of the last restore, still loading
        self.last_error: str | None = None
        self.last_snapshot_at: float | None = None
        self.last_started_at: float | None = None
        self.last_pause_s: float | None = None
        self._init_automatic()
        self._engine: SnapshotEngine | None = None
        self.pruner = Pruner()  # --keep, off the user's cell
        self.increments = Increments()
        self.access = self.increments.access  # fed each cell's code by the extension (kernel/extension.py)
        # package versions are recorded with each snapshot; learn them once, off the main thread
        threading.Thread(target=package_versions, name="spotwarp-env", daemon=True).start()
        self._lock = threading.RLock()

    @property
    def full_every(self) -> int:
        """Every how many snapshots one is a full pass (`SPOTWARP_FULL_EVERY`)."""
        return self.increments.full_every

    @property
    def engine(self) -> SnapshotEngine:
        if self._engine is None:
            self._engine = SnapshotEngine(self.settings)
        return self._engine

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
        self.settings, self._engine = settings, engine
        self.increments.baseline = None

    def capture_options(self) -> CaptureOptions:
        return CaptureOptions(include=self.policy.include, exclude=self.policy.exclude,
                              max_var_size=self.policy.max_var_size)

    def extras(self) -> dict[str, Any]:
        out = {}
        for name, (capture, _restore) in STATE_PROVIDERS.items():
            out[name] = capture()
        return out

    def snapshot(self, message: str | None = None, requests: list[str] | None = None,
                 full: bool = False) -> Manifest:
        """A synchronous snapshot of this kernel's variables (waits for one in flight, and for a restore, first).

        `full`: serialize every variable, reusing nothing of the previous snapshot (engine/reuse.py).
        """
        self.wait_in_flight()
        self.arrivals.finish()
        with self._lock:
            started = time.perf_counter()
            options = self.capture_options()
            plan, stats = self.increments.plan(self.namespace, options, full)
            try:
                manifest = self.engine.snapshot_kernel(
                    self.namespace, self.notebook, message, self.hidden, options, self.extras(), reuse=plan, stats=stats,
                    requests=requests,
                )
            except Exception as exc:
                self.last_error = f"{type(exc).__name__}: {exc}"
                if isinstance(exc, StaleBaseline):
                    self.increments.baseline = None
                raise
            self.last_pause_s = time.perf_counter() - started
            manifest.stats.setdefault("pause_s", round(self.last_pause_s, 4))
            self.increments.remember(manifest, self.notebook)
            self._committed(manifest)
            return manifest

    def _committed(self, manifest: Manifest) -> None:
        self.last = manifest
        self.last_error = None
        self.last_snapshot_at = time.time()
        if self.policy.keep:
            engine = self.engine
            # its own engine: a gc pass never holds the lock the next snapshot needs
            self.pruner.after_commit(lambda: SnapshotEngine(engine.settings, key=engine.key, fence=engine.fence),
                                     self.policy.keep)

    def restore(self, ref: str = "latest", variables: list[str] | None = None,
                wait: bool = False) -> tuple[Manifest, RestoreResult]:
        """Bring a snapshot's variables (all, or `variables`) back; engine state too on a full restore.

        Small variables are bound before this returns; large ones arrive behind them (see arrivals.py),
        unless `wait`, or the rest of the cell running the restore may use them.
        """
        with self._lock:
            self.arrivals.finish()
            if (ref or "latest").strip() == "latest":
                self._refuse_another_notebooks_latest()
            manifest, result, load = self.engine.restore_kernel_progressive(ref, self.namespace, self.notebook, variables)
            self.increments.restart()  # restored values are new objects: the next snapshot is full
            if variables is None:
                for name, state in (result.extras or {}).items():
                    provider = STATE_PROVIDERS.get(name)
                    if provider is not None:
                        provider[1](state)
            self.last_restore = (manifest, result)
            self.arrivals.started(load)
            if wait:
                self.arrivals.finish()
            return manifest, result

    def _refuse_another_notebooks_latest(self) -> None:
        """`latest` means this notebook's newest snapshot: never another notebook's state, silently."""
        if self.engine.manifests(self.notebook):
            return
        others = self.engine.manifests()
        if not others:
            return  # the engine says there is no snapshot at all
        newest = others[0]
        raise SpotWarpError(
            f"notebook {self.notebook!r} has no snapshot of its own yet; the newest in project "
            f"{self.settings.project!r} is {newest.id} of {describe_notebooks(newest)} ({newest.host}, {newest.created_iso}): "
            f"pass its id to load that notebook's variables here (restore {newest.id})"
        )

    def source_notebook(self, manifest: Manifest) -> str:
        """Which notebook's state a restore of `manifest` into this kernel brings back."""
        if self.notebook in manifest.kernels or len(manifest.kernels) != 1:
            return self.notebook
        return next(iter(manifest.kernels))

    def skipped(self) -> dict[str, str]:
        """Variables the last snapshot did not save, with the reason."""
        if self.last is None:
            return {}
        return dict(self.engine.kernel_record(self.last, self.notebook).get("skipped", {}))

    def changed(self) -> dict[str, str]:
        """Variables the last snapshot saved, but not as they were (a tensor's autograd graph), with the reason."""
        if self.last is None:
            return {}
        return dict(self.engine.kernel_record(self.last, self.notebook).get("changed", {}))

    def status_record(self) -> KernelStatus:
        """This session's facts, as a typed record (project/records.py)."""
        restore = None
        if self.last_restore is not None:
            manifest, result = self.last_restore
            restore = RestoreProgress(manifest.id, result.usable_s, result.complete_s, list(result.loading),
                                      dict(result.failed))
        return KernelStatus(
            project=self.settings.project, storage=self.settings.storage, notebook=self.notebook,
            policy=self.policy.as_dict(), policy_text=self.policy.describe(),
            last_snapshot=None if self.last is None else SnapshotSummary.of(self.last),
            in_flight=self.in_flight is not None, last_pause_s=self.last_pause_s, skipped=self.skipped(),
            changed=self.changed(), last_error=self.last_error, restore=restore,
        )

    def status(self) -> dict[str, Any]:
        """What `%spotwarp status`, the widget and the server's status request show (project/wire.py's JSON)."""
        return kernel_status_json(self.status_record())
