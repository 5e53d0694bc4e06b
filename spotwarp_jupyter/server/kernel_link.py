"""Asking a live kernel something over the `spotwarp` comm, from the server, without blocking the event loop.

Nothing here sends `kernel_info_request`: IPython draws its banner tip from the global `random` at each one,
so every client that asked it would move the notebook's random stream (`wait_until_served` asks `comm_info`).
"""

from __future__ import annotations

import asyncio
import json
import os
import time
import uuid
from queue import Empty
from typing import Any

from ..protocol import (
    COMM_TARGET,
    NOTICE_REPLY,
    NOTICE_REQUEST,
    RENAME_REPLY,
    RENAME_REQUEST,
    KernelRequest,
    NoticeAnswer,
    NoticeRequest,
    ProtocolError,
    answers_request,
    loaded_mark_path,
    read_kernel_answer,
    read_loaded_mark,
)


class KernelUnavailable(Exception):
    """The kernel did not answer: SpotWarp not loaded, busy past the timeout, or gone."""


async def spotwarp_loaded(kernel_manager: Any, kernel_id: str) -> bool:
    """Whether SpotWarp is loaded in the kernel: marked so beside its connection file by a live process
    (protocol.loaded_mark_path; a restarted kernel's old mark names a dead pid). True for a kernel the server
    cannot see through files (a gateway's remote kernel), which is asked and may not answer."""
    try:
        connection_file = kernel_manager.get_kernel(kernel_id).connection_file
    except (KeyError, AttributeError):
        return False
    if not connection_file or not os.path.isabs(connection_file):
        return True
    return await asyncio.to_thread(_marked_by_a_live_process, loaded_mark_path(connection_file))


def _marked_by_a_live_process(path: str) -> bool:
    try:
        with open(path, encoding="utf-8") as f:
            pid = read_loaded_mark(json.load(f))
    except (OSError, ValueError):
        return False
    if pid is None:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    return True


def untrack_control_requests(kernel_manager: Any) -> None:
    """SpotWarp's control requests are no user activity: the kernel's busy/idle status around them must not
    mark a kernel running a cell idle (what the server then asks it would wait for the cell's end), nor keep
    an idle kernel from being culled."""
    untracked = getattr(kernel_manager, "untracked_message_types", None)
    if isinstance(untracked, list):
        new = [t for t in (NOTICE_REQUEST, NOTICE_REPLY, RENAME_REQUEST, RENAME_REPLY) if t not in untracked]
        kernel_manager.untracked_message_types = [*untracked, *new]


def _own_client(km: Any) -> Any:
    """A client of the kernel with a session of its own: the kernel's sockets tell peers apart by the session id,
    and two clients sharing one (a snapshot request and a notice at once) would see one of them go unheard."""
    client = km.client()
    session = client.session.clone()
    session.session = uuid.uuid4().hex
    client.session = session
    return client


async def ask_control(kernel_manager: Any, kernel_id: str, msg_type: str, content: dict[str, Any],
                      timeout: float) -> dict[str, Any]:
    """Send `msg_type` on the kernel's control channel (served even while a cell runs); the reply's content."""
    try:
        km = kernel_manager.get_kernel(kernel_id)
    except KeyError:
        raise KernelUnavailable("no such kernel") from None
    client = _own_client(km)
    client.start_channels(shell=False, iopub=False, stdin=False, hb=False, control=True)
    try:
        msg = client.session.msg(msg_type, content)
        client.control_channel.send(msg)
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise KernelUnavailable(f"no answer within {timeout:g} s (SpotWarp not loaded in this kernel?)")
            try:
                reply = await client.control_channel.get_msg(timeout=remaining)
            except Empty:
                continue
            if reply.get("parent_header", {}).get("msg_id") == msg["header"]["msg_id"]:
                return reply.get("content") or {}
    finally:
        client.stop_channels()


