"""Preemption watchers against local servers speaking each cloud's metadata protocol, and real kernels.

Every endpoint is a 127.0.0.1 server from metadata_servers.py (or switched off): never a real cloud address.
SIGTERM, the fourth source, is exercised as a user meets it in test_preemption_e2e.py.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest

from spotwarp_jupyter.engine.journal.events import FINAL_SNAPSHOT_COMMITTED, NOTICE_SEEN, Journal
from spotwarp_jupyter.server.watchers import AwsWatcher, AzureWatcher, GcpWatcher, Notice

from engines import make_engine
from jupyter_api import call, execute, open_notebook
from lab_server import Execution
from metadata_servers import FakeAws, FakeAzure, FakeGcp, dead_url
from waiting import read_progress

pytest_plugins = ("pytest_jupyter.jupyter_server",)


async def until(predicate, what: str, timeout: float = 30.0, every: float = 0.05):
    """Poll `predicate` (sync) until it returns something truthy; AssertionError past the deadline."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        await asyncio.sleep(every)
    raise AssertionError(f"no {what} within {timeout} s")


@pytest.fixture
def aws_metadata():
    server = FakeAws()
    yield server
    server.close()


@pytest.fixture
def gcp_metadata():
    server = FakeGcp()
    yield server
    server.close()


@pytest.fixture
def azure_metadata():
    server = FakeAzure()
    yield server
    server.close()


class Collector:
    """What a watcher reported, in order."""

    def __init__(self) -> None:
        self.notices: list[Notice] = []

    async def __call__(self, notice: Notice) -> None:
        self.notices.append(notice)


# -- the protocols, one watcher at a time -----------------------------------------------------------------
async def test_aws_watcher_speaks_imdsv2_and_sees_interruptions_and_rebalance(aws_metadata: FakeAws):
    got = Collector()
    watcher = AwsWatcher(got, aws_metadata.url, poll_interval=0.05)
    watcher.start()
    try:
        await until(lambda: watcher.state == "watching", "watching state")
        await until(lambda: sum(1 for r in aws_metadata.requests if "instance-action" in r[1]) >= 3, "polls")
        assert got.notices == []
        puts = [r for r in aws_metadata.requests if r[0] == "PUT"]
        assert puts and all(r[1] == "/latest/api/token" for r in puts)  # IMDSv2: a session token first
        aws_metadata.expire_tokens()  # the service restarted: 401, a new token, and on
        aws_metadata.recommend_rebalance()
        (rebalance,) = await until(lambda: got.notices, "rebalance notice")
        assert rebalance.kind == "rebalance-recommendation" and not rebalance.fatal
        aws_metadata.interrupt(seconds=90)
        await until(lambda: len(got.notices) == 2, "interruption notice")
        interruption = got.notices[1]
        assert interruption.kind == "spot-interruption" and interruption.fatal
        assert 80 < interruption.deadline - time.time() <= 91  # the time AWS stated
        await asyncio.sleep(0.3)  # further polls see the same notices: each is reported once
        assert len(got.notices) == 2 and watcher.state.startswith("notice")
        assert all(r[2].get("x-aws-ec2-metadata-token") for r in aws_metadata.requests if r[0] == "GET")
    finally:
        await watcher.stop()


async def test_gcp_watcher_long_polls_and_hears_preemption_at_once(gcp_metadata: FakeGcp):
    got = Collector()
    watcher = GcpWatcher(got, gcp_metadata.url, poll_interval=5.0)
    watcher.long_poll_s = 30
    watcher.start()
    try:
        await until(lambda: gcp_metadata.long_polls >= 1, "a pending long poll")
        assert got.notices == [] and watcher.state == "watching"
        preempted_at = time.monotonic()
        gcp_metadata.preempt()
        (notice,) = await until(lambda: got.notices, "preemption notice")
        assert time.monotonic() - preempted_at < 5  # the long poll answered on change, not at its timeout
        assert notice.kind == "preempted" and notice.fatal and 20 < notice.window_s <= 30
        assert all(r[2].get("metadata-flavor") == "Google" for r in gcp_metadata.requests)
        assert any("wait_for_change=true" in r[1] and "last_etag=" in r[1] for r in gcp_metadata.requests)
    finally:
        await watcher.stop()


