"""Automatic, background snapshots: consistent point-in-time images, one in flight, crash-safe writer."""

from __future__ import annotations

import json
import random
import time

import numpy as np
import pytest

from engines import make_engine
from kernels import SESSION


def test_mutation_during_a_background_snapshot_is_never_mixed_in(start_kernel, store_url):
    k = start_kernel("host")
    k.run("%load_ext spotwarp\n%spotwarp off\nimport numpy as np\n" + SESSION +
          "x = np.full(40_000_000, 1.0, dtype=np.float32)\nmeta = {'gen': 1}")
    # start the writer, then change everything at once while it is still writing
    out = k.run("job = s.snapshot_in_background()\n"
                "x[:] = 2.0\nmeta['gen'] = 2\n"
                "still_running = not job.done.is_set()\n"
                "s.wait_in_flight(120)\nprint(still_running, s.last_error)")
    assert out.split()[-1] == "None", out
    ns: dict = {}
    manifest, _ = make_engine(store_url, resolved=False).restore_kernel("latest", ns)
    assert manifest.stats["mode"] == "background"
    assert ns["meta"] == {"gen": 1}
    assert np.all(ns["x"] == 1.0), "the snapshot saw part of a later update"


def test_automatic_snapshots_after_cells_by_policy(start_kernel, store_url):
    k = start_kernel("host")
    k.run("%load_ext spotwarp\n%spotwarp policy --every 1s\n" + SESSION + "counter = 0")
    engine = make_engine(store_url, resolved=False)
    deadline = time.monotonic() + 60
    seen: set[int] = set()
    i = 0
    while time.monotonic() < deadline and len(seen) < 2:
        i += 1
        # each cell runs a while; a snapshot is started after a cell once 1 s has passed
        k.run(f"counter = {i}\nimport time as _t; _t.sleep(0.3)")
        k.run("s.wait_in_flight(60)")
        for m in engine.manifests():
            ns: dict = {}
            engine.restore_kernel(m.id, ns)
            seen.add(ns["counter"])
    assert len(seen) >= 2, f"automatic snapshots did not follow the cells: {seen}"
    status = k.run("%spotwarp status")
    assert "every 1.0 s" in status and "last " in status
    assert k.value("s.status()['last_snapshot']['pause_s'] < 5")


def test_off_means_no_automatic_snapshots(start_kernel, store_url):
    k = start_kernel("host")
    k.run("%load_ext spotwarp\n%spotwarp policy --every 1s\n%spotwarp off\nimport time\ntime.sleep(1.2)")
    k.run("x = 1")
    assert make_engine(store_url, resolved=False).manifests() == []


def test_only_one_snapshot_in_flight(start_kernel):
    k = start_kernel("host")
    k.run("%load_ext spotwarp\n%spotwarp off\nimport numpy as np\n" + SESSION + "x = np.ones(30_000_000)")
    out = k.run("first = s.snapshot_in_background()\nsecond = s.snapshot_in_background()\n"
                "print(first is not None, second is None or second is first)\n_ = s.wait_in_flight(120)")
    assert out.split() == ["True", "True"]


@pytest.mark.parametrize("seed", range(3))
def test_killed_background_writer_leaves_last_snapshot_intact(start_kernel, store_url, seed):
    k = start_kernel("host")
    k.run("%load_ext spotwarp\n%spotwarp off\nimport numpy as np, os, signal, time\n" + SESSION +
          "x = np.full(30_000_000, 1.0)\n%spotwarp snapshot -m first")
    delay = random.Random(seed).uniform(0.0, 0.6)
    out = k.run("x[:] = 2.0\njob = s.snapshot_in_background()\n"
                f"time.sleep({delay})\n"  # the random kill point
                "job.kill()\n_ = s.wait_in_flight(60)\n"
                "print('@@', job.result.ok, s.last_error)")
    line = [ln for ln in out.splitlines() if ln.startswith("@@")][-1]
    engine = make_engine(store_url, resolved=False)
    listing = engine.manifests()
    assert not engine.rejected
    assert engine.verify().ok
    if "False" in line:  # killed before it committed
        assert "killed by signal 9" in line
        assert [m.message for m in listing] == ["first"]
    ns: dict = {}
    newest, _ = engine.restore_kernel("latest", ns)
    assert np.all(ns["x"] == (1.0 if newest.message == "first" else 2.0))
    # the next snapshot works and is complete
    k.run("x[:] = 3.0\n%spotwarp snapshot -m after")
    ns = {}
    engine.restore_kernel("latest", ns)
    assert np.all(ns["x"] == 3.0)


def test_without_fork_snapshots_are_synchronous(start_kernel, store_url):
    k = start_kernel("host", SPOTWARP_NO_FORK="1")
    k.run("%load_ext spotwarp\n%spotwarp off\n" + SESSION + "x = [1, 2, 3]\nm = s.snapshot_in_background()")
    assert k.value("type(m).__name__") == "Manifest"
    ns: dict = {}
    manifest, _ = make_engine(store_url, resolved=False).restore_kernel("latest", ns)
    assert ns["x"] == [1, 2, 3] and "mode" not in manifest.stats


def test_keep_retention_prunes_old_snapshots(start_kernel, store_url):
    k = start_kernel("host")
    k.run("%load_ext spotwarp\n%spotwarp off\n%spotwarp policy --keep 2")
    for i in range(4):
        k.run(f"v = {i}\n%spotwarp snapshot")
    k.run(SESSION + "assert s.pruner.wait(60)")  # pruning runs after the commit, in a thread of its own
    engine = make_engine(store_url, resolved=False)
    assert len(engine.manifests()) == 2
    ns: dict = {}
    engine.restore_kernel("latest", ns)
    assert ns["v"] == 3
    assert engine.verify().ok


