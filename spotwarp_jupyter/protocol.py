"""The messages between the server, a kernel and its status widget: names, fields, request ids.

Three conversations, each built and read only here (no Jupyter imports, so both sides share it):

- comm requests (target `spotwarp`): the server opens a comm with a `KernelRequest` (snapshot, status,
  restore); the kernel answers once with the same `request_id` and closes the comm.
- preemption notices (control channel, `spotwarp_notice_request` / `_reply`): served even while a cell runs.
  The kernel answers at once with the notice's `request_id`; the snapshot it then takes at its next safe
  point names that id in its manifest (`Manifest.requests`), which is how the server finds it in the store.
- renames (control channel, `spotwarp_rename_request` / `_reply`): the session's notebook was renamed or
  moved (JupyterLab's rename, a move in the file browser); the kernel takes the new name, served even while a
  cell runs, and keeps the old one as an alias so its snapshots stay its own. The server also writes the new
  name beside the kernel's connection file (`notebook_record_path`), where a kernel that loads SpotWarp
  later, or restarts with its first `JPY_SESSION_NAME`, reads it.
- widget actions: the browser sends `{"action": ..., "request_id": ...}`; the kernel answers by updating the
  widget's traits, `answered` last (the request id).

Every parser raises ProtocolError with one line saying what is wrong; nothing is acted on before that.
"""

from __future__ import annotations

import math
import os
import secrets
from dataclasses import dataclass
from typing import Any

COMM_TARGET = "spotwarp"
# the status widget's text/plain: what a saved notebook shows in its place (the server drops the widget view
# from saved outputs, whose model no reopened notebook has: "Error displaying widget: model not found")
WIDGET_TEXT = "SpotWarp status widget (run %spotwarp widget to show it again)"
WIDGET_VIEW_MIME = "application/vnd.jupyter.widget-view+json"
NOTICE_REQUEST = "spotwarp_notice_request"
NOTICE_REPLY = "spotwarp_notice_reply"
RENAME_REQUEST = "spotwarp_rename_request"
RENAME_REPLY = "spotwarp_rename_reply"
PREEMPTION = "preemption"  # the safe-point reason of a notice's snapshot
SERVER_REQUEST = "server request"  # the reason of a project snapshot's (Snapshot now, preStop) at a busy kernel
NOTICE_REASONS = (PREEMPTION, SERVER_REQUEST)

SNAPSHOT, STATUS, RESTORE = "snapshot", "status", "restore"
KERNEL_REQUESTS = (SNAPSHOT, STATUS, RESTORE)
WIDGET_ACTIONS = ("snapshot", "restore", "refresh")
_MAX_ID = 64


class ProtocolError(ValueError):
    """A message that is not what this protocol says (one line: what is wrong)."""


def new_request_id() -> str:
    """A fresh id for one request; its answer (and the snapshot taken for it) carries it back."""
    return secrets.token_hex(8)


def _request_id(data: dict[str, Any]) -> str:
    value = echoed_id(data)
    if value is None:
        raise ProtocolError(f"request_id must be a non-empty string of at most {_MAX_ID} characters")
    return value


def _object(data: Any, what: str) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise ProtocolError(f"{what} must be a JSON object, not {type(data).__name__}")
    return data


def _addressed(data: Any, what: str, key: str, kinds: tuple[str, ...],
               kind_name: str) -> tuple[dict[str, Any], str, str]:
    """A request's object, its kind (`data[key]`, one of `kinds`) and its request id; ProtocolError otherwise."""
    data = _object(data, what)
    kind = data.get(key)
    if kind not in kinds:
        raise ProtocolError(f"unknown {kind_name} {kind!r}: use one of {', '.join(kinds)}")
    return data, kind, _request_id(data)


def echoed_id(data: Any) -> str | None:
    """The request id of a message, when it has a readable one (so even a refusal can name its request)."""
    value = data.get("request_id") if isinstance(data, dict) else None
    return value if isinstance(value, str) and 0 < len(value) <= _MAX_ID else None


