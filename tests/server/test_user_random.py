"""Nothing SpotWarp does, and no tab connecting to a kernel with SpotWarp loaded, moves the notebook's `random`.

IPython draws its banner tip from the global `random` at every `kernel_info_request`; a server that asked one
whenever it talks to a kernel, or a tab that connects, would change every draw of a notebook seeded once."""

from __future__ import annotations

import ast
import asyncio
import json
import random
import uuid

import pytest

from jupyter_api import call, execute, open_notebook
from server_config import spotwarp_server_config

pytest_plugins = ("pytest_jupyter.jupyter_server",)
STEPS = 40
COUNT_KERNEL_INFO = """
kernel_infos = []
_kernel = get_ipython().kernel
_answer_kernel_info = _kernel.shell_handlers["kernel_info_request"]
def _counted(*args):
    kernel_infos.append(1)
    return _answer_kernel_info(*args)
_kernel.shell_handlers["kernel_info_request"] = _counted
"""


@pytest.fixture
def jp_server_config(store_dir, monkeypatch):
    """The server backs the workspace up every second, as a busy session's server does."""
    config = spotwarp_server_config(store_dir, monkeypatch)
    config["SpotWarp"]["backup_interval"] = 1
    return config


async def _kernel_info(ws) -> None:
    """What JupyterLab sends on each connection to a kernel: a `kernel_info_request`; returns on its reply."""
    msg_id = uuid.uuid4().hex
    await ws.write_message(json.dumps({
        "header": {"msg_id": msg_id, "msg_type": "kernel_info_request", "username": "test",
                   "session": uuid.uuid4().hex, "version": "5.3", "date": ""},
        "parent_header": {}, "metadata": {}, "channel": "shell", "buffers": [], "content": {}}))
    while True:
        msg = json.loads(await asyncio.wait_for(ws.read_message(), 60))
        if msg.get("parent_header", {}).get("msg_id") == msg_id and msg["msg_type"] == "kernel_info_reply":
            return


async def test_a_notebooks_random_draws_are_those_of_a_run_without_spotwarp(jp_fetch, jp_ws_fetch, jp_root_dir):
    (jp_root_dir / "train.ipynb").write_text(json.dumps({"cells": [], "metadata": {}, "nbformat": 4,
                                                         "nbformat_minor": 5}))
    kid, ws = await open_notebook(jp_fetch, jp_ws_fetch, "train.ipynb")
    tabs = []
    try:
        await execute(ws, "%load_ext spotwarp\n%spotwarp policy --every 1s\n" + COUNT_KERNEL_INFO)
        code, _ = await call(jp_fetch, "POST", "spotwarp", "api", "snapshots", body='{"message": "m"}')
        assert code == 201
        assert (await execute(ws, "print(len(kernel_infos))")).strip() == "0"  # the server asks over the comm only
        await execute(ws, "import random\nrandom.seed(0)\nlosses = []")
        for _ in range(3):
            await execute(ws, f"for step in range({STEPS}):\n    losses.append(random.random())")
            # between two cells, as while a notebook trains: the panel's snapshot (the server asks the kernel over
            # its comm) and another tab opening the notebook
            code, _ = await call(jp_fetch, "POST", "spotwarp", "api", "snapshots", body='{"message": "m"}')
            assert code == 201
            tabs.append(await jp_ws_fetch("api", "kernels", kid, "channels"))
            await _kernel_info(tabs[-1])
        losses = ast.literal_eval((await execute(ws, "print(repr(losses))")).strip())
    finally:
        for tab in (ws, *tabs):
            tab.close()
        await jp_fetch("api", "kernels", kid, method="DELETE")
    undisturbed = random.Random(0)  # the same draws in a process nothing else talks to
    assert losses == [undisturbed.random() for _ in range(3 * STEPS)]
