"""Preemption notices (and renames) reaching a kernel that is busy in a cell; the kernel's entries in the journal.

A kernel running a cell reads nothing from its shell channel until the cell ends, so the server cannot
ask it over the `spotwarp` comm. ipykernel serves the control channel on its own thread, though, and
keeps serving it while a cell runs. The server sends a `protocol.NoticeRequest` there; this module
answers at once (echoing its request id) and queues a snapshot request (`safepoints.request`), honoured at
the next safe point: the next `resumable` step, the end of the running cell, or, in an idle kernel, right
away on the main thread between messages (where comm requests also run). That snapshot's manifest names
the request id, so the server finds exactly it in the store. A malformed notice is refused in one line and
queues nothing. A kernel without SpotWarp never answers; unlike a signal, the message cannot hurt it.
"""

from __future__ import annotations

import logging
import os
import tempfile
import time
from typing import Any

from .. import safepoints
from ..engine.journal import TRAINING_RESUMED, Journal
from ..protocol import (
    NOTICE_REPLY,
    NOTICE_REQUEST,
    PREEMPTION,
    RENAME_REPLY,
    RENAME_REQUEST,
    NoticeAnswer,
    NoticeRequest,
    RenameRequest,
    echoed_id,
    loaded_mark_path,
    one_line,
    rename_answer,
)
from ..training.collective import NOTICE_FILE_ENV
from . import session as session_module
from .automatic import AutomaticSnapshots

log = logging.getLogger("spotwarp")


def _on_notice(kernel: Any, stream: Any, idents: Any, msg: dict[str, Any]) -> None:
    """Runs on the kernel's control thread: queue the snapshot, wake an idle main thread, answer."""
    requested_at = time.time()
    content = msg.get("content")
    try:
        notice = NoticeRequest.from_message(content)
        session = session_module.current()
    except Exception as exc:  # noqa: BLE001 - malformed, or SpotWarp unloaded: the server learns why; nothing queued
        error = str(exc) if isinstance(exc, ValueError) else f"{type(exc).__name__}: {exc}"
        answer = NoticeAnswer(echoed_id(content), False, requested_at, error=one_line(error))
        kernel.session.send(stream, NOTICE_REPLY, answer.to_message(), msg, idents)
        return
    if notice.fatal:
        _hold_at_safe_point(session.automatic, PREEMPTION, notice.deadline or requested_at + 30)
    # the next snapshot names the request's id: the server finds exactly the snapshot it asked for
    session.automatic.answer_with_next_snapshot(notice.request_id)
    answer = NoticeAnswer(notice.request_id, True, requested_at, session.notebook, session.in_flight is not None)
    safepoints.request(notice.reason)
    _relay_to_ranks(notice.request_id)
    # an idle kernel reaches no safe point by itself: run one on the main thread between messages;
    # in a busy kernel this runs after the cell, by when the request was taken at a step or the cell's end
    kernel.io_loop.add_callback(safepoints.reached, "notice")
    kernel.session.send(stream, NOTICE_REPLY, answer.to_message(), msg, idents)


def _relay_to_ranks(request_id: str) -> None:
    """Workers this kernel forked (torch.distributed ranks in a `resumable` loop with `state`) watch a file
    named in their environment: rewriting it is a notice, which all of them take at the same step."""
    path = os.environ.get(NOTICE_FILE_ENV)
    if not path:
        return
    try:
        with open(path, "w", encoding="utf-8") as f:
            f.write(request_id)
    except OSError as exc:
        log.warning("SpotWarp: the notice could not be relayed to this kernel's training ranks: %s", exc)


def _notice_file() -> str:
    """This kernel's notice file for its ranks, none yet: beside its connection file, else in the temporary folder."""
    try:
        from ipykernel.connect import get_connection_file

        folder = os.path.dirname(get_connection_file())
    except (ImportError, RuntimeError):
        folder = tempfile.gettempdir()
    path = os.path.join(folder, f"spotwarp-notice-{os.getpid()}")
    try:
        os.remove(path)
    except OSError:
        pass
    return path


def _on_rename(kernel: Any, stream: Any, idents: Any, msg: dict[str, Any]) -> None:
    """Runs on the control thread: the notebook was renamed or moved; take its new name (even mid-cell)."""
    content = msg.get("content")
    try:
        rename = RenameRequest.from_message(content)
        session = session_module.current()
        session.rename(rename.notebook)
        answer = rename_answer(rename.request_id, session.notebook, session.aliases)
    except Exception as exc:  # noqa: BLE001 - malformed, or SpotWarp unloaded: the server learns why
        error = str(exc) if isinstance(exc, ValueError) else f"{type(exc).__name__}: {exc}"
        answer = rename_answer(echoed_id(content), error=error)
    kernel.session.send(stream, RENAME_REPLY, answer, msg, idents)


