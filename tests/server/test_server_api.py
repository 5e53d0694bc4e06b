"""The REST API under `{base_url}spotwarp/api/` on a real jupyter_server (pytest-jupyter, base URL `/a%40b/`)."""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path

import pytest
from tornado.httpclient import HTTPClientError

from spotwarp_jupyter import __version__

from api_contract import check as check_contract
from engines import make_engine
from jupyter_api import call, execute, open_notebook
from lab_server import Execution

pytest_plugins = ("pytest_jupyter.jupyter_server",)

ENDPOINTS = [
    ("GET", ("spotwarp", "api", "status")),
    ("GET", ("spotwarp", "api", "snapshots")),
    ("POST", ("spotwarp", "api", "snapshots")),
    ("POST", ("spotwarp", "api", "snapshots", "latest", "restore")),
    ("POST", ("spotwarp", "api", "resume", "run")),
]


@pytest.fixture
def workspace(jp_root_dir: Path) -> Path:
    (jp_root_dir / "data").mkdir()
    (jp_root_dir / "data" / "values.csv").write_text("x,y\n1,2\n")
    (jp_root_dir / "notes.md").write_text("# notes\n")
    return jp_root_dir


async def fails(jp_fetch, method, *parts, body=None, **kwargs):
    with pytest.raises(HTTPClientError) as info:
        await call(jp_fetch, method, *parts, body=body, **kwargs)
    error = info.value
    payload = json.loads(error.response.body) if error.response is not None and error.response.body else {}
    if parts[:2] == ("spotwarp", "api") and error.code != 403:  # 403 comes from jupyter_server's auth layer
        check_contract(method, parts, error.code, payload)
    return error.code, payload


async def test_every_endpoint_needs_authentication(jp_fetch, workspace, jp_base_url):
    assert jp_base_url != "/"
    for method, parts in ENDPOINTS:
        code, _ = await fails(jp_fetch, method, *parts, headers={"Authorization": "token wrong"})
        assert code == 403, (method, parts)
        code, _ = await fails(jp_fetch, method, *parts, headers={"Authorization": ""})
        assert code == 403, (method, parts)


async def test_status_of_a_new_project(jp_fetch, workspace, store_dir):
    code, status = await call(jp_fetch, "GET", "spotwarp", "api", "status")
    assert code == 200
    assert status["version"] == __version__ and status["project"] == "api"
    assert status["storage"] == str(store_dir) and status["workspace"] == str(workspace.resolve())
    assert status["last_snapshot"] is None and status["kernels"] == [] and status["watchers"] == []
    code, listing = await call(jp_fetch, "GET", "spotwarp", "api", "snapshots")
    assert (code, listing) == (200, {"snapshots": []})


async def test_snapshot_list_and_restore_files(jp_fetch, workspace, store_dir):
    code, first = await call(jp_fetch, "POST", "spotwarp", "api", "snapshots", body=json.dumps({"message": "one"}))
    assert code == 201 and first["kind"] == "project" and first["message"] == "one" and first["files"] == 2
    (workspace / "notes.md").write_text("# changed\n")
    code, second = await call(jp_fetch, "POST", "spotwarp", "api", "snapshots")  # no body at all
    assert code == 201 and second["id"] != first["id"] and second["parent"] == first["id"]
    code, listing = await call(jp_fetch, "GET", "spotwarp", "api", "snapshots")
    assert [s["id"] for s in listing["snapshots"]] == [second["id"], first["id"]]
    code, status = await call(jp_fetch, "GET", "spotwarp", "api", "status")
    assert status["last_snapshot"]["id"] == second["id"] and status["last_snapshot"]["age_s"] >= 0

    (workspace / "data" / "values.csv").unlink()
    code, restored = await call(jp_fetch, "POST", "spotwarp", "api", "snapshots", first["id"], "restore")
    assert code == 200 and restored["id"] == first["id"] and restored["kernels"] == []
    assert restored["files_restored"] == 2
    assert (workspace / "notes.md").read_text() == "# notes\n"
    assert (workspace / "data" / "values.csv").read_text() == "x,y\n1,2\n"
    code, latest = await call(jp_fetch, "POST", "spotwarp", "api", "snapshots", "latest", "restore")
    assert code == 200 and latest["id"] == second["id"] and (workspace / "notes.md").read_text() == "# changed\n"
    # the snapshot the API committed verifies like any other
    assert make_engine(store_dir, "api").verify().ok


