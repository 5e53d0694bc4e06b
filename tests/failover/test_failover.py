"""Failover end to end with the local provider: real `spotwarp launch` and real `spotwarp start` candidates.

1. A race of three (scripted delays, one scripted failure): exactly one promoted, the fastest healthy one;
   the others torn down, and nothing in the store written by them.
2. The holder SIGKILLed with no notice: `launch --watch` detects it within --dead-after, races, and the new
   holder serves the session restored: files byte-identical, kernel variables back in the notebook's kernel.
3. The holder SIGSTOPped (a partition), then SIGCONT after the failover: its later snapshots never become
   latest, and it stops itself.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from failover_hosts import PROJECT, Launch, attach, cleanup, engine_for, env_for, running, seed_project

from spotwarp_jupyter.engine import Settings, SnapshotEngine
from spotwarp_jupyter.engine.coordination.fence import Fence, read_lease
from spotwarp_jupyter.engine.coordination.heartbeats import read_heartbeat, read_heartbeats
from spotwarp_jupyter.engine.journal.events import FINAL_SNAPSHOT_COMMITTED, NOTICE_SEEN, Journal

from lab_server import TOKEN, LabServer, host_env, kill_kernel, tree
from waiting import wait_for

pytestmark = pytest.mark.slow  # real `spotwarp start` servers raced, killed and partitioned: minutes in all


def test_race_promotes_the_fastest_healthy_candidate_and_the_losers_write_nothing(tmp_path):
    store = str(tmp_path / "store")
    seed_project(tmp_path, store)
    engine = engine_for(store)
    before = set(engine.store.manifest_names())
    launch = Launch(tmp_path, store, "--candidates", "3", "--provider-option", "delays=0,0,6",
                    "--provider-option", "fail=1", env=env_for(tmp_path))
    try:
        started = launch.next("race_started")
        ids = [c["id"] for c in started["candidates"]]
        failed = launch.next("candidate_failed")
        promoted = launch.next("promoted")
        finished = launch.next("failover_finished")
        assert launch.proc.wait(timeout=120) == 0, launch.stderr_path.read_text()
        assert failed["id"] == ids[1] and "scripted failure" in failed["message"]
        assert promoted["candidate"] == ids[0] == finished["winner"]  # the fastest healthy one
        assert [e["event"] for e in launch.seen].count("promoted") == 1
        states = {c["id"]: c["state"] for c in finished["candidates"]}
        assert states == {ids[0]: "promoted", ids[1]: "failed", ids[2]: "down"}
        lease = read_lease(engine.store)
        assert (lease.generation, lease.holder) == (1, ids[0])
        assert running(ids[1]) == [] and running(ids[2]) == []  # torn down
        assert running(ids[0])  # the winner serves
        # the winner learns of its promotion and commits its generation's first snapshot; nobody else wrote
        promotion = wait_for(lambda: next((m for m in engine.manifests() if m.generation == 1), None),
                             "the promotion snapshot")
        assert promotion.holder == ids[0] and promotion.kernels["train.ipynb"]
        new = [m for m in engine.manifests() if m.name not in before]
        assert [(m.generation, m.holder) for m in new] == [(1, ids[0])], new
        events = Journal(engine.store).events()
        assert not [e for e in events if e.event in (NOTICE_SEEN, FINAL_SNAPSHOT_COMMITTED)]
        assert not [e for e in events if e.details.get("candidate") in (ids[1], ids[2])
                    and e.event not in ("race_started",)]
        assert read_heartbeat(engine.store, ids[0])["state"] == "holder"
        for loser in ids[1:]:
            doc = read_heartbeat(engine.store, loser)
            assert doc is None or doc["state"] in ("standby", "fenced")
        report = json.loads(subprocess.run([sys.executable, "-m", "spotwarp_jupyter.cli", "report", "--project-id",
                                            PROJECT, "--storage", store, "--json"], capture_output=True, text=True,
                                           env=env_for(tmp_path), timeout=60, check=True).stdout)
        (row,) = report["failovers"]
        assert row["ok"] and row["winner"] == ids[0] and row["provision_s"] is not None \
            and row["restore_serve_s"] is not None and row["total_s"] >= row["restore_serve_s"]
    finally:
        launch.stop()
        cleanup(store, tmp_path)


def test_a_torn_down_candidate_leaves_no_copy_of_the_workspace(tmp_path, monkeypatch):
    """A loser restored the workspace before it was torn down: its copy goes with it (the demo's losers kept
    theirs on disk); its log stays."""
    from spotwarp_jupyter.failover.provider import LaunchSpec
    from spotwarp_jupyter.failover.providers import make_provider

    store = str(tmp_path / "store")
    seed_project(tmp_path, store)
    monkeypatch.setenv("HOME", str(tmp_path / "orchestrator-home"))
    provider = make_provider("local", {"root": str(tmp_path / "candidates"), "token": TOKEN, "grace": "15"})
    spec = LaunchSpec(PROJECT, store, env={"SPOTWARP_HEARTBEAT_INTERVAL": "1"})
    handle = provider.launch(spec, provider.offers(spec, 1)[0], "g1c0-loser", 1)
    folder = tmp_path / "candidates" / "g1c0-loser"
    try:
        wait_for(lambda: (folder / "ws" / "train.ipynb").exists(), "the candidate's restored workspace")
        provider.down(handle)
        assert not (folder / "ws").exists() and (folder / "candidate.log").exists()
        assert provider.leaks() == []
    finally:
        provider.down(handle)
        cleanup(store, tmp_path)


def test_the_holder_killed_without_notice_is_replaced_and_the_session_comes_back(tmp_path):
    store = str(tmp_path / "store")
    seed_project(tmp_path, store)
    engine = engine_for(store)
    dead_after = 4.0
    launch = Launch(tmp_path, store, "--candidates", "2", "--watch", "--dead-after", f"{dead_after:g}s",
                    env=env_for(tmp_path))
    kernel_pid = None
    try:
        first = launch.next("promoted")
        holder = attach(first["url"], tmp_path / "first.log")
        ws_first = tmp_path / "candidates" / first["candidate"] / "ws"
        nb = holder.open_notebook("train.ipynb")
        kernel_pid = nb.value("__import__('os').getpid()")
        restored = nb.run("%load_ext spotwarp\n%spotwarp restore latest")
        assert "weights" in restored, restored
        nb.run("weights.append(2.5)\nhistory = {'loss': [0.9, 0.4]}")
        (ws_first / "data" / "notes.txt").write_text("written on the first holder\n")
        code, snap = holder.request("POST", "spotwarp/api/snapshots", {"message": "before the loss"})
        assert code == 201 and snap["generation"] == 1 and snap["holder"] == first["candidate"], snap
        nb.close()
        expected = tree(ws_first)
        pid = read_heartbeat(engine.store, first["candidate"])["pid"]
        launch.next("failover_finished")  # the first race's row
        killed = time.time()
        os.killpg(pid, signal.SIGKILL)  # the host vanishes, no notice
        os.kill(kernel_pid, signal.SIGKILL)
        lost = launch.next("host_lost", timeout=dead_after + 30)
        detected = time.time()
        assert lost["lost"] == first["candidate"] and lost["reason"] == "no heartbeat"
        assert lost["provider_state"] == "gone"
        assert detected - killed <= dead_after + 5, (detected - killed, lost)
        second = launch.next("promoted")
        finished = launch.next("failover_finished")
        assert second["generation"] == 2 and finished["lost"] == first["candidate"]
        assert finished["detect_s"] is not None and finished["total_s"] >= finished["restore_serve_s"]

        ws_second = tmp_path / "candidates" / second["candidate"] / "ws"
        assert tree(ws_second) == expected  # byte-identical
        new = attach(second["url"], tmp_path / "second.log")
        nb = new.open_notebook("train.ipynb")
        out = nb.run("%load_ext spotwarp\n%spotwarp restore latest")
        assert "weights" in out, out
        assert nb.value("weights") == [0.5, 1.5, 2.5]
        assert nb.value("history") == {"loss": [0.9, 0.4]}
        assert nb.value("step") == 7
        nb.close()
        latest = engine.get("latest")
        assert latest.generation == 2 and latest.holder == second["candidate"]
        launch.stop()
        assert launch.proc.returncode == 0, launch.stderr_path.read_text()
    finally:
        launch.stop()
        kill_kernel(kernel_pid)
        cleanup(store, tmp_path)


def test_a_partitioned_holder_back_after_the_failover_never_becomes_latest_and_stops(tmp_path):
    store = str(tmp_path / "store")
    seed_project(tmp_path, store)
    engine = engine_for(store)
    env = env_for(tmp_path)
    old = LabServer(tmp_path / "old" / "ws", store, PROJECT, host_env(tmp_path / "old-home", **{
        k: v for k, v in env.items() if k.startswith("SPOTWARP_")}), tmp_path / "old.log")
    launch = None
    try:
        old.wait_ready()
        code, first = old.request("POST", "spotwarp/api/snapshots", {"message": "on the first host"})
        assert code == 201 and first["generation"] == 0
        launch = Launch(tmp_path, store, "--candidates", "1", "--watch", "--dead-after", "3s", env=env)
        launch.next("adopted")  # a live host serving the project: watched, not raced against
        os.killpg(old.proc.pid, signal.SIGSTOP)  # cut off: no heartbeat, but still there
        lost = launch.next("host_lost", timeout=60)
        assert lost["reason"] == "no heartbeat"
        promoted = launch.next("promoted")
        launch.next("failover_finished")
        assert promoted["generation"] == 1
        promoted_at = read_lease(engine.store).time

        os.killpg(old.proc.pid, signal.SIGCONT)  # back: it must find itself fenced off
        try:
            code, answer = old.request("POST", "spotwarp/api/snapshots", {"message": "after the partition"},
                                       timeout=30)
            assert code == 409 and "lost the lease" in answer["message"], (code, answer)
        except (OSError, ConnectionError):
            pass  # it had already stopped itself
        assert old.proc.wait(timeout=60) is not None  # it stops itself
        assert "lost the lease" in old.log()
        stale = [m for m in engine.manifests() if m.generation == 0 and m.created > promoted_at]
        assert stale == []
        # the promotion snapshot commits while the winner's kernels resume: it may land after the old host stopped
        latest = wait_for(lambda: engine.get("latest") if engine.get("latest").generation else None,
                          "the promotion snapshot", timeout=60)
        assert latest.generation == 1 and latest.holder == promoted["candidate"]
        heartbeats = {d["id"]: d for d in read_heartbeats(engine.store)}
        assert any(d["state"] == "fenced" for d in heartbeats.values() if not d.get("candidate"))
    finally:
        if launch is not None:
            launch.stop()
        try:
            os.killpg(old.proc.pid, signal.SIGCONT)
        except ProcessLookupError:
            pass
        old.discard()
        cleanup(store, tmp_path)


def test_a_preemption_notice_is_detected_and_the_race_restores_the_final_snapshot(tmp_path):
    store = str(tmp_path / "store")
    seed_project(tmp_path, store)
    engine = engine_for(store)
    # a long --dead-after: only the notice can make the watch act this soon
    launch = Launch(tmp_path, store, "--candidates", "1", "--watch", "--dead-after", "120s", env=env_for(tmp_path))
    try:
        first = launch.next("promoted")
        launch.next("failover_finished")
        ws_first = tmp_path / "candidates" / first["candidate"] / "ws"
        (ws_first / "late.txt").write_text("only the final snapshot has this\n")
        expected = tree(ws_first)  # the lost holder's folder goes with its teardown
        pid = read_heartbeat(engine.store, first["candidate"])["pid"]
        sent = time.time()
        os.kill(pid, signal.SIGTERM)  # the cloud's notice
        lost = launch.next("host_lost", timeout=60)
        assert lost["reason"] == "notice" and lost["source"] == "signals" and lost["final_snapshot"], lost
        assert time.time() - sent < 60
        final = engine.get(lost["final_snapshot"])
        assert final.generation == 1 and final.holder == first["candidate"] and "late.txt" in final.files["entries"]
        second = launch.next("promoted")
        launch.next("failover_finished")
        ws_second = tmp_path / "candidates" / second["candidate"] / "ws"
        assert (ws_second / "late.txt").read_text() == "only the final snapshot has this\n"
        assert tree(ws_second) == expected
    finally:
        launch.stop()
        cleanup(store, tmp_path)


def cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "spotwarp_jupyter.cli", *args], capture_output=True, text=True,
                          env=env_for(tmp_path), timeout=120)


def test_launch_bad_input_and_a_race_where_every_candidate_fails_are_one_line(tmp_path):
    store = str(tmp_path / "store")
    base = ["launch", "--project-id", PROJECT, "--storage", store]
    cases = [
        ([*base, "--provider", "nope"], "unknown provider 'nope'"),
        ([*base, "--candidates", "0"], "at least 1"),
        ([*base, "--max-price", "-1"], "price"),
        ([*base, "--dead-after", "soon"], "bad duration"),
        ([*base, "--clouds", ",,"], "cloud names"),
        ([*base, "--provider-option", "novalue"], "KEY=VALUE"),
        ([*base, "--provider", "local", "--provider-option", "delays=a,b"], "delays must be numbers"),
    ]
    for args, message in cases:
        out = cli(tmp_path, *args)
        assert out.returncode in (1, 2) and message in out.stderr, (args, out.stderr)
        assert len(out.stderr.strip().splitlines()) == 1, out.stderr
    seed_project(tmp_path, store)
    engine = engine_for(store)
    before = engine.store.manifest_names()
    out = cli(tmp_path, *base, "--provider", "local", "--candidates", "2", "--provider-option", "fail=0,1",
              "--provider-option", f"root={tmp_path / 'candidates'}")
    assert out.returncode == 1 and "all 2 candidates failed" in out.stderr and "scripted failure" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert read_lease(engine.store).generation == 0 and engine.store.manifest_names() == before
    out = cli(tmp_path, "watch", "--project-id", PROJECT, "--storage", store, "--provider", "local")
    assert out.returncode == 1 and "no live host serves project" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr
    hosts = json.loads(cli(tmp_path, "hosts", "--project-id", PROJECT, "--storage", store, "--json").stdout)
    assert hosts["lease"]["generation"] == 0 and hosts["hosts"] == []
    report = json.loads(cli(tmp_path, "report", "--project-id", PROJECT, "--storage", store, "--json").stdout)
    (row,) = report["failovers"]
    assert not row["ok"] and "all 2 candidates failed" in row["error"]


def test_a_damaged_lease_is_shown_and_launch_moves_past_it_keeping_generations_monotonic(tmp_path):
    """The documented way out of a damaged lease: `spotwarp launch` races past it, at a generation above it."""
    from spotwarp_jupyter.failover.lease import move_lease

    store = str(tmp_path / "store")
    seed_project(tmp_path, store)
    engine = engine_for(store)
    move_lease(engine.store, 1, "old-1")
    move_lease(engine.store, 2, "old-2")
    (tmp_path / "store" / PROJECT / "lease" / "000000000002.json").write_text('{"generation": "soon"')
    out = cli(tmp_path, "hosts", "--project-id", PROJECT, "--storage", store)
    assert out.returncode == 0 and "DAMAGED" in out.stdout and "generation 3" in out.stdout, out
    launch = Launch(tmp_path, store, "--candidates", "1", env=env_for(tmp_path))
    try:
        promoted = launch.next("promoted")
        assert promoted["generation"] == 3
        assert launch.proc.wait(timeout=120) == 0, launch.stderr_path.read_text()
        lease = read_lease(engine.store)
        assert (lease.generation, lease.holder) == (3, promoted["candidate"])
        promotion = wait_for(lambda: next((m for m in engine.manifests() if m.generation == 3), None),
                             "the promotion snapshot")
        assert engine_for(store).get("latest").id == promotion.id
    finally:
        launch.stop()
        cleanup(store, tmp_path)


SKEWED = """import sys, time
_real = time.time
_skew = float(sys.argv.pop(1))
time.time = lambda: _real() + _skew
from spotwarp_jupyter.cli import main
sys.exit(main())
"""


@pytest.mark.parametrize("skew", [30.0, -30.0])
def test_a_skewed_orchestrator_never_fails_over_a_live_holder_and_still_sees_a_dead_one(tmp_path, skew):
    """The orchestrator's wall clock 30 s ahead of (or behind) the hosts': silence is judged on its own monotonic
    clock, so a live holder is left alone (and the skew is reported), and a killed one is detected in time."""
    store = str(tmp_path / "store")
    seed_project(tmp_path, store)
    (tmp_path / "skewed.py").write_text(SKEWED)
    dead_after = 4.0
    launch = Launch(tmp_path, store, "--candidates", "1", "--watch", "--dead-after", f"{dead_after:g}s",
                    env=env_for(tmp_path), python=(str(tmp_path / "skewed.py"), f"{skew:g}"))
    try:
        first = launch.next("promoted")
        launch.next("failover_finished")
        # judged by wall clock, beats written 30 s behind this clock would be older than --dead-after at the first
        # look: three times --dead-after of quiet shows a live holder kept
        during = launch.quiet(3 * dead_after)
        assert not [e for e in during if e["event"] in ("host_lost", "race_started")], during
        skews = [e for e in launch.seen if e["event"] == "clock_skew"]
        assert skews and abs(skews[0]["behind_s"] - skew) < 5, launch.seen
        pid = read_heartbeat(engine_for(store).store, first["candidate"])["pid"]
        killed = time.monotonic()
        os.killpg(pid, signal.SIGKILL)
        lost = launch.next("host_lost", timeout=dead_after + 30)
        assert time.monotonic() - killed <= dead_after + 5 and lost["lost"] == first["candidate"]
        assert dead_after <= lost["detect_s"] <= dead_after + 3, lost  # one clock: not 30 s off
    finally:
        launch.stop()
        cleanup(store, tmp_path)


def test_bad_torn_or_missing_heartbeats_are_no_news_for_an_adopting_watch(tmp_path):
    """`"time": "soon"`, a torn file, a wrong type, a missing file: the watch neither crashes nor fails over."""
    store = str(tmp_path / "store")
    seed_project(tmp_path, store)
    out = subprocess.run([sys.executable, "-m", "spotwarp_jupyter.cli", "launch", "--project-id", PROJECT, "--storage",
                          store, "--provider", "local", "--provider-option", f"root={tmp_path / 'candidates'}",
                          "--candidates", "1", "--json"], capture_output=True, text=True, env=env_for(tmp_path),
                         timeout=300)
    assert out.returncode == 0, out.stderr
    holder = read_lease(engine_for(store).store).holder
    beat = tmp_path / "store" / PROJECT / "hosts" / f"{holder}.json"
    # The host beats every 1 s and the watch looks every 0.5 s, and the garbage hides most beats while it
    # lasts: the silence the watch sees is the garbage's 3 s plus up to 1.5 s on each side (more on a
    # loaded machine). --dead-after 8s keeps all of that well under the limit (4s once failed a full run).
    watch = Launch(tmp_path, store, "--dead-after", "8s", env=env_for(tmp_path), command="watch", name="watch")
    try:
        watch.next("adopted")
        good = json.loads(beat.read_text())
        bad = [json.dumps({**good, "time": "soon"}), json.dumps(good)[:40], json.dumps({**good, "generation": "1"}),
               "[]", json.dumps({**good, "pid": None, "beat": True}), None]
        deadline = time.monotonic() + 3  # under --dead-after: garbage alone must never be taken for silence
        i = 0
        while time.monotonic() < deadline:
            text = bad[i % len(bad)]
            if text is None:
                beat.unlink(missing_ok=True)
            else:
                beat.write_text(text)
            i += 1
            time.sleep(0.05)  # a steady stream of garbage between the host's own beats, not a synchronisation
        during = watch.quiet(8)
        assert not [e for e in during if e["event"] in ("host_lost", "race_started")], during
        assert watch.proc.poll() is None, watch.stderr_path.read_text()
        assert "Traceback" not in watch.stderr_path.read_text()
    finally:
        watch.stop()
        cleanup(store, tmp_path)


def test_a_30_s_store_outage_leaves_the_watch_running_and_declares_no_loss(tmp_path, s3_server, link_to):
    """The store refuses connections for 30 s (the orchestrator's and the hosts' alike): the watch says so,
    retries, declares nothing; when the store answers again it watches on. botocore may retry one read
    through the whole outage: then the watch says the store was slow (`store_slow`), and declares nothing."""
    link = link_to(s3_server)
    target = s3_server.target(port=link.port)
    env = env_for(tmp_path, **target.env, SPOTWARP_STORAGE_OPTIONS=json.dumps(target.options))
    engine = SnapshotEngine(Settings.resolve(project=PROJECT, storage=target.url,
                                             env={"SPOTWARP_STORAGE_OPTIONS": json.dumps(target.options)}),
                            key=b"", fence=Fence())
    engine.snapshot_kernel({"step": 1}, "train.ipynb")
    launch = Launch(tmp_path, target.url, "--candidates", "1", "--watch", "--dead-after", "4s", env=env)
    try:
        launch.next("promoted")
        launch.next("failover_finished")
        link.cut()
        outage = launch.quiet(30)
        link.restore()
        after = launch.quiet(12)
        events = [e["event"] for e in outage + after]
        # refused reads, or one read the storage client's own retries held through the whole outage
        said = ("store_unreachable" in events and "store_reachable" in events) or "store_slow" in events
        assert said, outage + after
        assert "host_lost" not in events and "race_started" not in events, outage + after
        assert launch.proc.poll() is None, launch.stderr_path.read_text()
    finally:
        if link.cut_event.is_set():
            link.restore()
        launch.stop()
        for doc in read_heartbeats(engine.store):
            for sig in (signal.SIGCONT, signal.SIGKILL):
                try:
                    os.killpg(int(doc["pid"]), sig)
                except (ProcessLookupError, PermissionError, KeyError, ValueError):
                    pass
        cleanup(str(tmp_path / "local-store"), tmp_path)


def test_a_second_watch_refuses_and_one_loss_is_one_failover(tmp_path):
    store = str(tmp_path / "store")
    seed_project(tmp_path, store)
    dead_after = 4.0
    first = Launch(tmp_path, store, "--candidates", "1", "--watch", "--dead-after", f"{dead_after:g}s",
                   env=env_for(tmp_path))
    try:
        promoted = first.next("promoted")
        first.next("failover_finished")
        for args in (("launch", "--watch"), ("watch",)):
            out = cli(tmp_path, *args[:1], "--project-id", PROJECT, "--storage", store, "--provider", "local",
                      "--dead-after", f"{dead_after:g}s", *args[1:], "--provider-option",
                      f"root={tmp_path / 'other'}")
            assert out.returncode == 1 and "another watch follows project" in out.stderr, (args, out.stderr)
            assert f"pid {first.proc.pid}" in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr
        assert not (tmp_path / "other").exists()  # the refused launch raced nothing
        pid = read_heartbeat(engine_for(store).store, promoted["candidate"])["pid"]
        os.killpg(pid, signal.SIGKILL)
        first.next("host_lost", timeout=dead_after + 30)
        second = first.next("promoted")
        assert second["generation"] == 2
        assert read_lease(engine_for(store).store).generation == 2
    finally:
        first.stop()
        cleanup(store, tmp_path)
    watchers = tmp_path / "store" / PROJECT / "watchers"
    assert not watchers.exists() or not list(watchers.iterdir())  # the watch took its announcement away


def test_a_lease_conflict_during_a_race_ends_the_launch_instead_of_racing_again(tmp_path):
    from spotwarp_jupyter.failover.lease import move_lease

    store = str(tmp_path / "store")
    seed_project(tmp_path, store)
    launch = Launch(tmp_path, store, "--candidates", "1", "--watch", "--dead-after", "4s",
                    "--provider-option", "delays=2", env=env_for(tmp_path))
    try:
        started = launch.next("race_started")
        move_lease(engine_for(store).store, started["generation"], "another-orchestrators-winner")
        assert launch.proc.wait(timeout=120) == 1
        err = launch.stderr_path.read_text()
        assert "another `spotwarp launch` runs for this project" in err and len(err.strip().splitlines()) == 1, err
        kinds = [e["event"] for e in launch.quiet(1)] + [e["event"] for e in launch.seen]
        assert kinds.count("race_started") == 1 and "promoted" not in kinds, kinds
        assert running(started["candidates"][0]["id"]) == []  # its candidate torn down
    finally:
        launch.stop()
        cleanup(store, tmp_path)


def test_launch_refuses_a_live_project_and_replace_takes_a_final_snapshot_first(tmp_path):
    store = str(tmp_path / "store")
    seed_project(tmp_path, store)
    engine = engine_for(store)
    base = ["launch", "--project-id", PROJECT, "--storage", store, "--provider", "local", "--candidates", "1",
            "--dead-after", "4s", "--provider-option", f"root={tmp_path / 'candidates'}", "--json"]
    try:
        first = cli(tmp_path, *base)
        assert first.returncode == 0, first.stderr
        holder = read_lease(engine.store).holder
        ws = tmp_path / "candidates" / holder / "ws"
        (ws / "late.txt").write_text("written after the last backup\n")  # only a final snapshot saves this
        again = cli(tmp_path, *base)
        assert again.returncode == 1 and f"served by the live host {holder}" in again.stderr, again.stderr
        assert len(again.stderr.strip().splitlines()) == 1 and "--replace" in again.stderr
        assert read_lease(engine.store).holder == holder  # nothing moved
        replaced = cli(tmp_path, *base, "--replace")
        assert replaced.returncode == 0, replaced.stderr
        events = [json.loads(line) for line in replaced.stdout.splitlines() if line.startswith("{")]
        final = next(e for e in events if e["event"] == "replace_snapshot")
        assert final["snapshot"], events
        lease = read_lease(engine.store)
        assert lease.generation == 2 and lease.holder != holder
        assert (tmp_path / "candidates" / lease.holder / "ws" / "late.txt").read_text() == \
            "written after the last backup\n"
        wait_for(lambda: not running(holder), "the replaced holder to stop", timeout=60)
    finally:
        cleanup(store, tmp_path)


@pytest.mark.parametrize("sig,watch", [(signal.SIGTERM, False), (signal.SIGHUP, False), (signal.SIGTERM, True)])
def test_a_signal_during_a_race_tears_every_candidate_down_at_once(tmp_path, sig, watch):
    store = str(tmp_path / "store")
    seed_project(tmp_path, store)
    launch = Launch(tmp_path, store, "--candidates", "2", "--provider-option", "delays=60",
                    *(["--watch", "--dead-after", "4s"] if watch else []), env=env_for(tmp_path))
    try:
        started = launch.next("race_started")
        ids = [c["id"] for c in started["candidates"]]
        wait_for(lambda: all(running(i) for i in ids), "both candidates running")
        signalled = time.monotonic()
        launch.proc.send_signal(sig)
        assert launch.proc.wait(timeout=60) == 1
        assert time.monotonic() - signalled < 30  # not the whole race (up to --timeout)
        err = launch.stderr_path.read_text()
        assert "stopped by a signal" in err and len(err.strip().splitlines()) == 1, err
        wait_for(lambda: not any(running(i) for i in ids), "every candidate gone", timeout=30)
        assert read_lease(engine_for(store).store).generation == 0
    finally:
        launch.stop()
        cleanup(store, tmp_path)


def test_bad_launch_input_is_one_line_and_creates_nothing(tmp_path):
    import glob
    import tempfile

    fresh = str(tmp_path / "nothing-here")
    local_roots = set(glob.glob(os.path.join(tempfile.gettempdir(), "spotwarp-local-*")))
    base = ["launch", "--project-id", PROJECT, "--storage", fresh, "--provider", "local"]
    cases = [
        ([*base, "--candidates", "1000"], "at most 16 candidates"),
        ([*base, "--max-price", "1e309"], "at most 1000"),
        ([*base, "--provider-option", "grace="], "grace must be one number"),
        ([*base, "--provider-option", "colour=red"], "unknown option 'colour'"),
        (["launch", "--project-id", "", "--storage", fresh, "--provider", "local"], "empty"),
        (base, "has no snapshot"),  # a typo'd prefix: refused, not an empty session "restored"
    ]
    for args, message in cases:
        out = cli(tmp_path, *args)
        assert out.returncode in (1, 2) and message in out.stderr, (args, out.stderr)
        assert len(out.stderr.strip().splitlines()) == 1, out.stderr
        assert len(out.stderr) < 500, out.stderr
    assert not os.path.exists(fresh)
    assert set(glob.glob(os.path.join(tempfile.gettempdir(), "spotwarp-local-*"))) == local_roots


def test_local_candidates_keep_the_token_off_their_command_lines_and_losers_leave_no_folder(tmp_path):
    store = str(tmp_path / "store")
    seed_project(tmp_path, store)
    argv = [sys.executable, "-m", "spotwarp_jupyter.cli", "launch", "--project-id", PROJECT, "--storage", store,
            "--provider", "local", "--candidates", "2", "--provider-option", "delays=0,4",
            "--provider-option", f"root={tmp_path / 'candidates'}", "--json"]
    try:
        out = subprocess.run(argv, capture_output=True, text=True, env=env_for(tmp_path), timeout=300)
        assert out.returncode == 0, out.stderr
        events = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
        token = next(e for e in events if e["event"] == "provider_note")["note"].split("token is ", 1)[1].split()[0]
        winner = next(e for e in events if e["event"] == "promoted")["candidate"]
        loser = next(c["id"] for c in next(e for e in events if e["event"] == "race_started")["candidates"]
                     if c["id"] != winner)
        for pid in running(winner):
            assert token not in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
        url = read_heartbeat(engine_for(store).store, winner)["url"]
        import urllib.request
        with urllib.request.urlopen(f"{url}spotwarp/api/status?token={token}", timeout=30) as answer:
            assert answer.status == 200
        assert (tmp_path / "candidates" / winner).is_dir()
        assert not (tmp_path / "candidates" / loser).exists()  # a full workspace copy, gone with its candidate
    finally:
        cleanup(store, tmp_path)


def test_watch_checks_dead_after_against_the_watched_hosts_own_interval(tmp_path):
    store = str(tmp_path / "store")
    seed_project(tmp_path, store)
    out = subprocess.run([sys.executable, "-m", "spotwarp_jupyter.cli", "launch", "--project-id", PROJECT,
                          "--storage", store, "--provider", "local", "--candidates", "1", "--provider-option",
                          f"root={tmp_path / 'candidates'}"], capture_output=True, text=True,
                         env=env_for(tmp_path, SPOTWARP_HEARTBEAT_INTERVAL="3"), timeout=300)
    assert out.returncode == 0, out.stderr
    try:
        watch = cli(tmp_path, "watch", "--project-id", PROJECT, "--storage", store, "--provider", "local",
                    "--dead-after", "4s")  # fine for this machine's 1 s beats, too short for the host's 3 s
        assert watch.returncode == 1 and "which beats every 3.0 s" in watch.stderr, watch.stderr
        assert len(watch.stderr.strip().splitlines()) == 1
    finally:
        cleanup(store, tmp_path)


# -- forgeries: a store writer without SPOTWARP_KEY ------------------------------------------

KEY = "forgery-test-key-4711-not-a-secret"
ATTACKER_URL = "http://attacker.invalid:8888/"
NO_PID = 999_999_999  # above any pid_max: a forged heartbeat's pid that a clean-up can never signal


def forge(store: Any, name: str, doc: Any) -> None:
    """Write `doc` unsigned at `name` under the project, as a store writer without the key can."""
    store.write_record(f"{store.root}/{name}", json.dumps(doc).encode())


def signed_project(tmp_path: Path, kind: str, request: Any) -> tuple[str, dict[str, str], SnapshotEngine]:
    """A project whose snapshot is signed with KEY, on a local folder or moto S3; its URL, launch env, engine."""
    extra: dict[str, str] = {"SPOTWARP_KEY": KEY}
    if kind == "local":
        url, options = str(tmp_path / "store"), {}
    else:
        target = request.getfixturevalue("s3_server").target()
        url, options = target.url, target.options
        extra.update(target.env, SPOTWARP_STORAGE_OPTIONS=json.dumps(options))
    settings = Settings.resolve(project=PROJECT, storage=url,
                                env={"SPOTWARP_STORAGE_OPTIONS": json.dumps(options)} if options else {})
    engine = SnapshotEngine(settings, key=KEY.encode(), fence=Fence(), create=True)
    ws = tmp_path / "origin"
    (ws / "data").mkdir(parents=True)
    (ws / "data" / "blob.bin").write_bytes(os.urandom(50_000))
    engine.snapshot_project(str(ws))
    return url, env_for(tmp_path, **extra), engine


def signed_cleanup(engine: SnapshotEngine, tmp_path: Path) -> None:
    """Every real candidate's process group (pids from signed heartbeats only) and kernels under tmp_path."""
    from spotwarp_jupyter.engine.coordination.heartbeats import heartbeat_ids

    for ident in heartbeat_ids(engine.store):
        doc = read_heartbeat(engine.store, ident, key=KEY.encode())
        for sig in (signal.SIGCONT, signal.SIGKILL):
            try:
                if doc is not None:
                    os.killpg(int(doc["pid"]), sig)
            except (ProcessLookupError, PermissionError):
                pass
    cleanup(str(tmp_path / "no-store"), tmp_path)
    kill_under(tmp_path)


