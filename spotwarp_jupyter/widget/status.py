"""StatusWidget: a live view of one kernel's SpotWarp session, with snapshot-now and restore buttons.

The browser side is `format.js` + `widget.js` (served as one ES module, see `widget_esm`) and `widget.css`
next to this file. Buttons send custom messages
(`protocol.WidgetAction`: `{"action": "snapshot" | "restore" | "refresh", "request_id": ...}`); the kernel
answers by updating the synced traits, then `answered` to the request's id. The widget knows the kernel's session only through `SessionView` (no kernel imports).
"""

from __future__ import annotations

import threading
import time
import weakref
from pathlib import Path
from typing import Any, Protocol

import anywidget
import traitlets

from ..engine import SpotWarpError
from ..engine.units import format_duration, format_size
from ..protocol import WIDGET_TEXT, ProtocolError, WidgetAction, echoed_id

HERE = Path(__file__).parent
WATCH_INTERVAL_S = 1.0
BUSY_BEAT_S = 3.0  # while a cell runs, the watcher thread says so this often (the browser's silence is 10 s)
# format.js (formatSize, formatDuration: shared with the JupyterLab panel, which bundles the same file)
# comes first, then widget.js, which uses them: anywidget loads a single module and it cannot import.
ESM_PARTS = ("format.js", "widget.js")


def widget_esm() -> str:
    """The widget's ES module: the parts in ESM_PARTS, one after the other."""
    return "\n".join(f"// ---- {name}\n{(HERE / name).read_text(encoding='utf-8')}" for name in ESM_PARTS)


class SessionView(Protocol):
    """What the widget uses of a kernel's SpotWarp session (kernel.session.KernelSession is one)."""

    notebook: str
    settings: Any
    policy: Any
    last: Any
    last_error: str | None
    last_restore: Any
    running: Any  # the cell running now, None between cells

    @property
    def engine(self) -> Any: ...
    def status(self) -> dict[str, Any]: ...
    def own_manifests(self) -> list[Any]: ...
    def name_in(self, manifest: Any) -> str: ...
    def snapshot(self, message: str | None = None) -> Any: ...
    def restore(self, ref: str = "latest") -> tuple[Any, Any]: ...


def protection(status: dict[str, Any]) -> tuple[bool, str]:
    """Whether the session counts as protected, and the one-line reason shown next to the dot; on a host without
    the project's key, that line says so too (nothing it snapshots is signed, nothing resumes by itself)."""
    protected, reason = _protection(status)
    return protected, f"{reason} · {status['trust']}" if status.get("trust") else reason


def _protection(status: dict[str, Any]) -> tuple[bool, str]:
    if status.get("last_error"):
        return False, f"last snapshot failed: {status['last_error']}"
    if not status["policy"]["enabled"]:
        return False, "automatic snapshots are off (%spotwarp on)"
    if status.get("last_snapshot") is None:
        if status.get("resumed"):  # restored by the server on a new host (docs/resume.md)
            return True, f"protected: resumed {status['resumed']['line']}"
        if status.get("restore"):  # its restored state is stored: the baseline of its next snapshot
            return True, f"protected: restored from {status['restore']['id']}"
        return False, "no snapshot from this kernel yet"
    return True, "protected"


def newer_snapshot(session: SessionView) -> dict[str, Any] | None:
    """The offer: this notebook's newest snapshot, when restoring it brings back state the kernel does not have
    (the new-host case), with what it brings; None when it holds no variables or the kernel has that state."""
    listing = session.own_manifests()
    if not listing:
        return None
    newest = listing[0]
    record = newest.kernels.get(session.name_in(newest)) or {}
    variables = record.get("variables") or {}
    if not variables:
        return None  # restoring it would bring nothing back
    known = [m for m in (session.last, session.last_restore[0] if session.last_restore else None) if m is not None]
    for m in known:
        if m.id == newest.id or m.created >= newest.created:
            return None
        mine = m.kernels.get(session.name_in(m)) or {}
        if mine.get("groups") == record.get("groups"):
            return None  # the same state, copied into a newer project snapshot (a backup, "Snapshot now")
    sizes = {v.get("group"): v.get("size") or 0 for v in variables.values()}
    return {"id": newest.id, "host": newest.host, "created": newest.created_iso, "age_s": max(0.0, time.time() - newest.created),
            "size": newest.size, "message": newest.message, "notebook": session.name_in(newest),
            "variables": len(variables), "state_size": sum(sizes.values()),
            "positions": dict(record.get("positions") or {})}