def _hold_at_safe_point(automatic: AutomaticSnapshots, reason: str, deadline: float) -> None:
    """At the next safe point, wait there until the notice's snapshot is committed (or the deadline passes).

    The host is going away: steps taken after the snapshot's moment would be lost anyway, and a paused
    loop leaves the machine to the writer. A snapshot already in flight is finished first, then the
    notice's own is started at the same safe point.
    """
    def start(where: str, reasons: list[str]) -> bool:
        """Start the snapshot; False when it was deferred behind one already in flight."""
        busy = automatic.in_flight is not None
        automatic.at_safe_point(where, reasons, urgent=True)  # its writer keeps the kernel's priority
        return not busy

    def at_safe_point(where: str, reasons: list[str]) -> None:
        if reason not in reasons:
            automatic.at_safe_point(where, reasons)
            return
        safepoints.set_handler(automatic.at_safe_point)  # one safe point only
        if where == "step":
            _abandon_in_flight(automatic, deadline)
        started = start(where, reasons)
        while time.time() < deadline:
            _lift_priority(automatic)
            if not automatic.wait_in_flight(timeout=max(0.0, deadline - time.time())) or started:
                return
            # ours was deferred: the writer's reaper hands it back as a request just after it finishes
            again: list[str] = []
            handback = time.time() + 1.0
            while reason not in again and time.time() < handback:
                again += safepoints.take_pending()
                if reason not in again:
                    time.sleep(0.005)
            if reason not in again:
                for other in again:
                    safepoints.request(other)
                return
            started = start(where, again)

    safepoints.set_handler(at_safe_point)


def _abandon_in_flight(automatic: AutomaticSnapshots, deadline: float) -> None:
    """Mid-training, a snapshot still being written holds state older than this step: every step since has
    changed what it is writing, so the notice's snapshot writes it all again anyway. Stop it (the snapshot
    before it stays the newest committed) rather than wait for it first."""
    job = automatic.in_flight
    if job is None or job.pid is None:
        return
    job.kill()
    automatic.wait_in_flight(timeout=max(0.0, min(5.0, deadline - time.time())))


def _lift_priority(automatic: AutomaticSnapshots) -> None:
    """The writer runs below the kernel's priority so training keeps the CPU; on a notice it should not."""
    job = automatic.in_flight
    if job is None or job.pid is None:  # none, or a writer thread of this very process
        return
    try:
        os.setpriority(os.PRIO_PROCESS, job.pid, os.getpriority(os.PRIO_PROCESS, 0))
    except (OSError, AttributeError):  # not permitted (no CAP_SYS_NICE), or already gone
        pass


def install(ipython: Any) -> bool:
    """Listen for notices on this kernel's control channel; False outside a Jupyter kernel."""
    kernel = getattr(ipython, "kernel", None)
    handlers = getattr(kernel, "control_handlers", None)
    if handlers is None:
        return False
    handlers[NOTICE_REQUEST] = lambda stream, idents, msg: _on_notice(kernel, stream, idents, msg)
    handlers[RENAME_REQUEST] = lambda stream, idents, msg: _on_rename(kernel, stream, idents, msg)
    os.environ[NOTICE_FILE_ENV] = _notice_file()  # inherited by the processes the kernel starts
    _mark_loaded(True)
    return True


def uninstall(ipython: Any) -> None:
    """Stop listening (on `%unload_ext spotwarp`)."""
    handlers = getattr(getattr(ipython, "kernel", None), "control_handlers", None)
    if handlers is not None:
        handlers.pop(NOTICE_REQUEST, None)
        handlers.pop(RENAME_REQUEST, None)
        _mark_loaded(False)
    path = os.environ.pop(NOTICE_FILE_ENV, None)
    if path:
        try:
            os.remove(path)
        except OSError:
            pass


def _mark_loaded(loaded: bool) -> None:
    """Tell the server, through a small file beside the connection file, whether this kernel handles SpotWarp's
    control requests (protocol.loaded_mark_path); other kernels are sent none. One local write, never a wait."""
    try:
        from ipykernel.connect import get_connection_file

        path = loaded_mark_path(get_connection_file())
        if not loaded:
            os.remove(path)
            return
        temporary = f"{path}.{os.getpid()}.tmp"
        with open(temporary, "w", encoding="utf-8") as f:
            f.write(f'{{"pid": {os.getpid()}}}')
        os.replace(temporary, path)
    except (ImportError, RuntimeError, OSError) as exc:  # not a kernel app, or a runtime folder we cannot write
        if loaded:
            log.info("SpotWarp: could not mark this kernel as having SpotWarp loaded: %s", exc)


def training_resumed(name: str, position: int) -> None:
    """Hook for `resumable`: a loop continued from a restored position; journal it (off the main thread)."""
    try:
        session = session_module.current()
    except Exception:  # noqa: BLE001 - SpotWarp unloaded: nothing to record
        return
    restored = session.last_restore[0].id if session.last_restore else None
    try:
        Journal(session.engine.store).record_soon(TRAINING_RESUMED, restored, session.notebook, fence=session.engine.fence, loop=name,
                                                  position=int(position))
    except Exception as exc:  # noqa: BLE001 - never break the user's loop for a record
        log.warning("SpotWarp: training_resumed not recorded: %s", exc)