def kill_under(tmp_path: Path) -> None:
    """Every process whose command line names a path under tmp_path (candidates' servers, their kernels): what a
    forged heartbeat's pid hid from the clean-up."""
    for pid in running(str(tmp_path)):
        if pid != os.getpid():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


class Forger:
    """A thread writing forged records over and over until stopped (a store writer keeping a host 'alive')."""

    def __init__(self, write: Any):
        self.stop = threading.Event()
        self.written, self.error = 0, None
        self.thread = threading.Thread(target=self._run, args=(write,), daemon=True)
        self.thread.start()

    def _run(self, write: Any) -> None:
        try:
            while not self.stop.wait(0.1):  # a steady stream of forgeries, not a synchronisation
                write(self.written)
                self.written += 1
        except Exception as exc:  # noqa: BLE001 - said by end(): a forger that died proves nothing
            self.error = exc

    def end(self, at_least: int = 3) -> None:
        """Stop it; fail unless it kept forging (`at_least` writes, no error)."""
        self.stop.set()
        self.thread.join(timeout=10)
        assert self.error is None and self.written >= at_least, (self.error, self.written)


@pytest.mark.parametrize("kind", ["local", "s3"])
def test_forgeries_without_the_key_change_nothing(tmp_path, kind, request):
    """With SPOTWARP_KEY set, a store writer without it: a lease at generation 99 and a notice_seen event for the
    holder stop nothing and fail nothing over; an unsigned newest manifest is skipped by the next candidates;
    fresh forged heartbeats (and replayed signed ones) of a dead holder do not hide its loss; forged ready
    heartbeats of the race's candidates promote nobody early and never put the attacker's URL on screen or in
    the journal."""
    from spotwarp_jupyter.engine.journal.events import Event

    url, env, engine = signed_project(tmp_path, kind, request)
    store, key = engine.store, KEY.encode()
    launch = Launch(tmp_path, url, "--candidates", "1", "--watch", "--dead-after", "4s", "--provider-option",
                    "delays=3", env=env)
    forger = None
    try:
        first = launch.next("promoted")
        launch.next("failover_finished")
        holder = first["candidate"]
        forge(store, "lease/000000000099.json", {"generation": 99, "holder": "attacker", "time": time.time()})
        notice = Event(NOTICE_SEEN, time.time(), "attacker", details={
            "host_id": holder, "fatal": True, "source": "forged", "kind": "preemption", "window_s": 1.0})
        forge(store, f"events/{notice.name}", notice.as_dict())
        during = launch.quiet(10)
        assert not [e for e in during if e["event"] in ("host_lost", "race_started")], during
        assert launch.proc.poll() is None, launch.stderr_path.read_text()
        beat = read_heartbeat(store, holder, key=key)
        assert beat is not None and beat["state"] == "holder", beat  # not fenced by generation 99
        code, snap = attach(first["url"], tmp_path / "first.log").request(
            "POST", "spotwarp/api/snapshots", {"message": "after the forgeries"})
        assert code == 201 and snap["generation"] == first["generation"], snap  # it still writes

        latest = engine.with_files("latest")  # the newest signed snapshot with files: the next candidates restore it
        assert latest is not None and latest.generation == first["generation"]
        unsigned = dataclasses.replace(latest, id="forgedaa", created=time.time(),
                                       generation=latest.generation + 5)
        store.write_manifest(unsigned.name, unsigned.to_bytes(None))

        path = f"{store.root}/hosts/{holder}.json"
        older = store.read_record(path)
        wait_for(lambda: (read_heartbeat(store, holder, key=key) or {}).get("beat", 0) > json.loads(older)["beat"],
                 "a newer beat of the holder", timeout=30)
        newer = store.read_record(path)
        os.killpg(beat["pid"], signal.SIGKILL)  # the holder dies; a forger keeps its heartbeat "fresh"
        killed = time.monotonic()
        forged = json.loads(newer)
        forged.pop("signature")

        def keep_alive(i: int) -> None:  # in turn: a fresh unsigned beat, and signed ones replayed (older than seen)
            if i % 3 == 0:
                forge(store, f"hosts/{holder}.json", {**forged, "beat": forged["beat"] + 1000 + i, "time": time.time()})
            else:
                store.fs.pipe_file(path, older if i % 3 == 1 else newer)

        forger = Forger(keep_alive)
        lost = launch.next("host_lost", timeout=40)
        assert lost["lost"] == holder and time.monotonic() - killed <= 4 + 8, lost
        forger.end()
        forger = None

        race = launch.next("race_started", timeout=60)
        for c in race["candidates"]:  # ready at once, says the store; the real ones sleep 3 s first
            forge(store, f"hosts/{c['id']}.json", {
                "id": c["id"], "candidate": c["id"], "generation": race["generation"], "state": "standby",
                "ready": True, "time": time.time(), "beat": 1, "interval": 1.0, "pid": NO_PID, "host": "attacker",
                "url": ATTACKER_URL, "started_at": time.time(), "ready_at": time.time(),
                "restore": {"snapshot": "forgedaa", "duration_s": 0.1}})
        second = launch.next("promoted", timeout=180)
        finished = launch.next("failover_finished")
        assert second["url"].startswith("http://127.0.0.1:"), second  # the provider's address, not the store's
        winner = [c for c in finished["candidates"] if c["id"] == second["candidate"]][0]
        assert winner["restored"] == latest.id, winner  # the newest signed snapshot, past the unsigned one
        log = (tmp_path / "candidates" / second["candidate"] / "candidate.log").read_text()
        assert "SpotWarp: skipping" in log and "forgedaa" in log, log[-3000:]
        assert "attacker" not in json.dumps(launch.seen)
        assert not [e for e in Journal(store).events() if "attacker" in json.dumps(e.details)]
        assert read_lease(store, key=key).holder == second["candidate"]
    finally:
        if forger is not None:
            forger.stop.set()
        launch.stop()
        signed_cleanup(engine, tmp_path)


