"""The `spotwarp` comm target: how the Jupyter server asks a kernel to snapshot, report or restore.

The server opens a comm with `{"request": "snapshot" | "status" | "restore", ...}` as its data; the
kernel answers with one message on that comm and closes it. The kernel runs comm messages between
cells on its main thread, so a snapshot taken here is consistent (never in the middle of a cell).
A kernel without SpotWarp loaded answers by closing the comm, which the server reads as "not loaded".
"""

from __future__ import annotations

import logging
from typing import Any

from . import session as session_module

TARGET = "spotwarp"
log = logging.getLogger("spotwarp")


def _snapshot(data: dict[str, Any]) -> dict[str, Any]:
    session = session_module.current()
    message = data.get("message")
    manifest = session.snapshot(message if isinstance(message, str) else "requested by the server")
    return {"id": manifest.id, "notebook": session.notebook, "project": session.settings.project,
            "storage": session.settings.storage, "size": manifest.size,
            "bytes_written": manifest.stats.get("bytes_written", 0), "skipped": session.skipped()}


def _status(data: dict[str, Any]) -> dict[str, Any]:
    return session_module.current().status()


def _restore(data: dict[str, Any]) -> dict[str, Any]:
    session = session_module.current()
    ref = data.get("snapshot") or "latest"
    variables = data.get("variables")
    if not isinstance(ref, str) or (variables is not None and not isinstance(variables, list)):
        raise ValueError("restore takes a snapshot id and an optional list of variable names")
    manifest, result = session.restore(ref, variables, wait=True)  # the answer names every variable
    return {"id": manifest.id, "notebook": session.notebook, "restored": result.restored,
            "warnings": result.warnings}


REQUESTS = {"snapshot": _snapshot, "status": _status, "restore": _restore}


def answer(data: Any) -> dict[str, Any]:
    """The reply to one request: `{"ok": true, ...}` or `{"ok": false, "error": one line}`."""
    request = data.get("request") if isinstance(data, dict) else None
    handler = REQUESTS.get(request)  # type: ignore[arg-type]
    if handler is None:
        return {"ok": False, "error": f"unknown request {request!r}: use one of {', '.join(REQUESTS)}"}
    try:
        return {"ok": True, "request": request, **handler(data)}
    except Exception as exc:  # noqa: BLE001 - the server gets the reason; the kernel keeps running
        return {"ok": False, "request": request, "error": f"{type(exc).__name__}: {exc}"}


def _on_open(comm, msg) -> None:
    comm.send(answer(msg["content"].get("data")))
    comm.close()


def register() -> bool:
    """Register the comm target in this kernel; False outside a Jupyter kernel (plain IPython)."""
    try:
        from ipykernel.kernelbase import Kernel

        if not Kernel.initialized():
            return False
        import comm

        comm.get_comm_manager().register_target(TARGET, _on_open)
        return True
    except Exception as exc:  # noqa: BLE001 - a kernel without comms still gets the magic
        log.debug("spotwarp comm target not registered: %s", exc)
        return False


def unregister() -> None:
    """Remove the comm target (on `%unload_ext spotwarp`)."""
    try:
        import comm

        comm.get_comm_manager().unregister_target(TARGET, _on_open)
    except Exception:  # noqa: BLE001
        pass
