"""Where a resumed cell's outputs go while the server runs it (docs/resume.md, "The design, and why").

JupyterLab shows only the outputs of requests its own tab sent, so a cell the server runs must put its outputs
into the notebook itself. Two places, one interface (`begin`, `apply`, `tick`, `end`):

- `SharedCell`, the real-time path: when jupyter-collaboration's server extension (`jupyter_server_ydoc`) runs in
  this server, the notebook's room is opened (created if no client has it open) and each output goes into the
  cell of its shared document as it comes: a tab open on the notebook, or opened later, shows it live, and the
  room saves the document to the `.ipynb` (forced every `SAVE_EVERY_S` while outputs keep coming, and at the end).
- `NotebookFile`, without collaboration (not installed, or `disable_rtc`): the cell is written into the `.ipynb`
  through the contents manager, at most every `SAVE_EVERY_S` and at the end; a tab shows what was on disk when it
  loaded the notebook.

Everything runs on the event loop without blocking it: the shared document is changed in memory (the room sends
the changes and saves through the async contents manager), the file is read and saved through the contents manager.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any

from jupyter_core.utils import ensure_async

log = logging.getLogger("spotwarp")
SAVE_EVERY_S = 3.0  # the .ipynb on disk is brought up to date at most this often while the cell runs
SAVE_WAIT_S = 30.0  # the longest the cell's outputs wait for one forced save of the room

Change = tuple  # ("clear",) | ("add", output) | ("append", stream name, text)
_warned: set[str] = set()  # the private attributes already reported missing


def private_missing(name: str, package: str, degrades: str) -> None:
    """One warning per server for a private attribute of another package that is not there (docs/resume.md,
    "Private APIs used"): what is missing, the installed version, and what works less well without it."""
    if name in _warned:
        return
    _warned.add(name)
    from importlib.metadata import PackageNotFoundError, version

    try:
        installed = version(package)
    except PackageNotFoundError:
        installed = "?"
    log.warning("SpotWarp resume: %s %s has no %s: %s", package, installed, name, degrades)


class Outputs:
    """A cell's outputs, built from its iopub messages as JupyterLab builds them (streams merged, clear_output
    honoured), with the changes each message made."""

    def __init__(self) -> None:
        self.items: list[dict[str, Any]] = []
        self.execution_count: int | None = None
        self.clear_pending = False

    def take(self, kind: str, msg: dict[str, Any]) -> list[Change]:
        """One iopub message of the cell; the changes it made to the outputs (none for most messages)."""
        from nbformat.v4 import output_from_msg

        content = msg["content"]
        if kind == "execute_input":
            self.execution_count = content.get("execution_count")
            return []
        if kind == "clear_output":
            if content.get("wait"):
                self.clear_pending = True
                return []
            self.items = []
            return [("clear",)]
        if kind not in ("stream", "display_data", "execute_result", "error"):
            return []
        changes: list[Change] = []
        if self.clear_pending:
            self.items, self.clear_pending = [], False
            changes.append(("clear",))
        last = self.items[-1] if self.items else None
        if kind == "stream" and last is not None and last.get("output_type") == "stream" \
                and last.get("name") == content.get("name"):
            last["text"] += content.get("text", "")
            changes.append(("append", content.get("name"), content.get("text", "")))
        else:
            output = json.loads(json.dumps(output_from_msg(msg)))  # plain JSON values
            self.items.append(output)
            changes.append(("add", output))
        return changes


def collaboration(serverapp: Any) -> Any | None:
    """The `jupyter_server_ydoc` extension app when it serves this server's notebooks in real time, else None."""
    manager = getattr(serverapp, "extension_manager", None)
    try:
        apps = manager.extension_apps.get("jupyter_server_ydoc") or () if manager is not None else ()
    except Exception:  # noqa: BLE001 - an extension that failed to load: no real-time path
        return None
    for app in apps:
        if not getattr(app, "disable_rtc", False) and hasattr(app, "ywebsocket_server") \
                and "file_id_manager" in serverapp.web_app.settings:
            return app
    return None


