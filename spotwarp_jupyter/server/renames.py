"""A notebook's identity follows renames and moves: the server tells the notebook's kernel its new name.

JupyterLab renames a notebook (the name asked for at its first save, a move in the file browser) through the
contents API, then moves its session with `PATCH /api/sessions/{id}` (`path`). The session manager's
`update_session` is where every such change passes, so it is wrapped here: when a session's path changes, its
kernel gets a `protocol.RenameRequest` on its control channel (served even while a cell runs). The kernel takes
the new name and keeps the old one as an alias, recorded with its next snapshots, so its earlier snapshots
stay its own on this host and on the next (kernel/session.py).

A kernel without SpotWarp does not answer, and its `JPY_SESSION_NAME` (set once, when the kernel was first
started; a restart keeps it) still names the old path. So before telling the kernel, the server writes the new
name beside the kernel's connection file (`protocol.notebook_record_path`); `%load_ext spotwarp` reads it there
(kernel/notebooks.py). A local file both already know works wherever the kernel is this server's child process
(a plain server, `spotwarp start`, a JupyterHub single-user server), needs no token or URL, and never waits.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from typing import Any, Callable

from ..protocol import LOADED_MARK_PREFIX, NOTEBOOK_RECORD_PREFIX, RENAME_REQUEST, RenameRequest, notebook_record_path
from .kernel_link import KernelUnavailable, ask_control, spotwarp_loaded

log = logging.getLogger("spotwarp")
ANSWER_TIMEOUT_S = 10.0


def follow_renames(session_manager: Any, kernel_manager: Any, notebook_of: Callable[[str], str]) -> None:
    """Wrap `session_manager.update_session` so a changed path is told to the session's kernel."""
    original = session_manager.update_session
    if getattr(original, "spotwarp_follows_renames", False):
        return
    pending: set[asyncio.Task] = set()

    async def update_session(session_id: str, **kwargs: Any) -> Any:
        before = await session_manager.get_session(session_id=session_id) if "path" in kwargs else None
        result = await original(session_id, **kwargs)
        if before is not None and before.get("kernel") and before.get("path") != kwargs["path"]:
            old, new = notebook_of(before["path"]), notebook_of(kwargs["path"])
            if old != new:
                await record_for_kernel(kernel_manager, before["kernel"]["id"], new)  # before the answer: a
                # `%load_ext spotwarp` run after this rename finds the name
                task = asyncio.ensure_future(tell_kernel(kernel_manager, before["kernel"]["id"], old, new))
                pending.add(task)  # held until done: the loop keeps only weak references to tasks
                task.add_done_callback(pending.discard)
        return result

    update_session.spotwarp_follows_renames = True  # type: ignore[attr-defined]
    session_manager.update_session = update_session


async def record_for_kernel(kernel_manager: Any, kernel_id: str, notebook: str) -> None:
    """Write `notebook` beside the kernel's connection file (off the event loop); a failure is logged."""
    try:
        connection_file = kernel_manager.get_kernel(kernel_id).connection_file
    except (KeyError, AttributeError):
        return
    if not connection_file or not os.path.isabs(connection_file):
        return  # a remote kernel (a gateway): only the control channel and comm requests reach it
    try:
        await asyncio.to_thread(record_notebook, connection_file, notebook)
    except OSError as exc:
        log.warning("SpotWarp: could not record that kernel %s's notebook is now %s: %s", kernel_id, notebook, exc)


def record_notebook(connection_file: str, notebook: str) -> None:
    """Replace the record atomically (a kernel never reads half of one); remove records of kernels gone."""
    path = notebook_record_path(connection_file)
    folder = os.path.dirname(path)
    temporary = os.path.join(folder, f".{os.path.basename(path)}.{os.getpid()}.tmp")
    with open(temporary, "w", encoding="utf-8") as f:
        json.dump({"notebook": notebook}, f)
    os.replace(temporary, path)
    for name in os.listdir(folder):
        prefix = next((p for p in (NOTEBOOK_RECORD_PREFIX, LOADED_MARK_PREFIX) if name.startswith(p)), None)
        if prefix is not None and name.endswith(".json") and not os.path.exists(
                os.path.join(folder, name[len(prefix):])):
            try:
                os.remove(os.path.join(folder, name))  # its kernel's connection file is gone: the kernel is
            except FileNotFoundError:
                pass


async def tell_kernel(kernel_manager: Any, kernel_id: str, old: str, new: str) -> bool:
    """Tell one kernel its notebook is now `new`; True when it took the name."""
    if not await spotwarp_loaded(kernel_manager, kernel_id):
        # a kernel without SpotWarp would log an ERROR for a control message it does not know; the record
        # beside its connection file gives it the name if it loads SpotWarp later
        log.debug("SpotWarp: kernel %s has no SpotWarp loaded: %s is now %s, recorded for it", kernel_id, old, new)
        return False
    request = RenameRequest.new(new)
    try:
        answer = await ask_control(kernel_manager, kernel_id, RENAME_REQUEST, request.to_message(), ANSWER_TIMEOUT_S)
    except KernelUnavailable as exc:
        log.info("SpotWarp: kernel %s not told that %s is now %s: %s", kernel_id, old, new, exc)
        return False
    if not answer.get("ok"):
        log.warning("SpotWarp: kernel %s refused the rename of %s to %s: %s", kernel_id, old, new, answer.get("error"))
        return False
    log.info("SpotWarp: notebook %s is now %s (kernel %s)", old, new, kernel_id)
    return True
