"""The real-time path of a resumed cell (docs/resume.md): in a real jupyter_server running jupyter-collaboration's
extension, the cell the server runs (a real kernel) writes into the notebook's shared document as outputs come:
the running state, streams merged into one shared text, `clear_output(wait=True)` honoured, an error, the count at
the end; the room saves it to the file; a room cleaned meanwhile (its last tab left) is opened again, and one no
tab is in is cleaned after the cell; a shared document that fails mid-run hands the outputs to the file."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from types import SimpleNamespace  # the service a Resumer records itself on: unused by CellRun
from typing import Any, AsyncIterator

import pytest

from spotwarp_jupyter.server.resume import CellRun, Plan, Resumer

pytest_plugins = ("pytest_jupyter.jupyter_server",)

SOURCE = """import os, sys, time
from IPython.display import clear_output, display
print('gone', flush=True)
clear_output(wait=True)
print('first', flush=True)
deadline = time.monotonic() + 60
while not os.path.exists('go') and time.monotonic() < deadline:
    time.sleep(0.02)
print('second', flush=True)
print('to stderr', file=sys.stderr, flush=True)
display({'text/plain': 'a display'}, raw=True)
1 / 0
"""


@pytest.fixture
def jp_server_config(jp_root_dir):
    return {
        "ServerApp": {"jpserver_extensions": {"jupyter_server_ydoc": True, "jupyter_server_fileid": True},
                      "allow_root": True},
        "SQLiteYStore": {"db_path": str(jp_root_dir / ".ystore.db")},
        "BaseFileIdManager": {"root_dir": str(jp_root_dir), "db_path": str(jp_root_dir / ".fileid.db")},
        "YDocExtension": {"document_cleanup_delay": 1},
    }


async def _until(condition, what: str, timeout: float = 60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        await asyncio.sleep(0.05)  # poll interval of a deadline-bounded wait
    raise AssertionError(f"timed out waiting for {what}")


def _texts(cell: dict) -> list[tuple[str, str]]:
    return [(o["output_type"], o.get("name") or o.get("ename") or "") + ("".join(o.get("text", "")),)
            for o in cell["outputs"]]


def _notebook(jp_root_dir) -> None:
    notebook = {"cells": [{"cell_type": "code", "id": "loop", "metadata": {}, "outputs": [], "execution_count": 3,
                           "source": "an older draft"}],
                "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3"}},
                "nbformat": 4, "nbformat_minor": 5}
    (jp_root_dir / "train.ipynb").write_text(json.dumps(notebook))


@contextlib.asynccontextmanager
async def _resumed_cell(jp_serverapp, jp_root_dir) -> AsyncIterator[tuple[asyncio.Future, Any]]:
    """SOURCE run by a real kernel as the resumed cell `loop` of train.ipynb: the run (a task) and
    jupyter-collaboration's extension app; the kernel is shut down on leaving."""
    _notebook(jp_root_dir)
    kernels = jp_serverapp.kernel_manager
    kernel_id = await kernels.start_kernel(kernel_name="python3", path="")
    client = kernels.get_kernel(kernel_id).client()
    client.start_channels(shell=True, iopub=True, stdin=False, hb=False, control=False)
    try:
        await client.wait_for_ready(timeout=60)
        run = CellRun(Resumer(SimpleNamespace(), jp_serverapp), client, kernel_id,
                      Plan("train.ipynb", api_path="train.ipynb"), {"id": "loop", "source": SOURCE})
        running = asyncio.ensure_future(run.run())
        yield running, next(iter(jp_serverapp.extension_manager.extension_apps["jupyter_server_ydoc"]))
    finally:
        client.stop_channels()
        await kernels.shutdown_kernel(kernel_id, now=True)


EXPECTED = [("stream", "stdout", "first\nsecond\n"), ("stream", "stderr", "to stderr\n"),
            ("display_data", "", ""), ("error", "ZeroDivisionError", "")]