async def open_outputs(serverapp: Any, api_path: str, cell_id: str | None, source: str) -> "SharedCell | NotebookFile":
    """The shared document's cell when collaboration runs here (else, or if its room cannot open, the file)."""
    app = collaboration(serverapp)
    if app is not None and cell_id is not None:
        try:
            shared = SharedCell(app, api_path, cell_id, source)
            await shared.begin()
            return shared
        except Exception as exc:  # noqa: BLE001 - the outputs still reach the file; the log says why not live
            log.warning("SpotWarp resume: %s: the notebook's shared document did not open (%s: %s): outputs go to "
                        "the file only", api_path, type(exc).__name__, exc)
    return NotebookFile(serverapp.contents_manager, api_path, cell_id, source)


class NotebookFile:
    """The cell in the `.ipynb` on disk, read and saved through the contents manager (at most every SAVE_EVERY_S)."""

    live = False

    def __init__(self, contents: Any, api_path: str, cell_id: str | None, source: str):
        self.contents, self.api_path, self.cell_id, self.source = contents, api_path, cell_id, source
        self.dirty = False
        self.saved_at = 0.0

    async def begin(self) -> None:
        """Nothing to do before the first output."""

    async def apply(self, outputs: Outputs, changes: list[Change]) -> None:
        self.dirty = self.dirty or bool(changes)

    async def tick(self, outputs: Outputs) -> None:
        """Write if something changed and the last write is SAVE_EVERY_S old."""
        if self.dirty and time.monotonic() - self.saved_at >= SAVE_EVERY_S:
            await self.write(outputs)

    async def end(self, outputs: Outputs) -> None:
        await self.write(outputs)

    async def write(self, outputs: Outputs) -> None:
        """The cell's outputs, execution count and source into the notebook file as it is on disk now."""
        if self.cell_id is None:
            return
        from nbformat import from_dict
        from nbformat.v4 import new_code_cell

        self.dirty, self.saved_at = False, time.monotonic()
        try:
            model = await ensure_async(self.contents.get(self.api_path, content=True, type="notebook"))
            notebook = model["content"]
            cell = next((c for c in notebook.cells if c.get("id") == self.cell_id), None)
            if cell is None:  # added after the files were backed up: it goes at the end, as restores put run cells
                cell = new_code_cell(self.source, id=self.cell_id)
                notebook.cells.append(cell)
            cell["source"] = self.source
            cell["outputs"] = [from_dict(o) for o in outputs.items]
            cell["execution_count"] = outputs.execution_count
            await ensure_async(self.contents.save({"type": "notebook", "format": "json", "content": notebook},
                                                  self.api_path))
        except Exception as exc:  # noqa: BLE001 - the run goes on; the next write tries again
            log.warning("SpotWarp resume: outputs of %s not written: %s", self.api_path, exc)
            self.dirty = True