@pytest.mark.parametrize("body", ["{not json", "[1, 2]", '"text"', '{"message": 5}', '{"message": "x", "force": true}',
                                  json.dumps({"message": "m" * 1001})])
async def test_bad_snapshot_bodies_are_400(jp_fetch, workspace, store_dir, body):
    code, payload = await fails(jp_fetch, "POST", "spotwarp", "api", "snapshots", body=body)
    assert code == 400 and payload["message"]
    assert not (store_dir / "api" / "snapshots").exists() or not list((store_dir / "api" / "snapshots").iterdir())


async def test_bad_ids_are_404_and_a_restore_body_is_400(jp_fetch, workspace):
    code, payload = await fails(jp_fetch, "POST", "spotwarp", "api", "snapshots", "latest", "restore")
    assert code == 404 and "no snapshot" in payload["message"]
    await call(jp_fetch, "POST", "spotwarp", "api", "snapshots")
    for bad in ("nope2345", "x" * 80, "a.b", "%2E%2E"):
        code, payload = await fails(jp_fetch, "POST", "spotwarp", "api", "snapshots", bad, "restore")
        assert code == 404 and payload["message"], bad
    code, payload = await fails(jp_fetch, "POST", "spotwarp", "api", "snapshots", "latest", "restore",
                                body='{"files": false}')
    assert code == 400


@pytest.mark.parametrize("body, code, words", [
    ('{"notebook": "train.ipynb"}', 404, "train.ipynb: not resumed on this host"),
    ("", 400, "notebook must be the notebook's path"), ('{"notebook": 3}', 400, "notebook must be"),
    ('{"notebook": "a.ipynb", "cell": "c1"}', 400, "unknown field(s) cell"), ("[1]", 400, "must be a JSON object")])
async def test_running_an_interrupted_cell_on_a_host_that_resumed_nothing_is_refused(jp_fetch, workspace, body, code,
                                                                                    words):
    """The answers are checked against api/openapi.yaml (`fails`); a host that resumed something: e2e tests."""
    got, payload = await fails(jp_fetch, "POST", "spotwarp", "api", "resume", "run", body=body)
    assert got == code and words in payload["message"] and "\n" not in payload["message"], payload


async def test_a_snapshot_naming_paths_outside_the_workspace_is_refused(jp_fetch, workspace, store_dir, tmp_path):
    _code, good = await call(jp_fetch, "POST", "spotwarp", "api", "snapshots")
    engine = make_engine(store_dir, "api")
    manifest = engine.get(good["id"])
    entry = manifest.files["entries"]["notes.md"]
    evil = engine.new_manifest("project", "evil", files={"entries": {"../escaped.md": entry, "ok.md": entry}},
                               objects=dict(manifest.objects))
    engine.commit_manifest(evil)
    code, payload = await fails(jp_fetch, "POST", "spotwarp", "api", "snapshots", evil.id, "restore")
    assert code == 400 and "outside the workspace" in payload["message"]
    assert not (workspace.parent / "escaped.md").exists() and not (workspace / "ok.md").exists()