# -- comm requests: server -> kernel ----------------------------------------------------------------------
@dataclass(frozen=True)
class KernelRequest:
    """One request to a kernel over the `spotwarp` comm."""

    kind: str  # snapshot | status | restore
    request_id: str
    message: str | None = None  # snapshot: the snapshot's message
    snapshot: str = "latest"  # restore: which snapshot
    variables: tuple[str, ...] | None = None  # restore: only these names (None: all)
    notebook: str | None = None  # the session's notebook now: a kernel still under an older name takes it first

    @classmethod
    def snapshot_now(cls, message: str | None = None) -> "KernelRequest":
        return cls(SNAPSHOT, new_request_id(), message=message)

    @classmethod
    def status_now(cls) -> "KernelRequest":
        return cls(STATUS, new_request_id())

    @classmethod
    def restore_now(cls, snapshot: str = "latest", variables: list[str] | None = None) -> "KernelRequest":
        return cls(RESTORE, new_request_id(), snapshot=snapshot,
                   variables=None if variables is None else tuple(variables))

    def to_message(self) -> dict[str, Any]:
        """The comm's `data`."""
        out: dict[str, Any] = {"request": self.kind, "request_id": self.request_id}
        if self.kind == SNAPSHOT and self.message is not None:
            out["message"] = self.message
        if self.kind == RESTORE:
            out["snapshot"] = self.snapshot
            if self.variables is not None:
                out["variables"] = list(self.variables)
        if self.notebook is not None:
            out["notebook"] = self.notebook
        return out

    @classmethod
    def from_message(cls, data: Any) -> "KernelRequest":
        """Parse a comm's `data`; ProtocolError when it is malformed."""
        data, kind, request_id = _addressed(data, "a spotwarp request", "request", KERNEL_REQUESTS, "request")
        message = data.get("message")
        if message is not None and not isinstance(message, str):
            raise ProtocolError("a snapshot request's message must be a string")
        snapshot = data.get("snapshot", "latest")
        if not isinstance(snapshot, str) or not snapshot.strip():
            raise ProtocolError("a restore request's snapshot must be a snapshot id or 'latest'")
        variables = data.get("variables")
        if variables is not None and (not isinstance(variables, list)
                                      or not all(isinstance(v, str) and v for v in variables)):
            raise ProtocolError("a restore request's variables must be a list of variable names")
        notebook = data.get("notebook")
        if notebook is not None and (not isinstance(notebook, str) or not notebook.strip()):
            raise ProtocolError("a request's notebook must be the session's notebook path")
        return cls(kind, request_id, message=message, snapshot=snapshot.strip(),
                   variables=None if variables is None else tuple(variables), notebook=notebook)


def kernel_answer(request: KernelRequest, **fields: Any) -> dict[str, Any]:
    """A kernel's answer to `request`: `{"ok": true, "request": ..., "request_id": ..., **fields}`."""
    return {**fields, "ok": True, "request": request.kind, "request_id": request.request_id}


def kernel_refusal(data: Any, error: str) -> dict[str, Any]:
    """A kernel's answer to a request it could not carry out (or read): one line, its id when it had one."""
    kind = data.get("request") if isinstance(data, dict) and isinstance(data.get("request"), str) else None
    return {"ok": False, "request": kind, "request_id": echoed_id(data), "error": one_line(error)}


def read_kernel_answer(data: Any, request: KernelRequest) -> dict[str, Any]:
    """Check a kernel's answer to `request` (an object, `ok`, the request's id echoed); return it."""
    data = _object(data, "a kernel's answer")
    if not isinstance(data.get("ok"), bool):
        raise ProtocolError("a kernel's answer must say ok: true or false")
    if data.get("request_id") != request.request_id:
        raise ProtocolError(f"the kernel answered request {data.get('request_id')!r}, not {request.request_id!r}")
    if not data["ok"] and not isinstance(data.get("error"), str):
        raise ProtocolError("a kernel's refusal must say why (error)")
    return data