# a spy around the real gc (it still runs): which thread runs it
GC_SPY = """
import threading
from spotwarp_jupyter.engine import SnapshotEngine
_real_gc, _gc_threads = SnapshotEngine.gc, []
def _spy_gc(self, *args, **kwargs):
    _gc_threads.append(threading.current_thread().name)
    return _real_gc(self, *args, **kwargs)
SnapshotEngine.gc = _spy_gc
"""


@pytest.mark.parametrize("how", ["magic", "background"])
def test_keep_prunes_outside_the_users_cell(start_kernel, store_url, how):
    """`--keep` used to run a full gc inside the cell of a `%spotwarp snapshot` (or in the reaper of a background one)."""
    k = start_kernel("host")
    k.run("%load_ext spotwarp\n%spotwarp off\n%spotwarp policy --keep 1\n" + SESSION + GC_SPY)
    for i in range(3):
        if how == "magic":
            k.run(f"v = {i}\n%spotwarp snapshot")
        else:
            k.run(f"v = {i}\ns.snapshot_in_background()\ns.wait_in_flight(60)")
    k.run("assert s.pruner.wait(60)")
    threads = k.value("_gc_threads")
    assert threads and set(threads) == {"spotwarp-keep"}, threads
    engine = make_engine(store_url, resolved=False)
    (newest,) = engine.manifests()
    ns: dict = {}
    engine.restore_kernel(newest.id, ns)
    assert ns["v"] == 2 and engine.verify().ok and k.value("s.pruner.last_error") is None


def test_a_failing_prune_is_reported_once_and_clears_when_it_works_again(tmp_path, caplog):
    from spotwarp_jupyter.kernel.retention import Pruner

    engine = make_engine(tmp_path / "store", resolved=False)
    for i in range(3):
        engine.snapshot_kernel({"v": i})
    locks = tmp_path / "store" / "proj" / "locks"
    locks.rmdir()
    locks.write_text("not a folder")  # gc cannot take its lease here
    pruner = Pruner()
    with caplog.at_level("WARNING", logger="spotwarp"):
        for _ in range(3):
            pruner.after_commit(lambda: make_engine(tmp_path / "store", resolved=False), 1)
            assert pruner.wait(60)
    failures = [r for r in caplog.records if "--keep" in r.getMessage()]
    assert len(failures) == 1 and "\n" not in failures[0].getMessage() and pruner.last_error
    assert len(engine.manifests()) == 3  # nothing dropped by a failed pass
    locks.unlink()
    locks.mkdir()
    pruner.after_commit(lambda: make_engine(tmp_path / "store", resolved=False), 1)
    assert pruner.wait(60) and pruner.last_error is None \
        and len(make_engine(tmp_path / "store", resolved=False).manifests()) == 1


PRIORITY = ("import json, numpy as np, os, threading, time\n"
            "from spotwarp_jupyter import safepoints\nfrom spotwarp_jupyter.kernel import notices\n"
            "x = np.random.default_rng(0).random(20_000_000)\n"
            "def below(pid):\n"
            "    return os.getpriority(os.PRIO_PROCESS, pid) - os.getpriority(os.PRIO_PROCESS, 0)\n")


def test_a_periodic_writer_runs_below_the_kernel_an_urgent_one_at_its_priority(start_kernel):
    k = start_kernel("host")
    k.run("%load_ext spotwarp\n%spotwarp off\n" + SESSION + PRIORITY)
    periodic = k.run("job = s.snapshot_in_background()\nprint(below(job.pid))\nok = s.wait_in_flight(120)")
    assert int(periodic.split()[-1]) > 0, periodic  # training keeps the CPU
    k.run("x += 1")
    urgent = k.run("job = s.snapshot_in_background(urgent=True)\nprint(job.pid is not None, below(job.pid))\n"
                   "ok = s.wait_in_flight(120)\nprint(s.last_error)")
    # set from the kernel at fork: lowering it back later needs a privilege a user's kernel rarely has
    assert urgent.split() == ["True", "0", "None"], urgent


def test_a_notices_writer_is_never_set_below_the_kernels_priority(start_kernel, store_url):
    k = start_kernel("host")
    k.run("%load_ext spotwarp\n%spotwarp off\n" + SESSION + PRIORITY)
    # every priority the kernel gives a process, and the writer's own as the kernel's other threads see it
    k.run("calls, seen = [], []\nreal_setpriority = os.setpriority\n"
          "def setpriority(which, who, value):\n"
          "    calls.append((who, value - os.getpriority(os.PRIO_PROCESS, 0)))\n"
          "    real_setpriority(which, who, value)\n"
          "os.setpriority = setpriority\n"
          "def watch():\n"
          "    while not seen:\n"
          "        job = s.in_flight\n"
          "        if job is not None and job.pid:\n"
          "            seen.append((job.pid, below(job.pid)))\n"
          "        time.sleep(0.001)\n"
          "s.snapshot()")
    out = k.run("x += 1\nthreading.Thread(target=watch, daemon=True).start()\n"
                "notices._hold_at_safe_point(s.automatic, 'preemption', time.time() + 120)\n"
                "safepoints.request('preemption')\nsafepoints.reached('step')  # a training step's safe point\n"
                "os.setpriority = real_setpriority\n"
                "print(s.last.message, s.last_error)\nprint(json.dumps([seen, calls]))")
    assert "requested: preemption None" in out, out
    seen, calls = json.loads(out.splitlines()[-1])
    assert len(seen) == 1 and seen[0][1] == 0, out  # the writer ran at the kernel's priority from the start
    writer = seen[0][0]
    assert all(delta <= 0 for pid, delta in calls if pid == writer), calls  # and was never set below it