# -- live kernels over the comm ---------------------------------------------------------------------
async def test_snapshot_and_restore_reach_every_live_kernel(jp_fetch, jp_ws_fetch, workspace):
    (workspace / "nb").mkdir()
    kid, ws = await open_notebook(jp_fetch, jp_ws_fetch, "nb/train.ipynb")
    plain_kid, plain_ws = await open_notebook(jp_fetch, jp_ws_fetch, "plain.ipynb")  # SpotWarp not loaded there
    try:
        await execute(ws, "%load_ext spotwarp\nweights = [1.5, 2.5]\nstep = 7")
        await execute(plain_ws, "z = 1")
        code, snap = await call(jp_fetch, "POST", "spotwarp", "api", "snapshots", body='{"message": "both"}')
        assert code == 201 and snap["notebooks"] == ["nb/train.ipynb"]
        assert {"weights", "step"} <= set(snap["variables"])
        assert snap["stats"]["kernels_fresh"] == ["nb/train.ipynb"]
        assert "plain.ipynb" in snap["stats"]["kernels_missing"]
        assert "not loaded" in snap["stats"]["kernels_missing"]["plain.ipynb"]

        code, status = await call(jp_fetch, "GET", "spotwarp", "api", "status")
        kernels = {k["kernel_id"]: k for k in status["kernels"]}
        assert kernels[kid]["notebook"] == "nb/train.ipynb"
        assert kernels[kid]["last_snapshot"] == snap["id"]
        assert kernels[plain_kid] == {"kernel_id": plain_kid, "notebook": "plain.ipynb", "last_snapshot": None,
                                      "execution_state": "idle", "newer": None}
        assert kernels[kid]["newer"] is None  # its own state

        await execute(ws, "weights = None\nstep = 0")
        code, restored = await call(jp_fetch, "POST", "spotwarp", "api", "snapshots", snap["id"], "restore")
        assert code == 200 and restored["id"] == snap["id"]
        (k,) = restored["kernels"]
        assert k["kernel_id"] == kid and k["notebook"] == "nb/train.ipynb" and {"weights", "step"} <= set(k["restored"])
        assert "[1.5, 2.5] 7" in await execute(ws, "print(weights, step)")
        # a later kernel-only snapshot: `latest` restores each kernel from its own newest state
        await execute(ws, "step = 8\n%spotwarp snapshot")
        await execute(ws, "step = 0")
        code, latest = await call(jp_fetch, "POST", "spotwarp", "api", "snapshots", "latest", "restore")
        # the kernel's snapshot holds the workspace files of its instant: it is the newest snapshot holding files
        assert code == 200 and latest["id"] != snap["id"]
        assert latest["kernels"][0]["id"] == latest["id"]
        assert (await execute(ws, "print(step)")).strip() == "8"
    finally:
        ws.close()
        plain_ws.close()
        for k in (kid, plain_kid):
            await jp_fetch("api", "kernels", k, method="DELETE")


async def test_a_kernel_started_after_its_notebooks_stored_state_says_so_until_restored(jp_fetch, jp_ws_fetch,
                                                                                         workspace):
    """A kernel that cannot hold its notebook's stored state (started after it, not restored: a restarted kernel,
    a kept home opened without a resume) is named in GET status with that snapshot; restored, it is not."""
    kid, ws = await open_notebook(jp_fetch, jp_ws_fetch, "train.ipynb")
    try:
        await execute(ws, "%load_ext spotwarp\nweights = [1.5, 2.5]\nstep = 7\n%spotwarp snapshot")
    finally:
        ws.close()
    await jp_fetch("api", "kernels", kid, method="DELETE")
    fresh, ws = await open_notebook(jp_fetch, jp_ws_fetch, "train.ipynb")
    try:
        _code, status = await call(jp_fetch, "GET", "spotwarp", "api", "status")
        (k,) = status["kernels"]
        assert k["kernel_id"] == fresh and k["newer"] is not None, k
        assert k["newer"]["id"] == k["last_snapshot"] and k["newer"]["variables"] == 2, k
        await execute(ws, "%load_ext spotwarp")
        code, restored = await call(jp_fetch, "POST", "spotwarp", "api", "snapshots", "latest", "restore")
        assert code == 200 and restored["kernels"][0]["kernel_id"] == fresh
        _code, status = await call(jp_fetch, "GET", "spotwarp", "api", "status")
        assert status["kernels"][0]["newer"] is None, status["kernels"]
        assert "[1.5, 2.5] 7" in await execute(ws, "print(weights, step)")
    finally:
        ws.close()
        await jp_fetch("api", "kernels", fresh, method="DELETE")


# -- the written contract and the configuration ---------------------------------------------------
async def test_answers_match_api_openapi_yaml(jp_fetch, workspace, store_dir):
    """Every answer is checked against the schema in `call`; this one walks a preemption through the report."""
    _code, status = await call(jp_fetch, "GET", "spotwarp", "api", "status")
    assert status["report"]["preemptions"] == 0 and status["report"]["events"] == []
    _code, snap = await call(jp_fetch, "POST", "spotwarp", "api", "snapshots")
    await call(jp_fetch, "POST", "spotwarp", "api", "snapshots", snap["id"], "restore")
    record_preemption(store_dir, snap["id"])
    _code, status = await call(jp_fetch, "GET", "spotwarp", "api", "status")
    assert status["last_snapshot"]["id"] == snap["id"]
    report = status["report"]
    assert (report["preemptions"], report["preemptions_survived"]) == (1, 1)
    (row,) = report["events"]
    assert row["host"] == "spot-a" and row["source"] == "aws" and row["restored_on"] == "spot-b"
    assert row["resume_s"] == 4.0


