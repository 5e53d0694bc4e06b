"""Fencing: one writer per project. The lease decides who commits; `latest` never goes to a lower generation;
a standby candidate (and a host that lost the lease) writes nothing, not even on SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from spotwarp_jupyter.engine import SnapshotEngine
from spotwarp_jupyter.engine.coordination.fence import Fence, Fenced, Lease, write_lease
from spotwarp_jupyter.engine.journal.events import Journal

from engines import UNSIGNED, make_engine
from lab_server import LabServer, host_env, kill_kernel
from waiting import wait_for


def engine_for(store: str, fence: Fence) -> SnapshotEngine:
    return make_engine(store, "fp", key=UNSIGNED, fence=fence)


def test_the_lease_decides_who_commits_and_latest_never_goes_down_a_generation(tmp_path):
    store = str(tmp_path / "store")
    plain = engine_for(store, Fence())
    first = plain.snapshot_kernel({"x": 1}, "nb")
    assert first.generation == 0 and "generation" not in json.loads(first.to_bytes())  # no failover: manifests as before
    candidate = engine_for(store, Fence(1, "cand-a"))
    with pytest.raises(Fenced, match="standby"):
        candidate.snapshot_kernel({"x": 2}, "nb")
    write_lease(plain.store, Lease(1, "cand-a", time.time()))
    promoted = candidate.snapshot_kernel({"x": 2}, "nb")
    assert (promoted.generation, promoted.holder) == (1, "cand-a")
    with pytest.raises(Fenced, match="lost the lease to cand-a"):
        plain.snapshot_kernel({"x": 3}, "nb")  # the old writer, back after a partition
    other = engine_for(store, Fence(1, "cand-b"))  # a losing candidate of the same race
    with pytest.raises(Fenced, match="lost the lease"):
        other.snapshot_kernel({"x": 4}, "nb")
    assert [m.id for m in plain.manifests()] == [promoted.id, first.id]

    # a lower generation's snapshot written later (a clock ahead, a commit that slipped through) never becomes latest
    late = plain.new_manifest("kernel", "late", kernels={"nb": {}})
    late.created = time.time() + 3600
    plain.store.write_manifest(late.name, late.to_bytes(None))
    fresh = engine_for(store, Fence())
    assert fresh.get("latest").id == promoted.id and fresh.get("latest", "nb").id == promoted.id


def test_a_commit_racing_a_lease_move_is_taken_back(tmp_path):
    store = str(tmp_path / "store")
    engine = engine_for(store, Fence())
    write = engine.store.write_manifest

    def write_then_lose_the_lease(name: str, data: bytes) -> None:
        write(name, data)
        write_lease(engine.store, Lease(1, "winner", time.time()))  # the orchestrator moves it meanwhile

    engine.store.write_manifest = write_then_lose_the_lease
    with pytest.raises(Fenced):
        engine.snapshot_kernel({"x": 1}, "nb")
    assert engine.store.manifest_names() == []


def test_a_kernel_checks_the_lease_before_it_commits(start_kernel, store_url):
    # the orchestrator signs the lease with the project's key, which the kernel has too
    k = start_kernel("host", SPOTWARP_CANDIDATE_ID="cand-k", SPOTWARP_GENERATION="1", SPOTWARP_KEY="fencing-key")
    k.run("%load_ext spotwarp\nx = 41")
    _out, ename, evalue = k.run_error("%spotwarp snapshot")
    assert "standby" in evalue, (ename, evalue)
    engine = engine_for(store_url, Fence())
    engine = make_engine(store_url, key=UNSIGNED, fence=Fence())
    assert engine.manifests() == []
    write_lease(engine.store, Lease(1, "cand-k", time.time()), key=b"fencing-key")
    k.run("%spotwarp snapshot")
    (m,) = engine.manifests()
    assert (m.generation, m.holder) == (1, "cand-k")
    write_lease(engine.store, Lease(2, "someone-else", time.time()), key=b"fencing-key")
    _out, ename, evalue = k.run_error("x = 42\n%spotwarp snapshot")
    assert "lost the lease to someone-else" in evalue
    assert [x.id for x in engine.manifests()] == [m.id]


def project_with_files(tmp_path: Path, store: str) -> str:
    ws = tmp_path / "origin"
    ws.mkdir()
    (ws / "data.txt").write_text("precious\n")
    (ws / "nb.ipynb").write_text(json.dumps({"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    return engine_for(store, Fence()).snapshot_project(str(ws), message="origin").id


@pytest.mark.process
@pytest.mark.parametrize("lease", ["unmoved", "lost"])
def test_a_sigtermed_candidate_that_is_not_the_holder_writes_nothing(tmp_path, lease):
    store = str(tmp_path / "store")
    origin = project_with_files(tmp_path, store)
    engine = engine_for(store, Fence())
    before = (engine.store.manifest_names(), [e.name for e in Journal(engine.store).events()])
    # a long heartbeat interval: no routine beat between the lease move and the SIGTERM
    env = host_env(tmp_path / "home", SPOTWARP_WATCHERS="signals", SPOTWARP_HEARTBEAT_INTERVAL="60",
                   SPOTWARP_BACKUP_INTERVAL="1")
    server = LabServer(tmp_path / "cand" / "ws", store, "fp", env, tmp_path / "cand.log",
                       start_args=("--candidate-id", "the-loser", "--generation", "1"))
    kernel_pid = None
    try:
        server.wait_ready()
        assert (tmp_path / "cand" / "ws" / "data.txt").read_text() == "precious\n"  # restored, serving
        status = server.request("GET", "spotwarp/api/status")[1]
        assert status["failover"]["candidate"] == "the-loser"
        nb = server.open_notebook("nb.ipynb")
        kernel_pid = nb.value("__import__('os').getpid()")
        nb.run("%load_ext spotwarp\nweights = [1, 2, 3]")
        if lease == "lost":  # the race's winner is promoted, then the losers are torn down
            write_lease(engine.store, Lease(1, "the-winner", time.time()))
        code, answer = server.request("POST", "spotwarp/api/snapshots", {"message": "must not commit"})
        assert code == 409 and ("standby" in answer["message"] or "lost the lease" in answer["message"]), answer
        os.kill(server.proc.pid, signal.SIGTERM)  # what a cloud teardown sends
        assert server.proc.wait(timeout=60) is not None
    finally:
        server.discard()
        kill_kernel(kernel_pid)
    log = server.log()
    assert "no final snapshot" in log, log[-3000:]
    after = (engine.store.manifest_names(), [e.name for e in Journal(engine.store).events()])
    assert after == before, log[-3000:]  # no manifest, no final snapshot, no journal notice
    assert engine_for(store, Fence()).get("latest").id == origin
    heartbeat = json.loads((tmp_path / "store" / "fp" / "hosts" / "the-loser.json").read_text())
    # a standby reads the lease every 0.25 s, so the loser may learn of the move before the SIGTERM comes
    # and say "fenced"; either way it never held the lease, and the restore it reports is the origin
    assert heartbeat["state"] in (("standby",) if lease == "unmoved" else ("standby", "fenced")), heartbeat
    assert heartbeat["restore"]["snapshot"] == origin


@pytest.mark.process
def test_a_host_that_finds_it_lost_the_lease_says_so_and_stops(tmp_path):
    store = str(tmp_path / "store")
    project_with_files(tmp_path, store)
    engine = engine_for(store, Fence())
    write_lease(engine.store, Lease(2, "the-winner", time.time()))
    env = host_env(tmp_path / "home", SPOTWARP_WATCHERS="signals", SPOTWARP_HEARTBEAT_INTERVAL="0.5")
    server = LabServer(tmp_path / "cand" / "ws", store, "fp", env, tmp_path / "cand.log",
                       start_args=("--candidate-id", "late", "--generation", "1"))
    try:
        assert server.proc.wait(timeout=120) is not None  # it stops itself
    finally:
        server.discard()
    assert "lost the lease to the-winner (generation 2)" in server.log()
    heartbeat = json.loads((tmp_path / "store" / "fp" / "hosts" / "late.json").read_text())
    assert heartbeat["state"] == "fenced" and "lost the lease" in heartbeat["why"]
    assert [m.generation for m in engine.manifests()] == [0]


@pytest.mark.process
def test_a_promoted_candidate_commits_its_generation_and_its_final_snapshot(tmp_path):
    store = str(tmp_path / "store")
    project_with_files(tmp_path, store)
    engine = engine_for(store, Fence())
    env = host_env(tmp_path / "home", SPOTWARP_WATCHERS="signals", SPOTWARP_HEARTBEAT_INTERVAL="0.5")
    server = LabServer(tmp_path / "cand" / "ws", store, "fp", env, tmp_path / "cand.log",
                       start_args=("--candidate-id", "the-winner", "--generation", "1"))
    try:
        server.wait_ready()
        write_lease(engine.store, Lease(1, "the-winner", time.time()))
        promotion = wait_for(lambda: next((m for m in engine.manifests() if m.generation == 1), None),
                             "the promotion snapshot")
        assert promotion.holder == "the-winner" and promotion.message == "promoted: generation 1"
        assert "data.txt" in promotion.files["entries"]
        status = server.request("GET", "spotwarp/api/status")[1]
        assert status["failover"]["role"] == "holder"
        os.kill(server.proc.pid, signal.SIGTERM)
        server.proc.wait(timeout=60)
    finally:
        server.discard()
    final = engine_for(store, Fence()).get("latest")
    assert final.message.startswith("final snapshot") and final.generation == 1, server.log()[-3000:]


@pytest.mark.process
def test_start_refuses_half_a_candidate_in_one_line(tmp_path):
    env = host_env(tmp_path / "home")
    for args, message in [(["--candidate-id", "x"], "go together"), (["--candidate-id", "../x", "--generation", "1"],
                                                                     "bad candidate id"),
                          (["--candidate-id", "x", "--generation", "0"], "at least 1")]:
        out = subprocess.run([sys.executable, "-m", "spotwarp_jupyter.cli", "start", "--project-id", "p", "--storage",
                              str(tmp_path / "s"), "--workspace-path", str(tmp_path / "w"), *args],
                             capture_output=True, text=True, env=env, timeout=60)
        assert out.returncode in (1, 2) and message in out.stderr, (args, out.stderr)
        assert len(out.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "w").exists()


@pytest.mark.process
def test_a_holder_whose_lease_vanishes_says_so_and_the_next_race_ranks_above_it(tmp_path):
    from spotwarp_jupyter.failover.lease import move_lease, next_generation

    store = str(tmp_path / "store")
    project_with_files(tmp_path, store)
    engine = engine_for(store, Fence())
    env = host_env(tmp_path / "home", SPOTWARP_WATCHERS="signals", SPOTWARP_HEARTBEAT_INTERVAL="0.5")
    server = LabServer(tmp_path / "cand" / "ws", store, "fp", env, tmp_path / "cand.log",
                       start_args=("--candidate-id", "the-holder", "--generation", "1"))
    beat = tmp_path / "store" / "fp" / "hosts" / "the-holder.json"
    try:
        server.wait_ready()
        move_lease(engine.store, 1, "the-holder")
        wait_for(lambda: next((m for m in engine.manifests() if m.generation == 1), None), "the promotion snapshot")
        for entry in (tmp_path / "store" / "fp" / "lease").iterdir():
            entry.unlink()  # someone deletes the lease
        doc = wait_for(lambda: (d := json.loads(beat.read_text())).get("lease_lost") and d, "a lease_lost heartbeat")
        assert doc["state"] == "standby" and "gone from the store" in doc["why"], doc
        status = server.request("GET", "spotwarp/api/status")[1]
        assert "gone from the store" in (status["failover"]["why"] or ""), status
        code, answer = server.request("POST", "spotwarp/api/snapshots", {"message": "must not commit"})
        assert code == 409, answer
        assert "gone from the store" in server.log()
        assert next_generation(engine.store) == 2  # above the vanished generation 1
    finally:
        server.discard()


@pytest.mark.process
def test_a_plain_start_on_a_failed_over_project_refuses_and_take_over_moves_the_lease(tmp_path):
    import threading

    from spotwarp_jupyter.engine.coordination.fence import read_lease
    from spotwarp_jupyter.failover.lease import move_lease

    store = str(tmp_path / "store")
    origin = project_with_files(tmp_path, store)
    engine = engine_for(store, Fence())
    move_lease(engine.store, 1, "gone-holder")  # a failover happened once; its holder is long gone
    env = host_env(tmp_path / "home", SPOTWARP_WATCHERS="signals", SPOTWARP_HEARTBEAT_INTERVAL="0.5")
    argv = [sys.executable, "-m", "spotwarp_jupyter.cli", "start", "--project-id", "fp", "--storage", store,
            "--workspace-path", str(tmp_path / "plain")]
    out = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 1 and "failed over (lease generation 1, holder gone-holder)" in out.stderr, out.stderr
    assert "--take-over" in out.stderr and len(out.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "plain").exists()

    # a live holder (its heartbeat keeps changing): --take-over refuses
    beat = tmp_path / "store" / "fp" / "hosts" / "gone-holder.json"
    beat.parent.mkdir(parents=True, exist_ok=True)
    stop = threading.Event()

    def beating() -> None:
        n = 0
        while not stop.wait(0.3):
            n += 1
            beat.write_text(json.dumps({"id": "gone-holder", "candidate": "gone-holder", "generation": 1,
                                        "state": "holder", "time": time.time(), "beat": n, "pid": 1}))

    thread = threading.Thread(target=beating)
    thread.start()
    try:
        out = subprocess.run([*argv, "--take-over"], capture_output=True, text=True, env=env, timeout=60)
    finally:
        stop.set()
        thread.join()
    assert out.returncode == 1 and "served by the live host gone-holder" in out.stderr, out.stderr
    assert read_lease(engine.store).generation == 1

    server = LabServer(tmp_path / "taker" / "ws", store, "fp", env, tmp_path / "taker.log", start_args=("--take-over",))
    try:
        server.wait_ready()
        lease = read_lease(engine.store)
        assert lease.generation == 2 and lease.holder.startswith("takeover-"), lease
        promotion = wait_for(lambda: next((m for m in engine.manifests() if m.generation == 2), None),
                             "the take-over's first snapshot")
        assert promotion.holder == lease.holder and "data.txt" in promotion.files["entries"]
        assert server.request("GET", "spotwarp/api/status")[1]["failover"]["role"] == "holder"
        assert engine_for(store, Fence()).get("latest").id != origin
    finally:
        server.discard()


def test_a_manifest_written_after_the_lease_moved_by_a_writer_that_died_never_counts(tmp_path):
    """The writer wrote its manifest after the lease moved on and died before its re-check took it back."""
    from spotwarp_jupyter.failover.lease import move_lease

    store = str(tmp_path / "store")
    plain = engine_for(store, Fence())
    move_lease(plain.store, 1, "old")
    old = engine_for(store, Fence(1, "old"))
    before = old.snapshot_kernel({"x": 1}, "nb")
    late = old.new_manifest("kernel", "written after the move", kernels=dict(before.kernels))
    late.generation, late.holder = 1, "old"
    move_lease(plain.store, 2, "new")  # the orchestrator promotes another host; its first snapshot is not in yet
    old.store.write_manifest(late.name, late.to_bytes(None))  # ... and the old writer's write lands, then it dies
    fresh = engine_for(store, Fence())
    assert fresh.get("latest").id == before.id and late.id not in [m.id for m in fresh.manifests()]
    assert fresh.get("latest", "nb").id == before.id
    new = engine_for(store, Fence(2, "new")).snapshot_kernel({"x": 2}, "nb")
    assert engine_for(store, Fence()).get("latest").id == new.id


@pytest.mark.process
def test_a_failed_promotion_snapshot_is_retried_until_it_lands(tmp_path):
    from spotwarp_jupyter.failover.lease import move_lease

    store = str(tmp_path / "store")
    project_with_files(tmp_path, store)
    engine = engine_for(store, Fence())
    env = host_env(tmp_path / "home", SPOTWARP_WATCHERS="signals", SPOTWARP_HEARTBEAT_INTERVAL="0.5")
    server = LabServer(tmp_path / "cand" / "ws", store, "fp", env, tmp_path / "cand.log",
                       start_args=("--candidate-id", "the-winner", "--generation", "1"))
    snapshots = tmp_path / "store" / "fp" / "snapshots"
    try:
        server.wait_ready()
        snapshots.rename(snapshots.with_name("snapshots.aside"))
        snapshots.write_text("not a folder: every commit fails")
        move_lease(engine.store, 1, "the-winner")
        wait_for(lambda: "promotion snapshot failed (attempt 1)" in server.log(), "a failed promotion snapshot")
        snapshots.unlink()
        snapshots.with_name("snapshots.aside").rename(snapshots)
        promotion = wait_for(lambda: next((m for m in engine.manifests() if m.generation == 1), None),
                             "the retried promotion snapshot", timeout=90)
        assert promotion.message == "promoted: generation 1"
    finally:
        server.discard()
