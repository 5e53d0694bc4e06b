"""A long cell says `busy` again at its loop's steps, for the clients that connect while it runs (docs/resume.md).

JupyterLab learns a kernel's state only from IOPub `status` messages, and a kernel sends them when a request starts
and when it ends: a tab that connects while a long cell runs (the cell the server re-ran on a new host, a page
reloaded mid-training) saw neither, and shows the kernel neither busy nor idle (`unknown`) until the cell ends. At
a `resumable` loop's steps, at most every `EVERY_S`, the kernel says `busy` again for the request it is running;
a client already connected gets the state it already shows.
"""

from __future__ import annotations

import time
from typing import Any

EVERY_S = 1.0
_said_at = {"t": 0.0}


def still_busy(kernel: Any = None) -> None:
    """Publish `busy` on IOPub for the running shell request, if the last one is EVERY_S old (cheap otherwise)."""
    now = time.monotonic()
    if now - _said_at["t"] < EVERY_S:
        return
    _said_at["t"] = now
    if kernel is None:
        from IPython import get_ipython

        kernel = getattr(get_ipython(), "kernel", None)
    publish = getattr(kernel, "_publish_status", None)  # what ipykernel sends at a request's start
    if publish is None:
        return  # not in an ipykernel (a terminal IPython, a test's loop)
    try:
        parent = kernel.get_parent("shell")
        if parent and parent.get("header"):
            publish("busy", "shell", parent)
    except Exception:  # noqa: BLE001 - a status message is a courtesy; the user's loop goes on
        pass