async def test_a_request_still_queued_when_the_server_stops_learns_why(jp_fetch, jp_serverapp, workspace, store_dir):
    """Work not yet started when the server stops is cancelled; its request gets the reason, not "Unhandled error"."""
    service = jp_serverapp.web_app.settings["spotwarp"]
    gate = threading.Event()
    busy = [asyncio.ensure_future(service.run(gate.wait, 60)) for _ in range(3)]  # every worker taken
    request = asyncio.ensure_future(fails(jp_fetch, "POST", "spotwarp", "api", "snapshots"))
    while service._executor._work_queue.qsize() < 1:  # the snapshot's first step, queued behind them
        await asyncio.sleep(0.01)
    service.close()
    gate.set()
    code, payload = await request
    await asyncio.gather(*busy)
    assert code == 503 and payload["message"].startswith("this Jupyter server is stopping"), payload


async def test_a_stopping_server_answers_in_one_line_and_a_fenced_one_says_why(jp_fetch, jp_serverapp, workspace,
                                                                                   store_dir):
    """A request racing the server's shutdown (it stops itself once fenced) gets a reason, never "Unhandled error"."""
    from spotwarp_jupyter.engine.coordination.fence import FENCED, Lease, write_lease
    from spotwarp_jupyter.server.heartbeat import Heartbeat

    service = jp_serverapp.web_app.settings["spotwarp"]
    await call(jp_fetch, "POST", "spotwarp", "api", "snapshots")
    service.close()  # what stop_extension does
    for method, parts in ENDPOINTS[1:]:
        code, payload = await fails(jp_fetch, method, *parts)
        assert code == 503 and payload["message"].startswith("this Jupyter server is stopping"), (parts, payload)
        assert "\n" not in payload["message"]

    # another host took the lease over: this one learns it from its heartbeat, then stops
    write_lease(service.engine.store, Lease(generation=1, holder="c-new", time=1.0))
    fenced: list[str] = []
    heartbeat = Heartbeat(service.engine.store, service.engine.fence, 60.0, {"port": 1}, asyncio.get_running_loop(),
                          on_promoted=lambda: None, on_fenced=fenced.append)
    assert await asyncio.to_thread(heartbeat.beat) == FENCED
    service.heartbeat = heartbeat
    code, payload = await fails(jp_fetch, "POST", "spotwarp", "api", "snapshots")
    assert code == 409 and "lost the lease to c-new (generation 1)" in payload["message"], payload
    assert len(service.engine.manifests()) == 1  # nothing more was written


def record_preemption(store_dir: Path, snapshot_id: str) -> None:
    """What a lost host and its successor write into the journal: a notice, a final snapshot, a restore."""
    from spotwarp_jupyter.engine.journal.events import (
        FINAL_SNAPSHOT_COMMITTED,
        NOTICE_SEEN,
        RESTORE_FINISHED,
        RESTORE_STARTED,
        Event,
        Journal,
    )
    from spotwarp_jupyter.engine.signing import sign_record, signing_key
    from spotwarp_jupyter.engine.storage import Layout

    journal = Journal(make_engine(store_dir, "api", resolved=False).store)
    base = 1_800_000_000.0
    journal.store.fs.makedirs(journal.dir, exist_ok=True)
    for event, when, host, details in [
        (NOTICE_SEEN, base, "spot-a", {"source": "aws", "fatal": True, "run": "a"}),
        (FINAL_SNAPSHOT_COMMITTED, base + 2, "spot-a", {"notice_to_commit_s": 2.0, "run": "a"}),
        (RESTORE_STARTED, base + 60, "spot-b", {"run": "b"}),
        (RESTORE_FINISHED, base + 64, "spot-b", {"ok": True, "run": "b"}),
    ]:
        item = Event(event, when, host, snapshot_id, None, details)  # as each host's Journal.record writes it,
        # signed with the project's key (the server's, which it made for this new store)
        name = item.name  # a new random suffix at each call: the name signed is the name written
        doc = sign_record(item.as_dict(), signing_key(), "api", f"{Layout.EVENTS}/{name}")
        journal.store.fs.pipe_file(f"{journal.dir}/{name}", json.dumps(doc).encode())


