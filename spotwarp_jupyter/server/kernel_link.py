"""Asking a live kernel something over the `spotwarp` comm, from the server, without blocking the event loop."""

from __future__ import annotations

import time
import uuid
from queue import Empty
from typing import Any

from ..protocol import COMM_TARGET, KernelRequest, ProtocolError, read_kernel_answer


class KernelUnavailable(Exception):
    """The kernel did not answer: SpotWarp not loaded, busy past the timeout, or gone."""


async def ask_control(kernel_manager: Any, kernel_id: str, msg_type: str, content: dict[str, Any],
                      timeout: float) -> dict[str, Any]:
    """Send `msg_type` on the kernel's control channel (served even while a cell runs); the reply's content."""
    try:
        km = kernel_manager.get_kernel(kernel_id)
    except KeyError:
        raise KernelUnavailable("no such kernel") from None
    client = km.client()
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


async def ask_kernel(kernel_manager: Any, kernel_id: str, request: KernelRequest, timeout: float) -> dict[str, Any]:
    """Open a `spotwarp` comm on the kernel with `request`; its answer (a dict with `ok` and the request's id)."""
    try:
        km = kernel_manager.get_kernel(kernel_id)
    except KeyError:
        raise KernelUnavailable("no such kernel") from None
    client = km.client()
    client.start_channels(shell=True, iopub=True, stdin=False, hb=False, control=False)
    deadline = time.monotonic() + timeout
    try:
        try:
            # a kernel answers kernel_info only between cells, so this also waits out a running cell
            await client.wait_for_ready(timeout=timeout)
        except RuntimeError as exc:
            raise KernelUnavailable(f"busy or not responding ({exc})") from None
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
