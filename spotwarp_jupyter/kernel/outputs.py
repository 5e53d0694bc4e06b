"""The outputs the running cell has published so far, kept for the snapshots taken while it runs.

A notebook file on disk holds a cell's outputs only as JupyterLab last saved them, and a running cell's not at
all: after a loss, the interrupted cell's output up to the snapshot would be gone. Each kernel snapshot's record
carries them (`running.outputs`, nbformat 4 outputs), and a restore puts them into that cell
(service/run_cells.py); a resumed cell's outputs follow them (server/resume.py). The kernel's own publishers
hand every message to hooks before sending it (ipykernel's `register_hook`); streams are published from the IO
thread, displays from the cell's. Bounded: past `LIMIT_CHARS`, the oldest text and displays are dropped.
"""

from __future__ import annotations

import copy
import sys
import threading
from typing import Any

LIMIT_CHARS = 256 * 1024


class CellOutputs:
    """The outputs published for one execute request, merged as JupyterLab merges them."""

    def __init__(self, limit: int = LIMIT_CHARS):
        self.limit = limit
        self._lock = threading.Lock()
        self._request: str | None = None
        self._items: list[dict[str, Any]] = []
        self._size = 0
        self._clear_pending = False

    def start(self, request_id: str | None, earlier: list[dict[str, Any]] | None = None) -> None:
        """A cell starts (the msg_id of its execute request): nothing published yet, or, for a cell a new host runs
        again from a snapshot, the outputs it had published up to that snapshot (`earlier`)."""
        with self._lock:
            self._request, self._items, self._clear_pending = request_id, copy.deepcopy(earlier or []), False
            self._size = sum(len(o["text"]) if o.get("output_type") == "stream" else len(str(o)) for o in self._items)

    def items(self) -> list[dict[str, Any]]:
        """A copy of the outputs so far."""
        with self._lock:
            return copy.deepcopy(self._items)

    def hook(self, msg: dict[str, Any]) -> dict[str, Any]:
        """An ipykernel publisher hook: note the message if it is the running cell's, and send it on unchanged."""
        try:
            if self._request is not None and msg.get("parent_header", {}).get("msg_id") == self._request:
                self._take(msg.get("msg_type") or msg.get("header", {}).get("msg_type"), msg.get("content") or {})
        except Exception:  # noqa: BLE001 - a hook must never stop the cell's output
            pass
        return msg

    def _take(self, kind: str, content: dict[str, Any]) -> None:
        with self._lock:
            if kind == "clear_output":
                if content.get("wait"):
                    self._clear_pending = True
                else:
                    self._items, self._size = [], 0
                return
            if kind not in ("stream", "display_data", "execute_result", "error"):
                return
            if self._clear_pending:
                self._items, self._size, self._clear_pending = [], 0, False
            last = self._items[-1] if self._items else None
            if kind == "stream":
                text = str(content.get("text", ""))
                if last is not None and last["output_type"] == "stream" and last["name"] == content.get("name"):
                    last["text"] += text
                else:
                    self._items.append({"output_type": "stream", "name": content.get("name", "stdout"), "text": text})
                self._size += len(text)
            else:
                output = {"output_type": kind, "data": content.get("data", {}), "metadata": content.get("metadata", {})}
                if kind == "execute_result":
                    output["execution_count"] = content.get("execution_count")
                elif kind == "error":
                    output = {"output_type": "error", "ename": content.get("ename", ""),
                              "evalue": content.get("evalue", ""), "traceback": content.get("traceback", [])}
                self._items.append(output)
                self._size += len(str(output))
            self._trim()

    def _trim(self) -> None:
        """Past the limit: the oldest outputs go, then the oldest text of the first stream left."""
        while self._size > self.limit and self._items:
            first = self._items[0]
            if first["output_type"] == "stream" and len(self._items) == 1:
                excess = self._size - self.limit
                first["text"] = first["text"][excess:]
                self._size -= excess
                return
            self._items.pop(0)
            self._size -= len(first["text"]) if first["output_type"] == "stream" else len(str(first))


def install(ipython: Any, outputs: CellOutputs) -> None:
    """Hook `outputs` into the kernel's publishers: displays (the cell's thread) and streams (the IO thread)."""
    _hooks(ipython, outputs, "register_hook")


def uninstall(ipython: Any, outputs: CellOutputs) -> None:
    """Take the hooks out again."""
    _hooks(ipython, outputs, "unregister_hook")


def _hooks(ipython: Any, outputs: CellOutputs, method: str) -> None:
    """Call `method` (register_hook or unregister_hook) with the hook on the display publisher and, from their IO
    thread, on the output streams."""
    publisher = getattr(ipython, "display_pub", None)
    if hasattr(publisher, method):
        getattr(publisher, method)(outputs.hook)
    for stream in (sys.stdout, sys.stderr):
        pub_thread = getattr(stream, "pub_thread", None)
        if hasattr(stream, method) and hasattr(pub_thread, "schedule"):
            pub_thread.schedule(lambda stream=stream: getattr(stream, method)(outputs.hook))
