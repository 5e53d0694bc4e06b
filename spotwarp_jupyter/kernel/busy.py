"""A long cell says `busy` again at its loop's steps, for the clients that connect while it runs (docs/resume.md).

JupyterLab learns a kernel's state only from IOPub `status` messages, and a kernel sends them when a request starts
and when it ends: a tab that connects while a long cell runs (the cell the server re-ran on a new host, a page
reloaded mid-training) saw neither, and shows the kernel neither busy nor idle (`unknown`) until the cell ends. At
a `resumable` loop's steps, at most every `EVERY_S`, the kernel says `busy` again for the request it is running;
a client already connected gets the state it already shows. Only the request of the cell running now: its parent is
recorded when the cell starts (`cell_started`, on the kernel's main thread) and dropped when it ends, so a loop left
running in a user thread after its cell ended says nothing (a `busy` for a finished request would never be followed
by an `idle`, and the tab would stay busy).
"""

from __future__ import annotations

import time
from typing import Any

EVERY_S = 1.0
_said_at = {"t": 0.0}
_running: dict[str, Any] = {"parent": None}  # the shell request of the cell running now, None between cells


def _kernel(kernel: Any) -> Any:
    if kernel is None:
        from IPython import get_ipython

        kernel = getattr(get_ipython(), "kernel", None)
    return kernel


def cell_started(kernel: Any = None) -> None:
    """A cell starts (called on the kernel's main thread, where its request is the shell's parent)."""
    try:
        parent = _kernel(kernel).get_parent("shell")
    except Exception:  # noqa: BLE001 - not in an ipykernel: nothing to say busy for
        parent = None
    _running["parent"] = parent if parent and parent.get("header") else None


def cell_ended() -> None:
    """The cell ended: its request is finished, no `busy` for it any more."""
    _running["parent"] = None


def still_busy(kernel: Any = None) -> None:
    """Publish `busy` on IOPub for the running cell's request, if the last one is EVERY_S old (cheap otherwise);
    nothing between cells."""
    parent = _running["parent"]
    if parent is None:
        return
    now = time.monotonic()
    if now - _said_at["t"] < EVERY_S:
        return
    _said_at["t"] = now
    publish = getattr(_kernel(kernel), "_publish_status", None)  # what ipykernel sends at a request's start
    if publish is None:
        return  # not in an ipykernel (a terminal IPython, a test's loop)
    try:
        publish("busy", "shell", parent)
    except Exception:  # noqa: BLE001 - a status message is a courtesy; the user's loop goes on
        pass