async def test_azure_watcher_sees_its_own_preempt_and_acknowledges_it(azure_metadata: FakeAzure):
    got = Collector()
    watcher = AzureWatcher(got, azure_metadata.url, poll_interval=0.05)
    watcher.start()
    try:
        await until(lambda: watcher.state == "watching", "watching state")
        azure_metadata.schedule("Freeze")  # not a preemption
        azure_metadata.schedule("Preempt", resources=["another-vm"])  # another VM's
        await asyncio.sleep(0.3)
        assert got.notices == [] and watcher.vm_name == "spot-vm-1"
        event_id = azure_metadata.schedule("Preempt", seconds=28)
        (notice,) = await until(lambda: got.notices, "Preempt notice")
        assert notice.kind == "Preempt" and notice.fatal and 20 < notice.window_s <= 29
        assert azure_metadata.acknowledged == []  # only once the final snapshot is in
        await watcher.acknowledge(notice)
        assert azure_metadata.acknowledged == [event_id]
        assert all(r[2].get("metadata") == "true" for r in azure_metadata.requests)
    finally:
        await watcher.stop()


@pytest.mark.parametrize("cls", [AwsWatcher, GcpWatcher, AzureWatcher])
async def test_an_unreachable_endpoint_backs_off_quietly(cls):
    got = Collector()
    watcher = cls(got, dead_url(), poll_interval=0.01, max_backoff=0.4)
    watcher.first_backoff_s = 0.05
    watcher.start()
    try:
        await until(lambda: watcher.failures >= 4, "repeated failures")
        assert watcher.state.startswith("unreachable") and "retrying in 0.4 s" in watcher.state  # capped
        assert got.notices == []
    finally:
        await watcher.stop()


async def test_another_clouds_endpoint_is_not_this_cloud(gcp_metadata: FakeGcp, aws_metadata: FakeAws):
    aws_on_gcp = AwsWatcher(Collector(), gcp_metadata.url, max_backoff=60)
    gcp_on_aws = GcpWatcher(Collector(), aws_metadata.url, max_backoff=60)
    for w in (aws_on_gcp, gcp_on_aws):
        w.start()
    try:
        await until(lambda: aws_on_gcp.state.startswith("not this cloud"), "AWS watcher on GCP giving way")
        await until(lambda: gcp_on_aws.state.startswith("not this cloud"), "GCP watcher on AWS giving way")
        assert "asking again in 60 s" in aws_on_gcp.state
    finally:
        for w in (aws_on_gcp, gcp_on_aws):
            await w.stop()


def test_the_firmware_names_the_cloud_without_a_network_probe(tmp_path):
    from spotwarp_jupyter.server.watchers.clouds import host_cloud

    assert host_cloud(str(tmp_path / "no-dmi")) is None  # unreadable: every watcher probes (and backs off)
    for vendor, cloud in [("Amazon EC2", "aws"), ("Google", "gcp"), ("Microsoft Corporation", "azure"),
                          ("QEMU", "other")]:
        dmi = tmp_path / cloud
        dmi.mkdir()
        (dmi / "sys_vendor").write_text(vendor + "\n")
        assert host_cloud(str(dmi)) == cloud


