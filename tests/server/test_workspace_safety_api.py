"""The REST API on a real jupyter_server with workspace names that are not UTF-8 and request bodies built to break it."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from tornado.httpclient import HTTPClientError

from engines import make_engine

pytest_plugins = ("pytest_jupyter.jupyter_server",)

ODD = [b"caf\xe9.csv", b"\xff\xfe-raw.bin"]


@pytest.fixture
def workspace(jp_root_dir: Path) -> Path:
    base = os.fsencode(jp_root_dir)
    for i, name in enumerate(ODD):
        with open(os.path.join(base, name), "wb") as f:
            f.write(b"row %d\n" % i)
    (jp_root_dir / "notes.md").write_text("# notes\n")
    return jp_root_dir


@pytest.fixture
def plain_workspace(jp_root_dir: Path) -> Path:
    (jp_root_dir / "notes.md").write_text("# notes\n")
    return jp_root_dir


async def call(jp_fetch, method, *parts, body=None):
    response = await jp_fetch(*parts, method=method, body="" if method == "POST" and body is None else body)
    return response.code, json.loads(response.body or b"null")


async def fails(jp_fetch, method, *parts, body=None):
    with pytest.raises(HTTPClientError) as info:
        await call(jp_fetch, method, *parts, body=body)
    error = info.value
    return error.code, json.loads(error.response.body) if error.response is not None and error.response.body else {}


def committed(store_dir: Path) -> list[str]:
    folder = store_dir / "api" / "snapshots"
    return sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []


async def test_snapshot_and_restore_of_names_that_are_not_utf8(jp_fetch, workspace, store_dir):
    code, snap = await call(jp_fetch, "POST", "spotwarp", "api", "snapshots", body='{"message": "odd"}')
    assert code == 201 and snap["files"] == 3
    base = os.fsencode(workspace)
    for name in ODD:
        os.unlink(os.path.join(base, name))
    code, restored = await call(jp_fetch, "POST", "spotwarp", "api", "snapshots", snap["id"], "restore")
    assert code == 200 and restored["files_restored"] == 2
    assert sorted(os.listdir(base)) == sorted([*ODD, b"notes.md"])
    for i, name in enumerate(ODD):
        with open(os.path.join(base, name), "rb") as f:
            assert f.read() == b"row %d\n" % i
    assert make_engine(store_dir, "api").verify().ok


@pytest.mark.parametrize("body", [
    '{"message": "\\ud800"}',  # a lone surrogate: valid JSON, not text that can be stored
    '{"message": "ok \\udcff"}',
    '{"message": ' + "[" * 100_000 + "]" * 100_000 + "}",  # nested past the parser's recursion limit
    "[" * 100_000 + "]" * 100_000,
    '{"message": ' + '{"a": ' * 50_000 + "1" + "}" * 50_000 + "}",
])
async def test_bodies_built_to_break_the_parser_are_400(jp_fetch, plain_workspace, store_dir, body):
    code, payload = await fails(jp_fetch, "POST", "spotwarp", "api", "snapshots", body=body)
    assert code == 400 and payload["message"] and "\n" not in payload["message"]
    assert committed(store_dir) == []


async def test_a_deeply_nested_restore_body_is_400(jp_fetch, plain_workspace, store_dir):
    await call(jp_fetch, "POST", "spotwarp", "api", "snapshots")
    code, payload = await fails(jp_fetch, "POST", "spotwarp", "api", "snapshots", "latest", "restore",
                                body="[" * 100_000 + "]" * 100_000)
    assert code == 400 and payload["message"]