# -- preemption notices: server -> kernel, on the control channel ----------------------------------------
@dataclass(frozen=True)
class NoticeRequest:
    """Snapshot at the next safe point; when fatal, hold there until it is committed or `deadline` passes."""

    request_id: str
    fatal: bool = True
    deadline: float | None = None  # wall-clock seconds
    reason: str = PREEMPTION  # what the snapshot's message says it was taken for

    @classmethod
    def new(cls, fatal: bool = True, deadline: float | None = None, reason: str = PREEMPTION) -> "NoticeRequest":
        return cls(new_request_id(), fatal, deadline, reason)

    def to_message(self) -> dict[str, Any]:
        """The control message's content."""
        return {"request_id": self.request_id, "fatal": self.fatal, "deadline": self.deadline, "reason": self.reason}

    @classmethod
    def from_message(cls, content: Any) -> "NoticeRequest":
        """Parse a notice's content; ProtocolError when it is malformed."""
        content = _object(content, "a notice")
        fatal = content.get("fatal", True)
        if not isinstance(fatal, bool):
            raise ProtocolError("a notice's fatal must be true or false")
        deadline = content.get("deadline")
        if deadline is not None and (isinstance(deadline, bool) or not isinstance(deadline, (int, float))
                                     or not math.isfinite(deadline)):
            raise ProtocolError("a notice's deadline must be a time in seconds or null")
        reason = content.get("reason", PREEMPTION)
        if reason not in NOTICE_REASONS or (fatal and reason != PREEMPTION):
            raise ProtocolError(f"a notice's reason must be one of {', '.join(NOTICE_REASONS)} (a fatal one: "
                                f"{PREEMPTION})")
        return cls(_request_id(content), fatal, None if deadline is None else float(deadline), reason)


@dataclass(frozen=True)
class NoticeAnswer:
    """A kernel's answer to a notice: it will snapshot (ok), or why not."""

    request_id: str | None
    ok: bool
    requested_at: float
    notebook: str | None = None
    in_flight: bool = False
    error: str | None = None

    def to_message(self) -> dict[str, Any]:
        out: dict[str, Any] = {"request_id": self.request_id, "ok": self.ok, "requested_at": self.requested_at}
        if self.ok:
            out.update(notebook=self.notebook, in_flight=self.in_flight)
        else:
            out["error"] = self.error
        return out

    @classmethod
    def from_message(cls, content: Any, request: NoticeRequest) -> "NoticeAnswer":
        """Parse a kernel's answer to `request`; ProtocolError when malformed or for another request."""
        content = _object(content, "a notice's answer")
        if content.get("request_id") != request.request_id:
            raise ProtocolError(f"the kernel answered notice {content.get('request_id')!r}, "
                                f"not {request.request_id!r}")
        ok = content.get("ok")
        if not isinstance(ok, bool):
            raise ProtocolError("a notice's answer must say ok: true or false")
        notebook = content.get("notebook")
        if ok and (not isinstance(notebook, str) or not notebook):
            raise ProtocolError("a notice's answer must name the kernel's notebook")
        requested_at = content.get("requested_at") or 0.0
        if isinstance(requested_at, bool) or not isinstance(requested_at, (int, float)):
            raise ProtocolError("a notice's answer must say when it was requested (requested_at, in seconds)")
        error = content.get("error")
        return cls(request.request_id, ok, float(requested_at), notebook if ok else None,
                   bool(content.get("in_flight")), None if ok else str(error or "refused"))


def answers_request(requests: Any, request_id: str) -> bool:
    """Whether a snapshot's recorded requests (`Manifest.requests`) include `request_id`."""
    return isinstance(requests, (list, tuple)) and request_id in requests


