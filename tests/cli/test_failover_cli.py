"""`spotwarp hosts`: a host silent for several heartbeats shows as lost, never as the serving holder."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from spotwarp_jupyter.engine.coordination import write_heartbeat

from engines import make_engine


@pytest.mark.process
def test_a_holder_silent_for_minutes_is_shown_lost(tmp_path):
    store = str(tmp_path / "store")
    engine = make_engine(store, "demo", create=True)
    now = time.time()
    write_heartbeat(engine.store, {"id": "cand-old", "state": "holder", "generation": 2, "time": now - 300,
                                   "interval_s": 5.0, "url": "http://old:8888/"})
    write_heartbeat(engine.store, {"id": "cand-new", "state": "holder", "generation": 3, "time": now,
                                   "interval_s": 5.0, "url": "http://new:8888/"})
    env = {**os.environ, "HOME": str(tmp_path)}
    cli = [sys.executable, "-m", "spotwarp_jupyter.cli", "hosts", "--project-id", "demo", "--storage", store]
    out = subprocess.run(cli, capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    rows = {line.split()[0]: line for line in out.stdout.splitlines()[2:]}
    assert "lost (was holder)" in rows["cand-old"] and "lost" not in rows["cand-new"], out.stdout
    data = json.loads(subprocess.run([*cli, "--json"], capture_output=True, text=True, env=env, timeout=120).stdout)
    assert {h["id"]: h["silent"] for h in data["hosts"]} == {"cand-old": True, "cand-new": False}


@pytest.mark.process
def test_a_refused_watch_leaves_nothing_in_the_store(tmp_path):
    store = tmp_path / "store"
    store.mkdir()
    out = subprocess.run([sys.executable, "-m", "spotwarp_jupyter.cli", "watch", "--project-id", "demo", "--storage",
                          str(store), "--provider", "local", "--dead-after", "1s"],
                         capture_output=True, text=True, env={**os.environ, "HOME": str(tmp_path)}, timeout=120)
    assert out.returncode == 1 and "--dead-after 1.0 s is too short" in out.stderr, out
    assert len(out.stderr.strip().splitlines()) == 1
    assert list(store.iterdir()) == [], "a refused watch created the project folder"


def test_the_stop_line_is_words_not_json():
    from spotwarp_jupyter.cli.failover import _launch_line

    line = _launch_line("stopped", {"holder": "g1c0-0766", "leaks": []})
    assert line == "stopped watching: g1c0-0766 stays up and serves the session"


def test_a_winner_that_never_shows_itself_holder_is_warned_about(tmp_path):
    """A winner reading the lease with another SPOTWARP_KEY refuses the entry that promoted it and stays in standby:
    the launch says so, naming the key, instead of carrying on silently."""
    from spotwarp_jupyter.cli.failover import _launch_line
    from spotwarp_jupyter.engine.storage import Store
    from spotwarp_jupyter.failover.provider import Offer
    from spotwarp_jupyter.failover.race import Candidate, RaceResult, wait_promotion_seen

    store = Store(str(tmp_path / "store"), "demo")
    beat = {"id": "g1c0-aaaa", "candidate": "g1c0-aaaa", "generation": 1, "state": "standby", "time": time.time(),
            "beat": 1}
    write_heartbeat(store, beat)
    result = RaceResult("r", 1, "local", time.time(), winner=Candidate("g1c0-aaaa", Offer("local", "local", None,
                                                                                            "slot-0", None, None)))
    said: list = []
    assert not wait_promotion_seen(store, result, timeout=1.0, poll_s=0.1, on_event=lambda k, d: said.append((k, d)))
    assert said == [("promotion_unseen", {"candidate": "g1c0-aaaa", "waited_s": 1.0})]
    assert "SPOTWARP_KEY" in _launch_line(*said[0]) and "g1c0-aaaa" in _launch_line(*said[0])
    write_heartbeat(store, {**beat, "state": "holder", "beat": 2})
    said.clear()
    assert wait_promotion_seen(store, result, timeout=5.0, poll_s=0.1, on_event=lambda k, d: said.append((k, d)))
    assert said == []
