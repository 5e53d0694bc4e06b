"""A notebook renamed or moved in JupyterLab (the session's path changes) keeps its snapshots: its kernel learns
the new name from the server, and finds what it saved under the old one, here and on the next host."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

from engines import make_engine
from jupyter_api import call, execute, open_notebook
from kernels import SESSION

pytest_plugins = ("pytest_jupyter.jupyter_server",)


async def _wait_for(condition, timeout: float = 60.0, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = await condition()
        if value:
            return value
        await asyncio.sleep(0.1)  # poll interval of a deadline-bounded wait
    raise AssertionError(f"{what} not met within {timeout} s")


async def _rename(jp_fetch, old: str, new: str) -> None:
    """What JupyterLab does on a rename: the file through the contents API, then the session's path."""
    await jp_fetch("api", "contents", *old.split("/"), method="PATCH", body=json.dumps({"path": new}))
    code, sessions = await call(jp_fetch, "GET", "api", "sessions")
    (session,) = [s for s in sessions if s["path"] == old]
    await jp_fetch("api", "sessions", session["id"], method="PATCH",
                   body=json.dumps({"path": new, "name": Path(new).name}))


async def test_a_renamed_notebooks_kernel_takes_the_new_name_and_keeps_its_snapshots(
        jp_fetch, jp_ws_fetch, jp_root_dir, store_dir):
    (jp_root_dir / "Untitled.ipynb").write_text(json.dumps({"cells": [], "metadata": {}, "nbformat": 4,
                                                            "nbformat_minor": 5}))
    (jp_root_dir / "runs").mkdir()
    kid, ws = await open_notebook(jp_fetch, jp_ws_fetch, "Untitled.ipynb")
    try:
        await execute(ws, "%load_ext spotwarp\n%spotwarp off\nsetup = [1, 2, 3]\n%spotwarp snapshot")
        await _rename(jp_fetch, "Untitled.ipynb", "train.ipynb")

        async def renamed():
            return "'train.ipynb'" in await execute(ws, SESSION + "print(repr(s.notebook))")
        await _wait_for(renamed, what="the kernel learning its new name")
        listed = await execute(ws, "%spotwarp list")
        assert "formerly 'Untitled.ipynb'" in listed and "No snapshots" not in listed, listed

        # moved into a folder while training runs: the control channel reaches a busy kernel
        running = asyncio.ensure_future(execute(ws, SESSION + (
            "import time, pathlib\npathlib.Path('started').touch()\nend = time.monotonic() + 60\n"
            "while s.notebook == 'train.ipynb' and time.monotonic() < end:\n    time.sleep(0.02)\n"
            "print('in the cell:', s.notebook)")))

        async def started():
            return (jp_root_dir / "started").exists()
        await _wait_for(started, what="the cell starting")  # the rename must reach a busy kernel
        await _rename(jp_fetch, "train.ipynb", "runs/train.ipynb")
        assert "in the cell: runs/train.ipynb" in await running
        await execute(ws, "epoch = 4\n%spotwarp snapshot")
    finally:
        ws.close()
        await jp_fetch("api", "kernels", kid, method="DELETE")

    # the next host: a kernel of runs/train.ipynb finds both snapshots, and `latest` is the newest
    engine = make_engine(store_dir, "api")
    newest = engine.manifests()[0]
    assert sorted(newest.kernels["runs/train.ipynb"]["aliases"]) == ["Untitled.ipynb", "train.ipynb"]
    kid, ws = await open_notebook(jp_fetch, jp_ws_fetch, "runs/train.ipynb")
    try:
        listed = await execute(ws, "%load_ext spotwarp\n%spotwarp off\n%spotwarp list")
        assert listed.count("\n") >= 3 and "formerly" in listed, listed
        await execute(ws, "%spotwarp restore latest")
        assert (await execute(ws, "print(setup, epoch)")).strip() == "[1, 2, 3] 4"
    finally:
        ws.close()
        await jp_fetch("api", "kernels", kid, method="DELETE")