def test_a_watch_never_adopts_a_phantom_host(tmp_path):
    """A forged heartbeat that keeps changing, of a host that serves nothing: with SPOTWARP_KEY set, `spotwarp
    watch` finds no live host (one line, exit 1) instead of adopting the phantom."""
    url, env, engine = signed_project(tmp_path, "local", None)
    phantom = {"id": "phantom-8888", "candidate": None, "generation": 0, "state": "serving", "ready": True,
               "interval": 1.0, "pid": NO_PID, "host": "attacker", "url": ATTACKER_URL}
    forger = Forger(lambda i: forge(engine.store, "hosts/phantom-8888.json", {**phantom, "beat": i, "time": time.time()}))
    try:
        wait_for(lambda: read_heartbeats(engine.store), "the phantom's first heartbeat", timeout=10)
        before = forger.written
        out = subprocess.run([sys.executable, "-m", "spotwarp_jupyter.cli", "watch", "--project-id", PROJECT,
                              "--storage", url, "--provider", "local", "--dead-after", "4s"],
                             capture_output=True, text=True, env=env, timeout=60)
        assert out.returncode == 1 and "no live host serves" in out.stderr, out
        assert "phantom" not in out.stdout
        # it changed while the watch looked: the watch decides at its first look (about 0.5 s with its imports),
        # and a loaded disk's fsyncs can make the 0.1 s stream of forgeries as slow as one write in that time
        assert forger.written - before >= 1, forger.written
    finally:
        forger.end(at_least=2)


