"""`spotwarp launch --watch --standby 1`: a candidate waits in standby while the holder lives; a loss promotes it.

The standby restored the snapshot that was newest when it started; the holder then changes, adds and deletes
files and snapshots them. Once the holder is SIGKILLed, the race takes the standby without launching anything,
and the promoted standby's workspace is the holder's newest snapshot (not the one it restored), as is its
promotion snapshot. Before its promotion it wrote nothing to the project.
"""

from __future__ import annotations

import os
import signal

import pytest
from failover_hosts import Launch, attach, cleanup, engine_for, env_for, seed_project

from spotwarp_jupyter.engine.coordination.heartbeats import read_heartbeat

from lab_server import tree
from new_hosts import PROJECT_KEY
from waiting import wait_for

pytestmark = pytest.mark.slow  # a launch, a standby, a kill


def test_a_standby_is_promoted_at_once_with_the_files_the_holder_committed_after_it_started(tmp_path):
    store = str(tmp_path / "store")
    seed_project(tmp_path, store)
    engine = engine_for(store)
    launch = Launch(tmp_path, store, "--candidates", "1", "--watch", "--dead-after", "4s", "--standby", "1",
                    env=env_for(tmp_path, SPOTWARP_RESUME_KERNELS="false"))
    try:
        first = launch.next("promoted")
        launch.next("failover_finished")
        standby = launch.next("standby_ready", timeout=300)
        assert standby["generation"] == 2 and standby["candidate"].startswith("g2s"), standby
        ws_standby = tmp_path / "candidates" / standby["candidate"] / "ws"
        assert (ws_standby / "data" / "blob.bin").is_file()
        # after the standby restored: the holder adds, changes and deletes files, and snapshots them
        ws_first = tmp_path / "candidates" / first["candidate"] / "ws"
        (ws_first / "data" / "notes.txt").write_text("written on the holder after the standby started\n")
        (ws_first / "train.ipynb").write_text((ws_first / "train.ipynb").read_text().replace("}", "} ", 1))
        (ws_first / "data" / "blob.bin").unlink()
        holder = attach(first["url"], tmp_path / "first.log")
        code, snap = holder.request("POST", "spotwarp/api/snapshots", {"message": "after the standby started"})
        assert code == 201 and snap["generation"] == 1, snap
        expected = tree(ws_first)
        assert tree(ws_standby) != expected
        written_before = {m.id for m in engine.manifests()}

        os.killpg(read_heartbeat(engine.store, first["candidate"])["pid"], signal.SIGKILL)  # no notice
        launch.next("host_lost", timeout=60)
        race = launch.next("race_started")
        assert [c["id"] for c in race["candidates"]] == [standby["candidate"]], race  # nothing launched
        second = launch.next("promoted")
        assert second["candidate"] == standby["candidate"] and second["generation"] == 2
        launch.next("failover_finished")
        promotion = wait_for(lambda: next((m for m in engine.manifests() if m.message == "promoted: generation 2"),
                                          None), "the promotion snapshot", timeout=120)
        assert sorted(promotion.files["entries"]) == sorted(engine.get(snap["id"]).files["entries"])
        assert "data/blob.bin" not in promotion.files["entries"] and "data/notes.txt" in promotion.files["entries"]
        assert tree(ws_standby) == expected  # byte-identical to the holder's newest snapshot
        # the standby wrote nothing before its promotion: every manifest of its own is the promotion's or later
        own = [m for m in engine.manifests() if m.id not in written_before]
        assert own and all(m.holder == standby["candidate"] and m.generation == 2 for m in own), own
        third = launch.next("standby_ready", timeout=300)  # the next standby, for generation 3
        assert third["generation"] == 3, third
        launch.stop()
        assert launch.proc.returncode == 0, launch.stderr_path.read_text()
    finally:
        launch.stop()
        cleanup(store, tmp_path)


def test_a_standbys_warm_kernel_becomes_the_resumed_sessions_kernel(tmp_path):
    """In standby: a kernel for the notebook, no session, nothing written; once promoted that kernel is resumed."""
    store = str(tmp_path / "store")
    seed_project(tmp_path, store, PROJECT_KEY)  # signed: a standby warms only kernels its key vouches for
    engine = engine_for(store)
    launch = Launch(tmp_path, store, "--candidates", "1", "--watch", "--dead-after", "4s", "--standby", "1",
                    env=env_for(tmp_path, SPOTWARP_KEY=PROJECT_KEY))
    try:
        first = launch.next("promoted")
        standby = launch.next("standby_ready", timeout=300)
        log = tmp_path / "candidates" / standby["candidate"] / "candidate.log"
        wait_for(lambda: "the warm kernel for train.ipynb imported" in log.read_text(errors="replace"),
                 "the standby's warm kernel", timeout=120)
        warm = attach(f"http://127.0.0.1:{read_heartbeat(engine.store, standby['candidate'])['port']}/",
                      tmp_path / "standby.log")
        kernels = warm.request("GET", "api/kernels")[1]
        assert len(kernels) == 1 and warm.request("GET", "api/sessions")[1] == [], kernels
        written_before = {m.id for m in engine.manifests()}
        assert not [m for m in engine.manifests() if m.holder == standby["candidate"]]

        os.killpg(read_heartbeat(engine.store, first["candidate"])["pid"], signal.SIGKILL)  # no notice
        second = launch.next("promoted", timeout=120)
        assert second["candidate"] == standby["candidate"]
        entry = wait_for(lambda: next((e for e in warm.request("GET", "spotwarp/api/status")[1].get("resume") or []
                                       if e.get("state") == "restored"), None), "the resumed kernel", timeout=120)
        assert entry["kernel_id"] == kernels[0]["id"], (entry, kernels)
        sessions = warm.request("GET", "api/sessions")[1]
        assert [(s["path"], s["kernel"]["id"]) for s in sessions] == [("train.ipynb", kernels[0]["id"])]
        nb = warm.open_notebook("train.ipynb")
        assert nb.value("weights") == [0.5, 1.5] and nb.value("step") == 7
        nb.close()
        assert all(m.generation == 2 for m in engine.manifests() if m.id not in written_before)
    finally:
        launch.stop()
        cleanup(store, tmp_path)