async def test_the_resumed_cells_outputs_go_live_into_the_shared_document(jp_serverapp, jp_root_dir):
    async with _resumed_cell(jp_serverapp, jp_root_dir) as (running, ydoc_app):
        document = await _until(lambda: ydoc_app.ywebsocket_server.rooms and next(
            iter(ydoc_app.ywebsocket_server.rooms.values()))._document, "the notebook's room")

        def shared() -> dict:
            cell = next((c for c in document.ycells if c.get("id") == "loop"), None)
            return {} if cell is None else {**document.get()["cells"][0], "execution_state": cell.get("execution_state")}

        # while the cell runs: what ran, `running`, no count yet, the output so far (the cleared one gone once the
        # next output came: 'gone' may be seen alone first, as a tab would see it)
        now = await _until(lambda: "first" in str(shared().get("outputs")) and shared(),
                           "the output after the clear in the shared document")
        assert now["source"] == SOURCE and now["execution_state"] == "running" and now["execution_count"] is None
        assert _texts(now) == [("stream", "stdout", "first\n")]
        # the last tab left a minute ago: the room is cleaned; the next output opens it again
        await ydoc_app.ywebsocket_server.delete_room(name=next(iter(ydoc_app.ywebsocket_server.rooms)))
        (jp_root_dir / "go").touch()
        assert await asyncio.wait_for(running, 60) == "ZeroDivisionError: division by zero"

    # no tab is in the room: it is cleaned once the cell ended, as when its last tab leaves
    await _until(lambda: not ydoc_app.ywebsocket_server.rooms, "the room to be cleaned", timeout=30)
    document = await ydoc_app.get_document(path="train.ipynb", content_type="notebook", file_format="json",
                                           copy=False, create=True)  # opened again, from the file
    cell = document.get()["cells"][0]
    assert _texts(cell) == EXPECTED and cell["execution_count"] == 1
    assert next(c for c in document.ycells if c.get("id") == "loop")["execution_state"] == "idle"
    on_disk = json.loads((jp_root_dir / "train.ipynb").read_text())["cells"][0]  # the room saved it at the end
    assert _texts(on_disk) == EXPECTED and "".join(on_disk["source"]) == SOURCE and on_disk["execution_count"] == 1


async def _run_breaking_the_room(jp_serverapp, jp_root_dir, attribute: str, value) -> tuple[str, object]:
    """Run SOURCE as a resumed cell; once its first output is in the shared document, set the room's `attribute`
    to `value` (jupyter-collaboration's object, not ours); the run's status and the extension app."""
    async with _resumed_cell(jp_serverapp, jp_root_dir) as (running, ydoc_app):
        room = await _until(lambda: ydoc_app.ywebsocket_server.rooms and next(
            iter(ydoc_app.ywebsocket_server.rooms.values())), "the notebook's room")
        await _until(lambda: room._document and "first" in str(room._document.get()["cells"]),
                     "the output after the clear in the shared document")
        setattr(room, attribute, value)
        (jp_root_dir / "go").touch()
        return await asyncio.wait_for(running, 60), ydoc_app


async def test_a_shared_document_failing_mid_run_hands_the_outputs_to_the_file(jp_serverapp, jp_root_dir):
    def disk_full():
        raise OSError("no space left on device")

    status, ydoc_app = await _run_breaking_the_room(jp_serverapp, jp_root_dir, "_save_to_disc", disk_full)
    assert status == "ZeroDivisionError: division by zero"
    on_disk = json.loads((jp_root_dir / "train.ipynb").read_text())["cells"][0]  # written through the contents
    assert _texts(on_disk) == EXPECTED and "".join(on_disk["source"]) == SOURCE and on_disk["execution_count"] == 1
    await _until(lambda: not ydoc_app.ywebsocket_server.rooms, "the room to be left and cleaned", timeout=30)


async def test_a_missing_private_save_is_said_once_and_the_run_goes_on(jp_serverapp, jp_root_dir, caplog):
    status, _ = await _run_breaking_the_room(jp_serverapp, jp_root_dir, "_save_to_disc", None)
    assert status == "ZeroDivisionError: division by zero"  # saves asked at the next output and at the end
    said = [r.getMessage() for r in caplog.records if "_save_to_disc" in r.getMessage()]
    assert len(said) == 1 and "jupyter-collaboration 5." in said[0] and "autosave" in said[0], said