def test_settings_come_from_spotwarp_environment_variables(monkeypatch):
    from spotwarp_jupyter.engine import ConfigError
    from spotwarp_jupyter.server.app import SpotWarp

    monkeypatch.setenv("SPOTWARP_PROJECT", "from-env")
    monkeypatch.setenv("SPOTWARP_BACKUP_INTERVAL", "2m")
    monkeypatch.setenv("SPOTWARP_KERNEL_TIMEOUT", "0")
    monkeypatch.setenv("SPOTWARP_STORAGE_OPTIONS", '{"anon": true}')
    config = SpotWarp()
    assert config.project is None and config.backup_interval is None  # the traits are the config-file layer
    settings = config.resolve()
    assert (settings.project, config.backup_interval, config.kernel_timeout) == ("from-env", 120.0, 0.0)
    assert settings.storage_options == {"anon": True}
    monkeypatch.delenv("SPOTWARP_BACKUP_INTERVAL")
    explicit = SpotWarp(backup_interval=5)
    explicit.resolve()
    assert explicit.backup_interval == 5  # config beats the default
    monkeypatch.setenv("SPOTWARP_BACKUP_INTERVAL", "soon")
    with pytest.raises(ConfigError, match="SPOTWARP_BACKUP_INTERVAL='soon' cannot be used: bad duration"):
        SpotWarp().resolve()


class TestContinuousBackup:
    @pytest.fixture
    def jp_server_config(self, jp_server_config):
        jp_server_config["SpotWarp"]["backup_interval"] = 0.2
        return jp_server_config

    async def test_changed_files_are_backed_up_automatically(self, jp_fetch, jp_serverapp, workspace):
        await jp_serverapp.extension_manager.start_all_extensions()  # what a running server does once serving

        async def automatic() -> list[dict]:
            _code, listing = await call(jp_fetch, "GET", "spotwarp", "api", "snapshots")
            return [s for s in listing["snapshots"] if s["message"] == "automatic backup"]

        async def until(predicate, what: str, timeout: float = 30) -> list[dict]:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + timeout
            while loop.time() < deadline:
                found = await automatic()
                if predicate(found):
                    return found
                await asyncio.sleep(0.1)
            raise AssertionError(f"no {what} within {timeout} s")

        (first,) = await until(lambda s: len(s) == 1, "first automatic backup")
        assert first["files"] == 2
        (workspace / "new.txt").write_text("written later")
        found = await until(lambda s: len(s) == 2, "second automatic backup")
        assert found[0]["files"] == 3 and found[0]["parent"] == first["id"]


class TestBusyKernel:
    @pytest.fixture
    def jp_server_config(self, jp_server_config):
        jp_server_config["SpotWarp"]["kernel_timeout"] = 2
        return jp_server_config

    async def test_a_kernel_busy_past_the_timeout_keeps_its_last_committed_state(self, jp_fetch, jp_ws_fetch,
                                                                                  workspace, tmp_path):
        kid, ws = await open_notebook(jp_fetch, jp_ws_fetch, "busy.ipynb")
        flag = tmp_path / "release"
        try:
            await execute(ws, "%load_ext spotwarp\nepoch = 1\n%spotwarp snapshot")
            await execute(ws, "epoch = 2")
            # a long cell: the kernel answers nothing until the test releases it
            await ws.write_message(Execution(f"import os, time\nwhile not os.path.exists({str(flag)!r}): "
                                             "time.sleep(0.02)").request)
            code, snap = await call(jp_fetch, "POST", "spotwarp", "api", "snapshots")
            assert code == 201
            assert snap["stats"]["kernels_stale"] == ["busy.ipynb"] and snap["stats"]["kernels_fresh"] == []
            assert "busy.ipynb" in snap["stats"]["kernels_missing"]
            assert snap["notebooks"] == ["busy.ipynb"] and "epoch" in snap["variables"]
            # the status says why it did not answer: busy (the server heard it), not gone
            _code, status = await call(jp_fetch, "GET", "spotwarp", "api", "status")
            assert [k["execution_state"] for k in status["kernels"] if k["notebook"] == "busy.ipynb"] == ["busy"]
            flag.write_text("go")
            await execute(ws, "epoch = 0")
            code, restored = await call(jp_fetch, "POST", "spotwarp", "api", "snapshots", snap["id"], "restore")
            assert restored["kernels"][0]["restored"] == ["epoch"]
            assert (await execute(ws, "print(epoch)")).strip() == "1"  # the state committed before the long cell
        finally:
            flag.write_text("go")
            ws.close()
            await jp_fetch("api", "kernels", kid, method="DELETE")


