"""The SpotWarp state of one kernel: settings, policy, the engine, and what the last snapshot did.

Magics, the Python API, the widget and the server's requests all go through one KernelSession.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any, Callable, Mapping

from ..engine import CaptureOptions, Manifest, Settings, SnapshotEngine
from ..engine.restore import RestoreResult
from .policy import Policy

# name -> (capture() -> picklable state, restore(state) -> None); filled by deep-learning modules
StateProvider = tuple[Callable[[], Any], Callable[[Any], None]]
STATE_PROVIDERS: dict[str, StateProvider] = {}

_current: "KernelSession | None" = None


def notebook_name(env: Mapping[str, str] | None = None) -> str:
    """Which notebook this kernel belongs to: `JPY_SESSION_NAME` (set by jupyter_server), else `default`."""
    env = os.environ if env is None else env
    name = (env.get("JPY_SESSION_NAME") or "").strip()
    return name.lstrip("/") if name else "default"


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

    def __init__(self, namespace: dict[str, Any], hidden: Mapping[str, Any] | None, settings: Settings,
                 policy: Policy | None = None, notebook: str | None = None):
        self.namespace = namespace
        self.hidden = hidden or {}
        self.settings = settings
        self.policy = policy or Policy()
        self.notebook = notebook or notebook_name()
        self.last: Manifest | None = None
        self.last_restore: tuple[Manifest, RestoreResult] | None = None
        self.last_error: str | None = None
        self.last_snapshot_at: float | None = None
        self.started_at = time.time()
        self._engine: SnapshotEngine | None = None
        self._lock = threading.RLock()

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

    def capture_options(self) -> CaptureOptions:
        return CaptureOptions(include=self.policy.include, exclude=self.policy.exclude,
                              max_var_size=self.policy.max_var_size)

    def extras(self) -> dict[str, Any]:
        out = {}
        for name, (capture, _restore) in STATE_PROVIDERS.items():
            out[name] = capture()
        return out

    def snapshot(self, message: str | None = None) -> Manifest:
        """A synchronous snapshot of this kernel's variables."""
        with self._lock:
            started = time.perf_counter()
            try:
                manifest = self.engine.snapshot_kernel(
                    self.namespace, self.notebook, message, self.hidden, self.capture_options(), self.extras()
                )
            except Exception as exc:
                self.last_error = f"{type(exc).__name__}: {exc}"
                raise
            manifest.stats.setdefault("pause_s", round(time.perf_counter() - started, 4))
            self._committed(manifest)
            return manifest

    def due(self, reasons: list[str]) -> bool:
        """Whether a snapshot should be taken now: asked for, or the policy's interval has passed."""
        if reasons:
            return True
        if not self.policy.enabled:
            return False
        last = self.last_snapshot_at or self.started_at
        return time.time() - last >= self.policy.every_s

    def at_safe_point(self, where: str, reasons: list[str]) -> None:
        """Run at every safe point (a resumable step, the end of a cell): snapshot when due."""
        if where == "cell" and not reasons and not self.policy.after_cell:
            return
        if not self.due(reasons):
            return
        try:
            self.snapshot(message=("requested: " + ", ".join(sorted(set(reasons)))) if reasons else None)
        except Exception as exc:  # noqa: BLE001 - automatic snapshots never break the user's cell
            self.last_error = f"{type(exc).__name__}: {exc}"

    def _committed(self, manifest: Manifest) -> None:
        self.last = manifest
        self.last_error = None
        self.last_snapshot_at = time.time()
        if self.policy.keep:
            self.engine.gc(self.policy.keep)

    def restore(self, ref: str = "latest", variables: list[str] | None = None) -> tuple[Manifest, RestoreResult]:
        """Bring a snapshot's variables (all, or `variables`) back; engine state too on a full restore."""
        with self._lock:
            manifest, result = self.engine.restore_kernel(ref, self.namespace, self.notebook, variables)
            if variables is None:
                for name, state in (result.extras or {}).items():
                    provider = STATE_PROVIDERS.get(name)
                    if provider is not None:
                        provider[1](state)
            self.last_restore = (manifest, result)
            return manifest, result

    def skipped(self) -> dict[str, str]:
        if self.last is None:
            return {}
        return dict(self.engine.kernel_record(self.last, self.notebook).get("skipped", {}))

    def status(self) -> dict[str, Any]:
        """What `%spotwarp status` and the widget show."""
        last = self.last
        return {
            "project": self.settings.project,
            "storage": self.settings.storage,
            "notebook": self.notebook,
            "policy": self.policy.as_dict(),
            "last_snapshot": None if last is None else {
                "id": last.id,
                "created": last.created_iso,
                "age_s": round(time.time() - last.created, 1),
                "size": last.size,
                "bytes_written": last.stats.get("bytes_written"),
                "duration_s": last.stats.get("duration_s"),
                "pause_s": last.stats.get("pause_s"),
            },
            "skipped": self.skipped(),
            "last_error": self.last_error,
        }