async def test_a_kernel_renamed_before_it_loaded_spotwarp_knows_its_new_name_at_load(
        jp_fetch, jp_ws_fetch, jp_root_dir, store_dir):
    """JupyterLab asks for a name at the first save, usually before `%load_ext spotwarp`: nothing in the kernel
    hears that rename, and the kernel's `JPY_SESSION_NAME` still says Untitled.ipynb."""
    (jp_root_dir / "Untitled.ipynb").write_text(json.dumps({"cells": [], "metadata": {}, "nbformat": 4,
                                                            "nbformat_minor": 5}))
    kid, ws = await open_notebook(jp_fetch, jp_ws_fetch, "Untitled.ipynb")
    try:
        await _rename(jp_fetch, "Untitled.ipynb", "train.ipynb")  # nobody in the kernel to hear it yet
        # at load, before the server asks the kernel anything: nothing it saved under Untitled.ipynb, no alias
        loaded = await execute(ws, "%load_ext spotwarp\n%spotwarp off\nsetup = 1\n" + SESSION
                               + "print(repr(s.notebook), s.aliases)")
        assert "'train.ipynb' []" in loaded, loaded
        code, snap = await call(jp_fetch, "POST", "spotwarp", "api", "snapshots", body='{"message": "m"}')
        assert code == 201 and snap["notebooks"] == ["train.ipynb"], snap
    finally:
        ws.close()
        await jp_fetch("api", "kernels", kid, method="DELETE")


async def test_a_saved_notebook_keeps_the_status_widget_as_text_and_other_widgets_as_they_are(jp_fetch, jp_root_dir):
    """Reopened (a restored notebook, a new kernel), a saved widget view has no model: "model not found"."""
    from spotwarp_jupyter.protocol import WIDGET_TEXT, WIDGET_VIEW_MIME

    def output(text, model_id):
        return {"output_type": "display_data", "metadata": {},
                "data": {"text/plain": text, WIDGET_VIEW_MIME: {"version_major": 2, "version_minor": 0,
                                                                 "model_id": model_id}}}
    notebook = {"cells": [{"cell_type": "code", "execution_count": 1, "id": "c1", "metadata": {},
                           "source": "%load_ext spotwarp",
                           "outputs": [output(WIDGET_TEXT, "m1"), output("IntSlider(value=3)", "m2")]}],
                "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    await jp_fetch("api", "contents", "saved.ipynb", method="PUT",
                   body=json.dumps({"type": "notebook", "format": "json", "content": notebook}))
    saved = json.loads((jp_root_dir / "saved.ipynb").read_text())
    ours, other = saved["cells"][0]["outputs"]
    assert WIDGET_VIEW_MIME not in ours["data"] and "".join(ours["data"]["text/plain"]) == WIDGET_TEXT
    assert other["data"][WIDGET_VIEW_MIME]["model_id"] == "m2"


def test_the_notebook_record_is_replaced_whole_and_records_of_gone_kernels_are_removed(tmp_path):
    from spotwarp_jupyter.protocol import notebook_record_path, read_notebook_record
    from spotwarp_jupyter.server.renames import record_notebook

    live, gone = tmp_path / "kernel-live.json", tmp_path / "kernel-gone.json"
    live.write_text("{}")
    gone.write_text("{}")
    record_notebook(str(gone), "old.ipynb")
    record_notebook(str(live), "train.ipynb")
    record_notebook(str(live), "runs/train.ipynb")
    assert read_notebook_record(json.loads(Path(notebook_record_path(str(live))).read_text())) == "runs/train.ipynb"
    gone.unlink()  # jupyter_client removes a kernel's connection file when it shuts down
    record_notebook(str(live), "train.ipynb")
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "kernel-live.json", "spotwarp-notebook-of-kernel-live.json"]  # no temporary left, the gone kernel's removed
    for bad in ({}, {"notebook": ""}, {"notebook": 3}, [], {"notebook": "a\0b"}):
        assert read_notebook_record(bad) is None