class StatusWidget(anywidget.AnyWidget):
    """Protected or not, the last snapshot, the policy, skipped variables; snapshot now; restore from a newer snapshot."""

    _esm = widget_esm()
    _css = HERE / "widget.css"

    status = traitlets.Dict(help="What `%spotwarp status` shows, plus `protected` and `protection`.").tag(sync=True)
    newer = traitlets.Dict(allow_none=True, default_value=None,
                           help="A newer snapshot of this notebook than the kernel's state, or None.").tag(sync=True)
    busy = traitlets.Unicode("", help="The action in progress: '', 'snapshot' or 'restore'.").tag(sync=True)
    notice = traitlets.Unicode("", help="The outcome of the last action, one line.").tag(sync=True)
    notice_kind = traitlets.Unicode("", help="'ok' or 'error'.").tag(sync=True)
    answered = traitlets.Unicode("", help="The request id of the last action answered (set after its outcome).").tag(
        sync=True)
    cell_running = traitlets.Float(0.0, help="While a cell runs, the time the kernel's watcher thread last said so "
                                   "(every BUSY_BEAT_S: the kernel is there, though its main thread answers nothing "
                                   "until the cell ends); 0 between cells.").tag(sync=True)

    def __init__(self, session: SessionView, **kwargs: Any):
        self._session = session
        self._stop = threading.Event()
        status, newer = self._read(check_newer=True)
        super().__init__(status=status, newer=newer, **kwargs)  # the browser's first state is complete
        self.on_msg(self._on_message)
        _start_watcher(self)

    def __repr__(self) -> str:
        return WIDGET_TEXT  # its text/plain: what a saved notebook keeps of it (server/saved_widgets.py)

    def refresh(self, check_newer: bool = False) -> None:
        """Push the session's current status (and look for a newer snapshot when asked)."""
        status, newer = self._read(check_newer)
        if check_newer:
            self.newer = newer
        self.status = status

    def _read(self, check_newer: bool) -> tuple[dict[str, Any], dict[str, Any] | None]:
        status = self._session.status()
        status["policy_text"] = self._session.policy.describe()
        status["protected"], status["protection"] = protection(status)
        newer = None
        if check_newer:
            try:
                newer = newer_snapshot(self._session)
            except Exception as exc:  # noqa: BLE001 - unreachable storage of any backend: say so, keep the widget up
                status["protected"], status["protection"] = False, f"storage: {_one_line(exc)}"
        return status, newer

    def _fingerprint(self) -> tuple:
        s = self._session
        return (s.last.id if s.last else None, s.last_error, s.last_restore[0].id if s.last_restore else None,
                s.policy.describe(), s.settings.project, s.settings.storage)

    def _on_message(self, _widget: Any, content: Any, _buffers: list) -> None:
        try:
            action = WidgetAction.from_message(content)
        except ProtocolError as exc:
            self._say("error", str(exc))
            self.answered = echoed_id(content) or ""
            return
        if action.action == "refresh":
            self.refresh(check_newer=True)
        elif action.action == "snapshot":
            self._run("snapshot", self._snapshot)
        else:
            self._run("restore", lambda: self._restore(action.snapshot))
        self.answered = action.request_id

    def _run(self, name: str, work) -> None:
        if self.busy:
            self._say("error", f"{self.busy} already in progress")
            return
        self.busy = name
        try:
            self._say("ok", work())
        except Exception as exc:  # noqa: BLE001 - a button never leaves a traceback in the kernel log
            self._say("error", f"{name} failed: {_one_line(exc)}")
        finally:
            self.busy = ""
            self.refresh(check_newer=True)

    def _snapshot(self) -> str:
        started = time.perf_counter()
        manifest = self._session.snapshot("from the status widget")
        took = time.perf_counter() - started
        return (f"Snapshot {manifest.id}: {format_size(manifest.size)}, wrote "
                f"{format_size(manifest.stats.get('bytes_written', 0))} in {format_duration(took)}")

    def _restore(self, ref: str) -> str:
        started = time.perf_counter()
        manifest, result = self._session.restore(ref)
        took = time.perf_counter() - started
        summary = (f"Restored {len(result.restored)} variables from {manifest.id} ({manifest.host}, "
                   f"{manifest.created_iso}) in {format_duration(took)}")
        return "\n".join([summary, *(f"warning: {line}" for line in result.warnings)])  # summary, then details

    def _say(self, kind: str, text: str) -> None:
        self.notice_kind, self.notice = kind, text

    def close(self) -> None:
        self._stop.set()
        super().close()


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    detail = text[0] if text else ""
    return detail if isinstance(exc, SpotWarpError) else f"{type(exc).__name__}: {detail}"


def _start_watcher(widget: StatusWidget) -> None:
    """Push changes made elsewhere (automatic snapshots at safe points, magics) while a cell runs, and say that a
    cell runs (`cell_running`): a busy kernel's main thread answers no refresh, and its silence is no loss."""
    ref = weakref.ref(widget)
    stop = widget._stop
    seen = [widget._fingerprint()]

    def watch() -> None:
        said = 0.0
        while not stop.wait(WATCH_INTERVAL_S):
            w = ref()
            if w is None or w.comm is None:
                return
            now = w._fingerprint()
            try:
                if now != seen[0] and not w.busy:
                    seen[0] = now
                    w.refresh()
                if getattr(w._session, "running", None) is not None:
                    if time.monotonic() - said >= BUSY_BEAT_S:
                        said = time.monotonic()
                        w.cell_running = time.time()
                elif w.cell_running:
                    said, w.cell_running = 0.0, 0.0
            except Exception:  # noqa: BLE001 - a display helper never breaks the kernel
                pass
            del w

    threading.Thread(target=watch, name="spotwarp-widget", daemon=True).start()