def test_the_address_shown_is_the_providers_never_one_from_the_store(tmp_path):
    """Without a key, a store writer can mark the race's candidates ready before they are (nothing tells a forged
    heartbeat from a real one), but the address printed and journalled is the one the provider's own handle
    knows, never the attacker's URL from the store."""
    store = str(tmp_path / "store")
    seed_project(tmp_path, store)
    launch = Launch(tmp_path, store, "--candidates", "1", "--provider-option", "delays=3", env=env_for(tmp_path))
    try:
        race = launch.next("race_started")
        for c in race["candidates"]:
            forge(engine_for(store).store, f"hosts/{c['id']}.json", {
                "id": c["id"], "candidate": c["id"], "generation": race["generation"], "state": "standby",
                "ready": True, "time": time.time(), "beat": 1, "interval": 1.0, "pid": NO_PID, "host": "attacker",
                "url": ATTACKER_URL, "started_at": time.time(), "ready_at": time.time()})
        promoted = launch.next("promoted")
        launch.next("failover_finished")
        assert promoted["url"].startswith("http://127.0.0.1:"), promoted
        assert launch.proc.wait(timeout=120) == 0, launch.stderr_path.read_text()
        assert "attacker.invalid" not in json.dumps(launch.seen)
        journal = Journal(engine_for(store).store).events()
        assert journal and not [e for e in journal if "attacker.invalid" in json.dumps(e.details)]
    finally:
        launch.stop()
        cleanup(store, tmp_path)
        kill_under(tmp_path)