async def test_watchers_come_from_the_configuration(monkeypatch, aws_metadata):
    from traitlets import TraitError

    from spotwarp_jupyter.server.app import SpotWarp
    from spotwarp_jupyter.server.watchers import start_watchers

    monkeypatch.setenv("SPOTWARP_WATCHERS", "signals,aws,gcp")
    monkeypatch.setenv("SPOTWARP_AWS_METADATA_URL", aws_metadata.url)
    monkeypatch.setenv("SPOTWARP_GCP_METADATA_URL", "off")
    monkeypatch.setenv("SPOTWARP_METADATA_POLL_INTERVAL", "0.1")
    config = SpotWarp()
    config.resolve()
    assert (config.watchers, config.metadata_poll_interval, config.shutdown_grace) == (["signals", "aws", "gcp"], 0.1, 20)
    with pytest.raises(TraitError, match="unknown watcher"):
        SpotWarp(watchers=["aws", "vast"])

    async def on_exit() -> None:
        raise AssertionError("no signal was sent")

    watchers = start_watchers(config, Collector(), None, on_exit)
    try:
        assert [w.name for w in watchers] == ["signals", "aws"]  # gcp is off
        assert watchers[0].state.startswith("off: the server does not handle SIGTERM")  # not a jupyter process
        await until(lambda: watchers[1].state == "watching", "the AWS watcher watching")
        assert watchers[1].describe()["endpoint"] == aws_metadata.url
    finally:
        for w in watchers:
            await w.stop()


# -- a notice mid-loop, a real kernel started through the server ----------------------------------------
CLOUDS = {"aws": FakeAws, "gcp": FakeGcp, "azure": FakeAzure}

LOOP = """
import pathlib, time, spotwarp
from spotwarp_jupyter import safepoints
progress, stop = pathlib.Path({progress!r}), pathlib.Path({stop!r})
first = None
for step in spotwarp.resumable(range(100000), name="train"):
    if first is None:
        first = step
    done = step + 1
    progress.with_suffix(".tmp").write_text(str(done))
    progress.with_suffix(".tmp").replace(progress)  # never read half-written (empty) by the test
    if step == 5:
        safepoints.request("timer")  # the last periodic snapshot: taken at the next step
    if stop.exists():
        break
    time.sleep(0.02)
"""


@pytest.fixture(params=sorted(CLOUDS))
def cloud(request):
    server = CLOUDS[request.param]()
    yield request.param, server
    server.close()


@pytest.fixture
def jp_server_config(store_dir, cloud, monkeypatch):
    # the variables conftest sets would beat this config (environment > config files)
    for name in ("SPOTWARP_PROJECT", "SPOTWARP_STORAGE", "SPOTWARP_WORKSPACE", "SPOTWARP_STORAGE_OPTIONS",
                 "SPOTWARP_WATCHERS", *(f"SPOTWARP_{c.upper()}_METADATA_URL" for c in CLOUDS)):
        monkeypatch.setenv(name, "unset")
        monkeypatch.delenv(name)
    name, server = cloud
    urls = {f"{c}_metadata_url": (server.url if c == name else "off") for c in CLOUDS}
    return {
        "ServerApp": {"jpserver_extensions": {"spotwarp_jupyter.server": True}, "allow_root": True},
        "SpotWarp": {"project": "watch", "storage": str(store_dir), "backup_interval": 0, "kernel_timeout": 30,
                     "watchers": ["signals", name], "metadata_poll_interval": 0.2, **urls},
    }