class SharedCell:
    """The cell in the notebook's shared document (jupyter-collaboration's room): every change is sent to the
    clients in the room at once; the room saves the document to the `.ipynb`."""

    live = True

    def __init__(self, app: Any, api_path: str, cell_id: str, source: str):
        self.app, self.api_path, self.cell_id, self.source = app, api_path, cell_id, source
        self.room_id = ""
        self.room: Any = None
        self.document: Any = None
        self.unsaved = False
        self.saved_at = 0.0  # the first output is saved at once, as the file path writes it
        self.file: NotebookFile | None = None  # set when the shared document failed: the rest goes to the file

    async def _or_file(self, step: str, outputs: Outputs, *args: Any) -> None:
        """Run `step` on the shared document; if it fails, log one line, leave the room, and from then on write
        to the notebook file (at once, with every output so far) as the path without collaboration does."""
        if self.file is None:
            try:
                await getattr(self, f"_{step}")(outputs, *args)
                return
            except Exception as exc:  # noqa: BLE001 - the outputs still reach the file; the log says why not live
                log.warning("SpotWarp resume: %s: the notebook's shared document failed (%s: %s): the rest of the "
                            "cell's outputs go to the file only", self.api_path, type(exc).__name__, exc)
                self.file = NotebookFile(self.app.serverapp.contents_manager, self.api_path, self.cell_id,
                                         self.source)
                self.file.dirty = True
                self._leave()
        await getattr(self.file, step)(outputs, *args)

    async def _open(self) -> None:
        """Open the notebook's room (created when no client has it open) and hold its document.

        The room is named by the file's id, so it follows the notebook through renames."""
        if not self.room_id:
            from jupyter_server_ydoc.utils import encode_file_path, room_id_from_encoded_path

            # on the loop: the file id manager's SQLite connection may only be used from the thread that opened it
            file_id = self.app.serverapp.web_app.settings["file_id_manager"].index(self.api_path)
            if file_id is None:
                raise FileNotFoundError(self.api_path)
            self.room_id = room_id_from_encoded_path(encode_file_path("json", "notebook", file_id))
        self.document = await self.app.get_document(room_id=self.room_id, copy=False, create=True)
        self.room = self.app.ywebsocket_server.rooms.get(self.room_id)
        if self.document is None or self.room is None:
            raise RuntimeError(f"no room for {self.api_path}")

    async def _held(self, outputs: Outputs) -> bool:
        """Reopen the room if it was cleaned meanwhile (its last client left): it reloads the file, and the cell is
        written again whole, with every output taken so far (True)."""
        if self.app.ywebsocket_server.rooms.get(self.room_id) is self.room:
            return False
        await self._open()
        self._write_cell(outputs.items)
        return True

    def _cell(self) -> Any:
        """The cell's shared map, found by id (cells may have moved); None if a user deleted it."""
        return next((c for c in self.document.ycells if c.get("id") == self.cell_id), None)

    def _write_cell(self, items: list[dict[str, Any]]) -> None:
        """The cell as it runs: the source that runs, these outputs, no count, `running` (`[*]` in every tab)."""
        if self._cell() is None:  # added after the files were backed up: at the end, as restores put run cells
            self.document.append_cell({"cell_type": "code", "id": self.cell_id, "source": self.source,
                                       "metadata": {}, "outputs": [], "execution_count": None})
        index, cell = next((i, c) for i, c in enumerate(self.document.ycells) if c.get("id") == self.cell_id)
        if str(cell["source"]) != self.source:
            self.document.set_cell(index, source=self.source)
        with self.document.ydoc.transaction():
            self._set_outputs(cell, items)
            cell["execution_count"] = None  # JupyterLab sets a count only when the cell ends, then shows it idle
            cell["execution_state"] = "running"
        self.unsaved = True

    @staticmethod
    def _set_outputs(cell: Any, items: list[dict[str, Any]]) -> None:
        from pycrdt import Array

        if not isinstance(cell.get("outputs"), Array):
            cell["outputs"] = Array()
        cell["outputs"].clear()
        cell["outputs"].extend([_shared_output(o) for o in items])

    async def begin(self) -> None:
        """Open the room; the cell shows the source that runs, no outputs, and `[*]` (saved with the first output)."""
        await self._open()
        self._write_cell([])
        self.unsaved = False

    async def apply(self, outputs: Outputs, changes: list[Change]) -> None:
        await self._or_file("apply", outputs, changes)

    async def tick(self, outputs: Outputs) -> None:
        await self._or_file("tick", outputs)

    async def end(self, outputs: Outputs) -> None:
        """The end of the run: the room is always left, whatever failed."""
        try:
            await self._or_file("end", outputs)
        finally:
            if self.file is None:
                self._leave()

    async def _apply(self, outputs: Outputs, changes: list[Change]) -> None:
        """The changes into the shared cell, at once (streams appended to the shared text)."""
        if not changes or await self._held(outputs):
            return
        cell = self._cell()
        if cell is None:
            return
        from pycrdt import Array, Map, Text

        if not isinstance(cell.get("outputs"), Array):
            cell["outputs"] = Array()
        shared = cell["outputs"]
        with self.document.ydoc.transaction():
            for change in changes:
                if change[0] == "clear":
                    shared.clear()
                    continue
                last = shared[len(shared) - 1] if change[0] == "append" and len(shared) else None
                if isinstance(last, Map) and last.get("output_type") == "stream" and last.get("name") == change[1]:
                    text = last.get("text")
                    if isinstance(text, Text):
                        text.insert(len(text), change[2])
                    else:
                        last["text"] = f"{text or ''}{change[2]}"
                elif change[0] == "append":  # a client cleared the outputs meanwhile
                    shared.append(_shared_output({"output_type": "stream", "name": change[1], "text": change[2]}))
                else:
                    shared.append(_shared_output(change[1]))
        self.unsaved = True

    async def _tick(self, outputs: Outputs) -> None:
        """Have the room save now if outputs came since its last save SAVE_EVERY_S ago: its own save waits for a
        second without changes, which a cell printing more often than that never leaves."""
        if self.unsaved and time.monotonic() - self.saved_at >= SAVE_EVERY_S:
            await self._save()

    async def _end(self, outputs: Outputs) -> None:
        """The execution count, `idle`, and a save of the document, waited for."""
        await self._held(outputs)
        cell = self._cell()
        if cell is not None:
            with self.document.ydoc.transaction():
                count = outputs.execution_count
                cell["execution_count"] = float(count) if isinstance(count, int) else None
                cell["execution_state"] = "idle"
        await self._save()

    def _leave(self) -> None:
        """Leave the room as a tab leaving it does: when no tab is in it, it is cleaned after the extension's
        `document_cleanup_delay`, unless a tab joins meanwhile (joining cancels `room.cleaner`)."""
        try:
            delay = getattr(self.app, "document_cleanup_delay", None)
            cleaner = getattr(self.room, "cleaner", None)
            if delay is None or self.room is None or self.room.clients or (cleaner is not None and not cleaner.done()):
                return
            self.room.cleaner = asyncio.ensure_future(self._clean(self.room, delay))
        except Exception as exc:  # noqa: BLE001 - a room left open costs memory and a poll a second, no more
            log.warning("SpotWarp resume: the room of %s was not left: %s", self.api_path, exc)

    async def _clean(self, room: Any, delay: float) -> None:
        from jupyter_server_ydoc.utils import decode_file_path

        await asyncio.sleep(delay)
        locks = getattr(self.app, "_room_locks", None)
        if locks is None:
            private_missing("YDocExtension._room_locks", "jupyter-collaboration",
                            "a room the resume opened and no tab joined stays open until the server stops")
            return
        try:
            async with locks[self.room_id]:  # the lock its handler and get_document take
                server = self.app.ywebsocket_server
                if room.clients or server.rooms.get(self.room_id) is not room:
                    return
                await server.delete_room(room=room)
                file_id = decode_file_path(self.room_id)[2]
                if file_id in self.app.file_loaders and self.app.file_loaders[file_id].number_of_subscriptions == 0:
                    await self.app.file_loaders.remove(file_id)
        except Exception as exc:  # noqa: BLE001 - a room left open costs memory and a poll a second, no more
            log.warning("SpotWarp resume: the room of %s was not cleaned: %s", self.api_path, exc)

    async def _save(self) -> None:
        self.unsaved, self.saved_at = False, time.monotonic()
        save = getattr(self.room, "_save_to_disc", None)  # what a client's Ctrl+S asks the room for
        if not callable(save):
            private_missing("DocumentRoom._save_to_disc", "jupyter-collaboration", "no forced saves while "
                            "outputs keep coming: the .ipynb follows the room's own autosave only")
            return
        task = save()
        if task is None:
            self.unsaved = True  # the room is reloading the file: the next tick asks again
            return
        done, _ = await asyncio.wait([task], timeout=SAVE_WAIT_S)  # the room logs its own save errors
        if not done:  # the outputs go on into the document; the next tick asks for a save again
            log.warning("SpotWarp resume: %s: the room's save did not end within %g s", self.api_path, SAVE_WAIT_S)
            self.unsaved = True


def _shared_output(output: dict[str, Any]) -> Any:
    """One output as the shared document holds it: numbers as floats (Yjs), a stream's text as shared text."""
    from jupyter_ydoc.utils import cast_all
    from pycrdt import Map, Text

    item = cast_all(json.loads(json.dumps(output)), int, float)
    if item.get("output_type") == "stream":
        text = item.get("text", "")
        item["text"] = Text("".join(text) if isinstance(text, list) else text)
    return Map(item)