def test_a_flood_of_unsigned_lease_entries_fails_nothing_over(tmp_path, request):
    """With SPOTWARP_KEY set, on moto S3, a store writer without it adds 65 lease entries above the holder's
    generation (junk and well-formed): the watch keeps the holder, races nobody, and the lease stays at the
    holder's generation; the holder still writes."""
    url, env, engine = signed_project(tmp_path, "s3", request)
    store, key = engine.store, KEY.encode()
    launch = Launch(tmp_path, url, "--candidates", "1", "--watch", "--dead-after", "4s", env=env)
    try:
        first = launch.next("promoted")
        launch.next("failover_finished")
        holder, generation = first["candidate"], first["generation"]
        for g in range(generation + 1, generation + 66):
            forge(store, f"lease/{g:012d}.json",
                  {"generation": g, "holder": "attacker", "time": time.time()} if g % 2 else "{not json")
        during = launch.quiet(10)
        assert not [e for e in during if e["event"] in ("host_lost", "race_started")], during
        assert launch.proc.poll() is None, launch.stderr_path.read_text()
        lease = read_lease(store, key=key)
        assert (lease.generation, lease.holder) == (generation, holder)
        beat = read_heartbeat(store, holder, key=key)
        assert beat is not None and beat["state"] == "holder", beat
        code, snap = attach(first["url"], tmp_path / "first.log").request(
            "POST", "spotwarp/api/snapshots", {"message": "after the flood"})
        assert code == 201 and snap["generation"] == generation, snap
    finally:
        launch.stop()
        signed_cleanup(engine, tmp_path)