async def test_a_notice_mid_loop_commits_the_progress_since_the_last_periodic_snapshot(
        jp_fetch, jp_ws_fetch, jp_serverapp, jp_root_dir, store_dir, tmp_path, cloud):
    name, server = cloud
    (jp_root_dir / "data.csv").write_text("x\n1\n")
    await jp_serverapp.extension_manager.start_all_extensions()  # what a running server does once serving
    engine = make_engine(store_dir, "watch")
    progress, stop = tmp_path / "progress", tmp_path / "stop"
    kid, ws = await open_notebook(jp_fetch, jp_ws_fetch, "train.ipynb")
    extra: list[tuple[str, object]] = []
    try:
        if name == "aws":  # an idle SpotWarp kernel and a kernel without SpotWarp share the server
            idle_kid, idle_ws = await open_notebook(jp_fetch, jp_ws_fetch, "idle.ipynb")
            plain_kid, plain_ws = await open_notebook(jp_fetch, jp_ws_fetch, "plain.ipynb")
            extra = [(idle_kid, idle_ws), (plain_kid, plain_ws)]
            await execute(idle_ws, "%load_ext spotwarp\n%spotwarp policy --every 1h --no-after-cell\nidle_value = 1")
            await execute(idle_ws, "idle_value = 2")  # after its last snapshot: only the notice's snapshot has it
            await execute(plain_ws, "plain_value = 3")
        await execute(ws, "%load_ext spotwarp\n%spotwarp policy --every 1h --no-after-cell")
        _code, status = await call(jp_fetch, "GET", "spotwarp", "api", "status")
        assert {w["name"] for w in status["watchers"]} == {"signals", name}
        await ws.write_message(Execution(LOOP.format(progress=str(progress), stop=str(stop))).request)

        periodic = await until(lambda: next((m for m in engine.manifests("train.ipynb")
                                             if m.message == "requested: timer"), None), "the periodic snapshot")
        await until(lambda: read_progress(progress) >= 40, "progress well past the periodic snapshot")
        at_notice = read_progress(progress)
        notify = {"aws": lambda: server.interrupt(seconds=100), "gcp": lambda: server.preempt(),
                  "azure": lambda: server.schedule("Preempt", seconds=30)}
        notify[name]()

        final = await until(lambda: next((m for m in engine.manifests() if m.kind == "project"
                                          and (m.message or "").startswith("final snapshot")), None),
                            "the final snapshot", timeout=60)
        assert name in final.message
        assert "train.ipynb" in final.stats["kernels_fresh"] and "data.csv" in final.files["entries"]

        namespace: dict = {}
        _m, restored = engine.restore_kernel(final.id, namespace, "train.ipynb")
        position = restored.extras["resumables"]["train"]["position"]
        periodic_position = engine.restore_kernel(periodic.id, {}, "train.ipynb")[1].extras["resumables"]["train"]["position"]
        assert periodic_position == 6 and namespace["done"] == position
        assert position >= at_notice > periodic_position + 30  # the progress made since the periodic snapshot

        # the journal event follows the manifest's commit: wait for it rather than race it
        events = await until(lambda: (lambda ev: ev if any(e.event == FINAL_SNAPSHOT_COMMITTED for e in ev) else None)(
            Journal(engine.store).events()), "the final snapshot's journal event")
        seen = [e for e in events if e.event == NOTICE_SEEN]
        committed = [e for e in events if e.event == FINAL_SNAPSHOT_COMMITTED]
        assert [e.details["source"] for e in seen] == [name] and seen[0].details["fatal"] is True
        assert [e.snapshot for e in committed] == [final.id]
        assert committed[0].details["notice_to_commit_s"] < seen[0].details["window_s"]
        _code, status = await call(jp_fetch, "GET", "spotwarp", "api", "status")
        watcher = next(w for w in status["watchers"] if w["name"] == name)
        assert watcher["state"].startswith("notice") and watcher["last_notice"]["fatal"] is True
        if name == "azure":
            await until(lambda: server.acknowledged, "the acknowledgement")
            assert server.acknowledged == [server.events[0]["EventId"]]
        if name == "aws":
            assert sorted(final.stats["kernels_fresh"]) == ["idle.ipynb", "train.ipynb"]
            idle_ns: dict = {}
            engine.restore_kernel(final.id, idle_ns, "idle.ipynb")
            assert idle_ns["idle_value"] == 2  # an idle kernel snapshots at once
            assert "plain.ipynb" in final.stats["kernels_missing"]
            stop.write_text("stop")
            assert (await execute(extra[1][1], "print(plain_value)")).strip() == "3"  # untouched by the notice
    finally:
        stop.write_text("stop")
        for k, s in [(kid, ws), *extra]:
            s.close()
            await jp_fetch("api", "kernels", k, method="DELETE")


