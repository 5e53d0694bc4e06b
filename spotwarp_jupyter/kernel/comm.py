"""The `spotwarp` comm target: how the Jupyter server asks a kernel to snapshot, report or restore.

The server opens a comm whose data is a `protocol.KernelRequest` (snapshot, status or restore, with a request
id); the kernel answers with one message echoing that id and closes the comm. The kernel runs comm messages
between cells on its main thread, so a snapshot taken here is consistent (never in the middle of a cell).
A kernel without SpotWarp loaded answers by closing the comm, which the server reads as "not loaded".
"""

from __future__ import annotations

import logging
from typing import Any

from ..protocol import (
    COMM_TARGET,
    RESTORE,
    SNAPSHOT,
    STATUS,
    KernelRequest,
    ProtocolError,
    kernel_answer,
    kernel_refusal,
)
from . import session as session_module

log = logging.getLogger("spotwarp")


def _snapshot(request: KernelRequest) -> dict[str, Any]:
    session = session_module.current()
    manifest = session.snapshot(request.message if request.message is not None else "requested by the server")
    return {"id": manifest.id, "notebook": session.notebook, "project": session.settings.project,
            "storage": session.settings.storage, "size": manifest.size,
            "bytes_written": manifest.stats.get("bytes_written", 0), "skipped": session.skipped()}


def _status(request: KernelRequest) -> dict[str, Any]:
    return session_module.current().status()


def _restore(request: KernelRequest) -> dict[str, Any]:
    session = session_module.current()
    variables = None if request.variables is None else list(request.variables)
    manifest, result = session.restore(request.snapshot, variables, wait=True)  # the answer names every variable
    return {"id": manifest.id, "notebook": session.notebook, "restored": result.restored,
            "warnings": result.warnings}


REQUESTS = {SNAPSHOT: _snapshot, STATUS: _status, RESTORE: _restore}


def answer(data: Any) -> dict[str, Any]:
    """The reply to one request: `{"ok": true, "request_id": ..., ...}` or `{"ok": false, "error": one line}`."""
    try:
        request = KernelRequest.from_message(data)
    except ProtocolError as exc:
        return kernel_refusal(data, str(exc))  # malformed: nothing is done
    try:
        if request.notebook:  # renamed before SpotWarp was loaded here: the server names the session's notebook
            session_module.current().rename(request.notebook)
        return kernel_answer(request, **REQUESTS[request.kind](request))
    except Exception as exc:  # noqa: BLE001 - the server gets the reason; the kernel keeps running
        return kernel_refusal(data, f"{type(exc).__name__}: {exc}")


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

        comm.get_comm_manager().register_target(COMM_TARGET, _on_open)
        return True
    except Exception as exc:  # noqa: BLE001 - a kernel without comms still gets the magic
        log.debug("spotwarp comm target not registered: %s", exc)
        return False


def unregister() -> None:
    """Remove the comm target (on `%unload_ext spotwarp`)."""
    try:
        import comm

        comm.get_comm_manager().unregister_target(COMM_TARGET, _on_open)
    except Exception:  # noqa: BLE001
        pass