async def wait_until_served(client: Any, timeout: float) -> None:
    """Wait until the kernel serves this client's shell requests (between cells) and its iopub messages reach
    the client, as `wait_for_ready` does, with `comm_info_request`, which leaves the kernel's state as it is."""
    deadline = time.monotonic() + timeout
    while True:
        request = client.session.msg("comm_info_request", {"target_name": COMM_TARGET})
        client.shell_channel.send(request)
        sent = request["header"]["msg_id"]
        while True:  # the reply comes once the running cell, if any, has ended
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise KernelUnavailable(f"busy or not responding (no answer within {timeout:g} s)")
            try:
                reply = await client.shell_channel.get_msg(timeout=remaining)
            except Empty:
                continue
            if reply.get("parent_header", {}).get("msg_id") == sent:
                break
        # the request's busy/idle status on iopub says the subscription is live; missed: ask again, now quick
        heard_until = time.monotonic() + min(0.5, max(0.0, deadline - time.monotonic()))
        while (remaining := heard_until - time.monotonic()) > 0:
            try:
                msg = await client.get_iopub_msg(timeout=remaining)
            except Empty:
                break
            if msg.get("parent_header", {}).get("msg_id") == sent:
                return


async def ask_kernel(kernel_manager: Any, kernel_id: str, request: KernelRequest, timeout: float) -> dict[str, Any]:
    """Open a `spotwarp` comm on the kernel with `request`; its answer (a dict with `ok` and the request's id)."""
    try:
        km = kernel_manager.get_kernel(kernel_id)
    except KeyError:
        raise KernelUnavailable("no such kernel") from None
    client = _own_client(km)
    client.start_channels(shell=True, iopub=True, stdin=False, hb=False, control=False)
    deadline = time.monotonic() + timeout
    try:
        await wait_until_served(client, timeout)  # between cells: this also waits out a running cell
        comm_id = uuid.uuid4().hex
        msg = client.session.msg("comm_open", {"comm_id": comm_id, "target_name": COMM_TARGET,
                                               "data": request.to_message()})
        client.shell_channel.send(msg)
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise KernelUnavailable(f"no answer within {timeout:g} s (a cell is running)")
            try:
                reply = await client.get_iopub_msg(timeout=remaining)
            except Empty:
                continue
            content = reply.get("content") or {}
            if content.get("comm_id") != comm_id:
                continue
            if reply["msg_type"] == "comm_msg":
                try:
                    return read_kernel_answer(content.get("data"), request)
                except ProtocolError as exc:
                    raise KernelUnavailable(f"unreadable answer: {exc}") from None
            if reply["msg_type"] == "comm_close":
                raise KernelUnavailable("SpotWarp is not loaded in this kernel (%load_ext spotwarp)")
    finally:
        client.stop_channels()


async def request_safe_point_snapshot(kernel_manager: Any, kernel_id: str, timeout: float,
                                      notice: NoticeRequest) -> NoticeAnswer | str:
    """Ask one kernel over its control channel to snapshot at its next safe point; its answer, or why none came."""
    if not await spotwarp_loaded(kernel_manager, kernel_id):
        # a kernel without SpotWarp would log an ERROR for a control message it does not know
        return "SpotWarp is not loaded in this kernel"
    try:
        content = await ask_control(kernel_manager, kernel_id, NOTICE_REQUEST, notice.to_message(), timeout)
    except KernelUnavailable as exc:
        return str(exc)
    try:
        answer = NoticeAnswer.from_message(content, notice)
    except ProtocolError as exc:
        return f"unreadable answer: {exc}"
    return answer if answer.ok else str(answer.error)


def snapshot_answering(manifests: list[Any], answer: NoticeAnswer, request_id: str) -> Any:
    """The kernel snapshot `answer`'s kernel took for request `request_id` (its manifest names the id), or None yet.

    Every kernel asked names the same id, and a kernel snapshot holding the workspace also copies the other
    notebooks' newest records: one whose state is older than the request (`state_at`) is such a copy."""
    for m in manifests:
        record = m.kernels.get(answer.notebook) if m.kind == "kernel" else None
        if record is None or not answers_request(m.requests, request_id):
            continue
        state_at = record.get("state_at")
        if isinstance(state_at, (int, float)) and state_at < answer.requested_at:
            continue
        return m
    return None