# -- the events journal and `spotwarp report` ---------------------------------------------------------------
def test_report_counts_preemptions_work_lost_resume_time_and_compute_saved(tmp_path, capsys):
    from spotwarp_jupyter import cli
    from spotwarp_jupyter.engine import Manifest
    from spotwarp_jupyter.engine.journal.report import report

    engine = make_engine(tmp_path / "store", "rep")
    journal = Journal(engine.store)
    r1, r2 = {"variables": {"w": 1}}, {"variables": {"w": 2}}

    def manifest(ident, created, kind="kernel", record=None, duration=0.0):
        return Manifest(id=ident, project="rep", created=created, host="h", kind=kind,
                        kernels={"nb.ipynb": record} if record else {}, stats={"duration_s": duration})

    manifests = [manifest("first", 1000.0, record={"variables": {}}), manifest("periodic", 1102.0, record=r1, duration=2.0),
                 manifest("final", 1105.0, "project", r1), manifest("second", 1390.0, record=r2)]

    def record(event, when, snapshot=None, host="host-a", run=None, **details):
        item = journal.record(event, snapshot, "nb.ipynb", when=when, run=run, **details)
        item.host = host  # the journal stamps this machine's name: stand in for three hosts
        return item

    events = [
        record(NOTICE_SEEN, 1102.5, run="r1", source="aws", fatal=True),
        record(NOTICE_SEEN, 1103.0, run="r1", source="signals", fatal=True),  # the same run's SIGTERM: one preemption
        record(FINAL_SNAPSHOT_COMMITTED, 1105.0, "final", run="r1", source="aws", notice_to_commit_s=2.5),
        record("restore_started", 1200.0, "final", host="host-b", what="files"),
        record("restore_finished", 1210.0, "final", host="host-b", what="files", ok=True),
        record("training_resumed", 1230.0, "final", host="host-b", position=50),
        record(NOTICE_SEEN, 1300.0, run="r2", host="host-b", source="aws", fatal=False),  # a rebalance warning
        record(NOTICE_SEEN, 1400.0, run="r2", host="host-b", source="gcp", fatal=True),  # no final snapshot made it
        record("restore_started", 1500.0, "second", host="host-c"),
        record("training_resumed", 1520.0, "second", host="host-c", position=80),
        record(NOTICE_SEEN, 1600.0, run="r3", host="host-c", source="azure", fatal=True),  # not recovered (yet)
    ]
    out = report(events, manifests)
    assert (out["preemptions"], out["preemptions_survived"], out["warnings"]) == (3, 2, 1)
    first, second, third = out["events"]
    assert first["final_snapshot"] == "final" and first["notice_to_final_s"] == 2.5
    assert first["work_lost_s"] == 5.0  # alive until the final commit at 1105; state captured at 1100
    assert first["resume_s"] == 30.0 and first["compute_saved_s"] == 100.0 and first["resumed_at_step"] == 50
    assert second["final_snapshot"] is None and second["work_lost_s"] == 10.0  # from its 1390 state to the notice
    assert second["resume_s"] == 20.0 and second["compute_saved_s"] == 100.0 + (1390.0 - 1230.0)
    assert third["survived"] is False and third["compute_saved_s"] is None
    assert out["work_lost_s"] == 15.0 and out["resume_s_median"] == 25.0 and out["compute_saved_s"] == 360.0

    # the stored events read back the same (names sort by time); a damaged one is skipped, not fatal
    (Path(journal.dir) / "20261202T000000000Z-notice_seen-bad.json").write_text("{not json")
    assert [e.event for e in journal.events()][-3:] == ["restore_started", "training_resumed", NOTICE_SEEN]
    code = cli.main(["report", "--project-id", "rep", "--storage", str(tmp_path / "store")])
    text = capsys.readouterr().out
    assert code == 0 and "2 of 3 preemptions survived" in text and "host-a" not in text  # stored: this host's name
    assert cli.main(["status", "--project-id", "rep", "--storage", str(tmp_path / "store"), "--json"]) == 0
    status = json.loads(capsys.readouterr().out)
    assert [e["event"] for e in status["events"]][-1] == NOTICE_SEEN and len(status["events"]) == 5


def test_report_of_a_missing_store_is_one_line(tmp_path, capsys):
    from spotwarp_jupyter import cli

    assert cli.main(["report", "--project-id", "p", "--storage", str(tmp_path / "nowhere")]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "does not exist" in err
    with pytest.raises(SystemExit) as info:
        cli.main(["report", "--project-id", "p", "--keep", "3"])
    assert info.value.code == 2