async def test_a_rename_in_a_kernel_without_spotwarp_logs_no_error(jp_fetch, jp_ws_fetch, jp_root_dir, caplog, capfd):
    """Only kernels with SpotWarp loaded handle its control requests; any other logs an ERROR line for one."""
    import logging

    caplog.set_level(logging.DEBUG, logger="spotwarp")
    (jp_root_dir / "Untitled.ipynb").write_text(json.dumps({"cells": [], "metadata": {}, "nbformat": 4,
                                                            "nbformat_minor": 5}))
    kid, ws = await open_notebook(jp_fetch, jp_ws_fetch, "Untitled.ipynb")
    try:
        assert (await execute(ws, "print('plain')")).strip() == "plain"
        await _rename(jp_fetch, "Untitled.ipynb", "plain.ipynb")

        async def handled():  # the server is done with the rename: told the kernel, or left it the record
            return any(kid in r.getMessage() and "plain.ipynb" in r.getMessage() for r in caplog.records)
        await _wait_for(handled, what="the server handling the rename")
        assert (await execute(ws, "print('still plain')")).strip() == "still plain"
    finally:
        ws.close()
        await jp_fetch("api", "kernels", kid, method="DELETE")
    logged = capfd.readouterr()
    assert "spotwarp_rename_request" not in logged.err + logged.out


async def test_a_notice_to_a_kernel_without_spotwarp_logs_no_error(jp_fetch, jp_ws_fetch, jp_root_dir, jp_serverapp,
                                                                     capfd):
    """A preemption notice asks only kernels with SpotWarp loaded to snapshot; any other would log an ERROR line
    for the control message it does not know."""
    from spotwarp_jupyter.protocol import NoticeRequest
    from spotwarp_jupyter.server.kernel_link import request_safe_point_snapshot

    (jp_root_dir / "plain.ipynb").write_text(json.dumps({"cells": [], "metadata": {}, "nbformat": 4,
                                                         "nbformat_minor": 5}))
    kid, ws = await open_notebook(jp_fetch, jp_ws_fetch, "plain.ipynb")
    try:
        assert (await execute(ws, "print('plain')")).strip() == "plain"
        answer = await request_safe_point_snapshot(jp_serverapp.kernel_manager, kid, 5.0, NoticeRequest.new())
        assert answer == "SpotWarp is not loaded in this kernel"
        assert (await execute(ws, "print('still plain')")).strip() == "still plain"  # the kernel served on
    finally:
        ws.close()
        await jp_fetch("api", "kernels", kid, method="DELETE")
    logged = capfd.readouterr()
    assert "spotwarp_notice_request" not in logged.err + logged.out


async def test_a_folder_listed_while_a_notebook_in_it_is_renamed_is_listed(jp_fetch, jp_root_dir):
    """JupyterLab's first save renames Untitled.ipynb while its file browser lists the folder: an entry that
    vanishes between the listing's stat and its model must not turn the folder into a 404 ("Directory not
    found"), nor must SpotWarp's own atomic replacements of files in the workspace."""
    import threading

    from tornado.httpclient import HTTPClientError

    for i in range(40):  # a folder of some size, as a workspace is: each listing stats every entry
        (jp_root_dir / f"data-{i:02}.txt").write_text("x")
    names = [jp_root_dir / "Untitled.ipynb", jp_root_dir / "named.ipynb"]
    names[0].write_text(json.dumps({"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    stop = threading.Event()

    def rename_back_and_forth() -> None:
        i = 0
        while not stop.is_set():
            names[i % 2].rename(names[(i + 1) % 2])
            i += 1

    renamer = threading.Thread(target=rename_back_and_forth, daemon=True)
    renamer.start()
    failures = []
    try:
        for _ in range(300):
            try:
                response = await jp_fetch("api", "contents", params={"content": "1"}, method="GET")
            except HTTPClientError as exc:
                failures.append(exc.code)
                continue
            listed = {e["name"] for e in json.loads(response.body)["content"]}
            assert {f"data-{i:02}.txt" for i in range(40)} <= listed
    finally:
        stop.set()
        renamer.join()
    assert failures == []