def test_a_kernel_names_its_notebook_relative_to_the_workspace(tmp_path):
    """jupyter_server passes an absolute JPY_SESSION_NAME; the key must be the same on every host."""
    from spotwarp_jupyter.kernel.notebooks import notebook_name

    ws = tmp_path / "ws"
    assert notebook_name({"JPY_SESSION_NAME": str(ws / "nb" / "a.ipynb"), "SPOTWARP_WORKSPACE": str(ws)}) == "nb/a.ipynb"
    assert notebook_name({"JPY_SESSION_NAME": "nb/a.ipynb", "SPOTWARP_WORKSPACE": str(ws)}) == "nb/a.ipynb"
    outside = str(tmp_path / "elsewhere" / "b.ipynb")
    assert notebook_name({"JPY_SESSION_NAME": outside, "SPOTWARP_WORKSPACE": str(ws)}) == outside.lstrip("/")
    assert notebook_name({}) == "default"


async def test_a_promoted_host_commits_nothing_until_its_promotion_snapshot(jp_fetch, jp_serverapp, workspace):
    """Between promotion and the promotion snapshot the workspace may be stale: snapshots and resume/run say 409."""
    from spotwarp_jupyter.server.resume import Resumer

    service = jp_serverapp.web_app.settings["spotwarp"]
    service.promotion_committed.clear()  # as a standby's is, until its promotion snapshot commits
    code, payload = await fails(jp_fetch, "POST", "spotwarp", "api", "snapshots")
    assert code == 409 and payload["message"].startswith("promotion in progress"), payload
    assert service.engine.manifests() == []
    resumer = Resumer(service, jp_serverapp, gate=asyncio.Event())
    resumer.say("nb.ipynb", "restored", "cell c1 was running (outside a resumable loop)", kernel_id="k")
    code, payload = await fails(jp_fetch, "POST", "spotwarp", "api", "resume", "run", body='{"notebook": "nb.ipynb"}')
    assert code == 409 and "promotion in progress" in payload["message"], payload
    manifest = await service.promoted()
    assert service.promotion_committed.is_set() and manifest is not None
    await call(jp_fetch, "POST", "spotwarp", "api", "snapshots")
    assert len(service.engine.manifests()) == 2


async def test_a_resume_that_cannot_plan_still_shuts_the_warm_kernels_down(jp_fetch, jp_serverapp, workspace):
    """The warm kernels a standby started are never left running, even when the resume plans nothing."""
    from spotwarp_jupyter.server.resume import Resumer
    from spotwarp_jupyter.server.warm_kernels import WarmKernel, WarmKernels

    service = jp_serverapp.web_app.settings["spotwarp"]
    snapshot = (await call(jp_fetch, "POST", "spotwarp", "api", "snapshots"))[1]["id"]
    kernels = jp_serverapp.kernel_manager
    kernel_id = await kernels.start_kernel()
    warm = WarmKernels()
    warm.kernels["train.ipynb"] = WarmKernel(kernel_id, "python3", "train.ipynb")
    service.close()  # the plan's read of the store is refused: the server is stopping
    await Resumer(service, jp_serverapp, None, warm).resume(snapshot)
    assert service.resumed[-1]["state"] == "failed" and "nothing resumed" in service.resumed[-1]["line"]
    assert kernel_id not in kernels and warm.kernels == {}
