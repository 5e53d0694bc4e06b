"""The messages between server, kernel and widget: request ids echoed by real kernels, malformed ones refused.

A real jupyter_server (pytest-jupyter) with real kernels for the final-snapshot sequence; a real kernel
talked to over its comm for the requests themselves.
"""

from __future__ import annotations

import dataclasses
import secrets
import time
import uuid

import pytest

from spotwarp_jupyter.protocol import (
    COMM_TARGET,
    SERVER_REQUEST,
    KernelRequest,
    NoticeAnswer,
    NoticeRequest,
    ProtocolError,
    RenameRequest,
    read_kernel_answer,
)
from spotwarp_jupyter.server.watchers import Notice

from engines import make_engine
from jupyter_api import execute, open_notebook
from kernels import notice_request

pytest_plugins = ("pytest_jupyter.jupyter_server",)


@pytest.fixture
def jp_server_config(jp_server_config):
    jp_server_config["SpotWarp"]["watchers"] = []
    return jp_server_config


async def test_the_final_snapshot_is_the_one_taken_for_the_notice_even_when_a_user_message_looks_like_it(
        jp_fetch, jp_ws_fetch, jp_serverapp, store_dir, monkeypatch):
    await jp_serverapp.extension_manager.start_all_extensions()
    service = jp_serverapp.web_app.settings["spotwarp"]
    engine = make_engine(store_dir, "api")
    kid, ws = await open_notebook(jp_fetch, jp_ws_fetch, "train.ipynb")
    try:
        # every id the server makes from here on is the same: a user who wrote the id the server will use
        # into a snapshot message (what the final-snapshot sequence once looked for) must not fool it
        await execute(ws, "%load_ext spotwarp\n%spotwarp policy --every 1h --no-after-cell\nstep = 1\n"
                          "%spotwarp snapshot -m 'preemption c0ffee12'")
        (users,) = engine.manifests("train.ipynb")
        await execute(ws, "step = 2")  # after the user's snapshot: only the notice's snapshot has it
        with monkeypatch.context() as patch:
            patch.setattr(secrets, "token_hex", lambda n=16: "c0ffee12"[: 2 * n])
            final = await service.responder(Notice(source="test", kind="test-notice", deadline=time.time() + 30))
        assert final is not None and final.kind == "project"
        assert final.stats["kernels_fresh"] == ["train.ipynb"]
        namespace: dict = {}
        engine.restore_kernel(final.id, namespace, "train.ipynb")
        assert namespace["step"] == 2, f"the final snapshot holds the user's snapshot {users.id}, not a fresh one"
        (taken,) = [m for m in engine.manifests("train.ipynb") if m.requests]
        assert final.kernels["train.ipynb"] == taken.kernels["train.ipynb"] and taken.id != users.id
    finally:
        ws.close()
        await jp_fetch("api", "kernels", kid, method="DELETE")


# -- the requests themselves, to a real kernel ----------------------------------------------------------
def comm_request(kernel, data, timeout: float = 60) -> dict:
    """Open a `spotwarp` comm with `data` (as the server does) and return the kernel's one answer."""
    comm_id = uuid.uuid4().hex
    kernel.kc.shell_channel.send(kernel.kc.session.msg(
        "comm_open", {"comm_id": comm_id, "target_name": COMM_TARGET, "data": data}))
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        msg = kernel.kc.get_iopub_msg(timeout=max(0.1, deadline - time.monotonic()))
        if msg["msg_type"] == "comm_msg" and msg["content"].get("comm_id") == comm_id:
            return msg["content"]["data"]
    raise AssertionError("no answer on the comm")


def test_a_kernel_answers_each_request_with_its_id(start_kernel, store_url):
    k = start_kernel("host")
    k.run("%load_ext spotwarp\n%spotwarp policy --every 1h --no-after-cell\nweights = [1, 2]")
    snap = KernelRequest.snapshot_now("by request")
    answer = read_kernel_answer(comm_request(k, snap.to_message()), snap)
    assert answer["ok"] is True and answer["request_id"] == snap.request_id and answer["request"] == "snapshot"
    assert answer["notebook"] == "default" and answer["id"]
    snapshot_id = answer["id"]
    status = KernelRequest.status_now()
    answer = read_kernel_answer(comm_request(k, status.to_message()), status)
    assert answer["request_id"] == status.request_id and answer["last_snapshot"]["id"] == snapshot_id
    k.run("weights = None")
    restore = KernelRequest.restore_now("latest", ["weights"])
    answer = read_kernel_answer(comm_request(k, restore.to_message()), restore)
    assert answer["ok"] and answer["request_id"] == restore.request_id and answer["restored"] == ["weights"]
    assert k.value("weights") == [1, 2]
    # an answer to another request is not taken for this one's
    other = KernelRequest.status_now()
    with pytest.raises(ProtocolError, match="answered request"):
        read_kernel_answer(comm_request(k, other.to_message()), status)

    notice = NoticeRequest.new(fatal=False)
    answer = NoticeAnswer.from_message(notice_request(k, notice.to_message()), notice)
    assert answer.ok and answer.request_id == notice.request_id and answer.notebook == "default"
    k.run("x = 1")  # the end of a cell is a safe point: the notice's snapshot starts there
    k.run("from spotwarp_jupyter.kernel import session; session.current().wait_in_flight(60)")
    engine = make_engine(store_url)
    (taken,) = [m for m in engine.manifests("default") if notice.request_id in m.requests]
    assert taken.message == "requested: preemption"