# -- renames: server -> kernel, on the control channel ----------------------------------------------------
@dataclass(frozen=True)
class RenameRequest:
    """The kernel's notebook is now `notebook` (a path relative to the workspace)."""

    request_id: str
    notebook: str

    @classmethod
    def new(cls, notebook: str) -> "RenameRequest":
        return cls(new_request_id(), notebook)

    def to_message(self) -> dict[str, Any]:
        return {"request_id": self.request_id, "notebook": self.notebook}

    @classmethod
    def from_message(cls, content: Any) -> "RenameRequest":
        """Parse a rename's content; ProtocolError when it is malformed."""
        content = _object(content, "a rename")
        notebook = content.get("notebook")
        if not isinstance(notebook, str) or not notebook.strip() or "\0" in notebook:
            raise ProtocolError("a rename must name the notebook's new path")
        return cls(_request_id(content), notebook.strip())


NOTEBOOK_RECORD_PREFIX = "spotwarp-notebook-of-"


def notebook_record_path(connection_file: str) -> str:
    """Where the server records a kernel's notebook after a rename: beside the kernel's connection file, which
    both know (`spotwarp-notebook-of-kernel-<id>.json`); it holds `{"notebook": <path in the workspace>}`."""
    folder, name = os.path.split(connection_file)
    return os.path.join(folder, NOTEBOOK_RECORD_PREFIX + name)


LOADED_MARK_PREFIX = "spotwarp-loaded-in-"


def loaded_mark_path(connection_file: str) -> str:
    """Where a kernel marks that SpotWarp is loaded in it: beside its connection file
    (`spotwarp-loaded-in-kernel-<id>.json`, holding `{"pid": <the kernel's pid>}`), written at `%load_ext
    spotwarp` and removed at unload. The server sends its control requests (a rename) only to kernels so
    marked: any other kernel logs an ERROR line for a control message it does not know."""
    folder, name = os.path.split(connection_file)
    return os.path.join(folder, LOADED_MARK_PREFIX + name)


def read_loaded_mark(content: Any) -> int | None:
    """The pid a mark names, or None when it names none."""
    pid = content.get("pid") if isinstance(content, dict) else None
    return pid if isinstance(pid, int) and not isinstance(pid, bool) and pid > 0 else None


def read_notebook_record(content: Any) -> str | None:
    """The notebook a record names, or None when it names none."""
    notebook = content.get("notebook") if isinstance(content, dict) else None
    if not isinstance(notebook, str) or not notebook.strip() or "\0" in notebook:
        return None
    return notebook.strip()


def rename_answer(request_id: str | None, notebook: str | None = None, former: list[str] | None = None,
                  error: str | None = None) -> dict[str, Any]:
    """A kernel's answer to a rename: its notebook and former names now, or why not."""
    if error is not None:
        return {"request_id": request_id, "ok": False, "error": one_line(error)}
    return {"request_id": request_id, "ok": True, "notebook": notebook, "former": list(former or [])}


# -- widget actions: browser -> kernel --------------------------------------------------------------------
@dataclass(frozen=True)
class WidgetAction:
    """A button pressed in the status widget (or its periodic refresh); the kernel echoes `request_id` in the
    widget's `answered` trait once the outcome (`notice`, `status`) is set."""

    action: str  # snapshot | restore | refresh
    request_id: str
    snapshot: str = "latest"  # restore: which snapshot

    @classmethod
    def from_message(cls, content: Any) -> "WidgetAction":
        """Parse a widget's custom message; ProtocolError when it is malformed."""
        content, action, request_id = _addressed(content, "a widget action", "action", WIDGET_ACTIONS,
                                                 "widget action")
        snapshot = content.get("id") or "latest"
        if not isinstance(snapshot, str):
            raise ProtocolError("a widget restore's id must be a snapshot id")
        return cls(action, request_id, snapshot)


def one_line(text: str) -> str:
    """The first line of an error text (messages carry one line)."""
    lines = str(text).strip().splitlines()
    return lines[0] if lines else ""
