"""Talking to a real jupyter_server as JupyterLab does: REST calls checked against api/openapi.yaml,
a notebook session with its kernel's websocket, code run over it (pytest-jupyter's jp_fetch, jp_ws_fetch)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from api_contract import check as check_contract
from lab_server import Execution


async def call(jp_fetch, method, *parts, body=None, **kwargs):
    """One request; every answer of the SpotWarp API is checked against api/openapi.yaml."""
    if method == "POST" and body is None:
        body = ""
    response = await jp_fetch(*parts, method=method, body=body, **kwargs)
    payload = json.loads(response.body or b"null")
    if parts[:2] == ("spotwarp", "api"):
        check_contract(method, parts, response.code, payload)
    return response.code, payload


async def execute(ws, code: str, timeout: float = 120) -> str:
    """Run `code` in the kernel behind a kernel websocket; return its output, raise on error."""
    execution = Execution(code)
    await ws.write_message(execution.request)
    while not execution.done:
        execution.feed(await asyncio.wait_for(ws.read_message(), timeout))
    return execution.output()


async def open_notebook(jp_fetch, jp_ws_fetch, path: str):
    """Start a kernel for a notebook as JupyterLab does (a session), and open its websocket."""
    body = {"path": path, "name": Path(path).name, "type": "notebook", "kernel": {"name": "python3"}}
    code, session = await call(jp_fetch, "POST", "api", "sessions", body=json.dumps(body))
    assert code == 201
    ws = await jp_ws_fetch("api", "kernels", session["kernel"]["id"], "channels")
    return session["kernel"]["id"], ws