@pytest.mark.parametrize("data, error", [
    ({"request": "restore", "request_id": "r1", "variables": "weights"}, "variables must be a list"),
    ({"request": "restore", "snapshot": "latest"}, "request_id must be"),
    ({"request": "snapshot", "request_id": "r2", "message": 5}, "message must be a string"),
    ({"request": "drop", "request_id": "r3"}, "unknown request 'drop'"),
    (["restore"], "must be a JSON object"),
])
def test_a_malformed_request_gets_one_line_and_changes_nothing(start_kernel, store_url, data, error):
    k = start_kernel("host")
    k.run("%load_ext spotwarp\n%spotwarp policy --every 1h --no-after-cell\nweights = [1, 2]\n%spotwarp snapshot")
    engine = make_engine(store_url)
    before = [m.id for m in engine.manifests()]
    k.run("weights = [3]")
    answer = comm_request(k, data)
    assert answer["ok"] is False and error in answer["error"] and "\n" not in answer["error"]
    assert answer["request_id"] == (data.get("request_id") if isinstance(data, dict) else None)
    assert k.value("weights") == [3] and [m.id for m in engine.manifests()] == before


@pytest.mark.parametrize("content, error", [
    ({"fatal": True, "deadline": None}, "request_id must be"),
    ({"request_id": "n1", "fatal": "yes"}, "fatal must be true or false"),
    ({"request_id": "n2", "deadline": "soon"}, "deadline must be a time"),
    ({"request_id": "n3", "fatal": False, "reason": "whatever"}, "reason must be one of"),
])
def test_a_malformed_notice_gets_one_line_and_queues_no_snapshot(start_kernel, store_url, content, error):
    k = start_kernel("host")
    k.run("%load_ext spotwarp\n%spotwarp policy --every 1h --no-after-cell\nweights = [1, 2]\n%spotwarp snapshot")
    engine = make_engine(store_url)
    before = [m.id for m in engine.manifests()]
    answer = notice_request(k, content)
    assert answer["ok"] is False and error in answer["error"] and "\n" not in answer["error"]
    assert answer["request_id"] == content.get("request_id")
    # a queued request would be taken at the end of this cell: none was
    k.run("weights = [3]")
    k.run("from spotwarp_jupyter.kernel import session; session.current().wait_in_flight(60)")
    assert k.value("session.current().in_flight is None") and [m.id for m in engine.manifests()] == before


def test_every_message_reads_back_as_built_and_an_answer_to_another_request_is_refused():
    for request in (KernelRequest.snapshot_now("m"), KernelRequest.status_now(),
                    KernelRequest.restore_now("abc", ["a", "b"]), KernelRequest.restore_now(),
                    dataclasses.replace(KernelRequest.status_now(), notebook="runs/train.ipynb")):
        assert KernelRequest.from_message(request.to_message()) == request
    rename = RenameRequest.new("runs/train.ipynb")
    assert RenameRequest.from_message(rename.to_message()) == rename
    for notice in (NoticeRequest.new(), NoticeRequest.new(fatal=False, reason=SERVER_REQUEST)):
        assert NoticeRequest.from_message(notice.to_message()) == notice
    with pytest.raises(ProtocolError, match="reason"):  # a notice that holds the loop is a preemption
        NoticeRequest.from_message({**NoticeRequest.new().to_message(), "reason": SERVER_REQUEST})
    for bad in ({"request_id": "r"}, {"request_id": "r", "notebook": " "}, {"notebook": "a.ipynb"}):
        with pytest.raises(ProtocolError):
            RenameRequest.from_message(bad)
    with pytest.raises(ProtocolError, match="session's notebook path"):
        KernelRequest.from_message({**KernelRequest.status_now().to_message(), "notebook": 3})
    notice = NoticeRequest.new(fatal=True, deadline=1e9)
    assert NoticeRequest.from_message(notice.to_message()) == notice
    answer = NoticeAnswer(notice.request_id, True, 5.0, "nb.ipynb", in_flight=True)
    assert NoticeAnswer.from_message(answer.to_message(), notice) == answer
    for bad, error in [(None, "must be a JSON object"),
                       ({**answer.to_message(), "request_id": "other"}, "answered notice 'other'"),
                       ({**answer.to_message(), "ok": "yes"}, "ok: true or false"),
                       ({**answer.to_message(), "notebook": None}, "name the kernel's notebook"),
                       ({**answer.to_message(), "requested_at": "now"}, "requested_at")]:
        with pytest.raises(ProtocolError, match=error):
            NoticeAnswer.from_message(bad, notice)
    status = KernelRequest.status_now()
    for bad, error in [([], "must be a JSON object"), ({"request_id": status.request_id}, "ok: true or false"),
                       ({"ok": False, "request_id": status.request_id}, "must say why")]:
        with pytest.raises(ProtocolError, match=error):
            read_kernel_answer(bad, status)
