"""Staged snapshots at a loop's step: the changed buffers copied at the safe point, written from a thread."""

from __future__ import annotations

import json
import pickle

import numpy as np
import pytest

from spotwarp_jupyter.engine.variables.capture import capture_namespace
from spotwarp_jupyter.engine.writers import staged

from engines import engine_settings, make_engine
from kernels import SESSION


def test_a_loops_snapshot_is_a_copy_taken_at_the_step(start_kernel, store_url):
    k = start_kernel("host")
    k.run("%load_ext spotwarp\n%spotwarp off\nimport numpy as np, torch\n" + SESSION +
          "x = np.full(40_000_000, 1.0, dtype=np.float32)\nw = torch.ones(10_000_000)\nmeta = {'gen': 1}\njob = None\ns.snapshot()")
    # the loop's cell names everything it changes; its step then rewrites all of it while the writer works
    out = k.run("job = s.snapshot_in_background(in_loop=True)\n"
                "x[:] = 2.0\nw.add_(1.0)\nmeta['gen'] = 2\n"
                "still_running = not job.done.is_set()\n"
                "s.wait_in_flight(120)\nprint(job.writer, job.pid, still_running, s.last_error)")
    assert out.split()[0:2] == ["staged", "None"] and out.split()[-1] == "None", out
    ns: dict = {}
    make_engine(store_url, resolved=False).restore_kernel("latest", ns)
    assert ns["meta"] == {"gen": 1}
    assert np.all(ns["x"] == 1.0), "the snapshot saw part of a later update"
    assert bool((ns["w"] == 1.0).all()), "the snapshot saw part of a later update"


LOOP = """
w = torch.zeros(20_000_000)
steps = 0
def train(until_staged):
    global steps
    while True:
        w.add_(1.0)
        steps += 1
        safepoints.reached("step")
        if s.last is not None and s.last.stats.get("writer") == "staged" and steps >= until_staged:
            return steps
"""


def test_a_killed_loop_comes_back_on_another_host_at_a_staged_step(start_kernel, store_url):
    a = start_kernel("host-a")
    a.run("%load_ext spotwarp\n%spotwarp policy --every 1s\nimport torch\nfrom spotwarp_jupyter import safepoints\n"
          + SESSION + LOOP)
    # the loop runs on for 200 steps past the committed snapshot, rewriting `w` while it is being stored
    a.run("first = train(0)\nended = train(first + 200)")
    a.kill()
    b = start_kernel("host-b")
    out = b.run("%load_ext spotwarp\n%spotwarp restore latest\n"
                "print('@@', steps, float(w.min()), float(w.max()))")
    line = [ln for ln in out.splitlines() if ln.startswith("@@")][-1].split()
    steps, low, high = int(line[1]), float(line[2]), float(line[3])
    assert steps > 0
    assert low == high == steps, f"w is not the state of step {steps}: {low}..{high}"


def test_a_cells_snapshot_and_a_slow_to_pickle_step_still_fork(start_kernel):
    k = start_kernel("host")
    k.run("%load_ext spotwarp\n%spotwarp off\nimport numpy as np\n" + SESSION +
          "x = np.ones(1_000_000)\nrecords = {i: str(i) for i in range(300_000)}\njob = None\ns.snapshot()")
    cell = k.run("x += 1\njob = s.snapshot_in_background()\ns.wait_in_flight(120)\nprint(job.writer, s.last_error)")
    assert cell.split() == ["fork", "None"], cell
    # a step that changed 300k small objects would pickle for a long pause: the fork does it instead
    step = k.run("records[0] = 'x'\njob = s.snapshot_in_background(in_loop=True)\ns.wait_in_flight(120)\n"
                 "print(job.writer, s.last_error)")
    assert step.split() == ["fork", "None"], step
    k.run("s.snapshot()")  # the cell running during a snapshot counts again at the next: records, once more
    quick = k.run("x += 1\njob = s.snapshot_in_background(in_loop=True)\ns.wait_in_flight(120)\n"
                  "print(job.writer, s.last_error)")
    assert quick.split() == ["staged", "None"], quick


def test_the_staged_writer_keeps_the_kernels_priority(start_kernel):
    # a writer thread set below the kernel would hold the GIL while descheduled on a busy machine, and the
    # training loop would wait for it: it is never lowered (a forked writer is, see test_background.py)
    k = start_kernel("host")
    k.run("%load_ext spotwarp\n%spotwarp off\nimport numpy as np, os\n" + SESSION +
          "x = np.ones(20_000_000)\ncalls = []\nreal_setpriority = os.setpriority\n"
          "def setpriority(which, who, value):\n"
          "    calls.append((who, value - os.getpriority(os.PRIO_PROCESS, 0)))\n"
          "    real_setpriority(which, who, value)\n"
          "job = None\ns.snapshot()\nos.setpriority = setpriority")
    out = k.run("import json\nx += 1\njob = s.snapshot_in_background(in_loop=True)\ns.wait_in_flight(120)\n"
                "forked = s.snapshot_in_background()\ns.wait_in_flight(120)\n"
                "os.setpriority = real_setpriority\nprint(job.writer, forked.writer, s.last_error, json.dumps(calls))")
    staged, fork, error, calls = out.split(" ", 3)
    assert (staged, fork, error) == ("staged", "fork", "None"), out
    assert [who for who, _delta in json.loads(calls)] == [k.value("forked.pid")], calls  # only the child was lowered


@pytest.mark.process
def test_when_memory_is_short_the_serialized_image_goes_to_a_forked_writer(tmp_path, monkeypatch):
    from spotwarp_jupyter.kernel.policy import Policy
    from spotwarp_jupyter.kernel.session import KernelSession

    ns = {"x": np.full(5_000_000, 1.0), "note": "kept"}
    session = KernelSession(ns, {}, engine_settings(tmp_path / "store", resolved=False), Policy(enabled=False))
    session.snapshot()
    monkeypatch.setattr(staged, "memory_for_staging", lambda: 0)
    job = session.snapshot_in_background(in_loop=True)
    ns["x"][:] = 2.0
    assert session.wait_in_flight(120) and session.last_error is None
    assert job.writer == "fork" and job.pid is not None
    restored: dict = {}
    make_engine(tmp_path / "store", resolved=False).restore_kernel("latest", restored)
    assert np.all(restored["x"] == 1.0) and restored["note"] == "kept"


def test_stage_copies_every_buffer_but_immutable_bytes():
    data = np.arange(3_000_000, dtype=np.int64)
    blob = b"z" * 100_000
    image = capture_namespace({"data": data, "blob": pickle.PickleBuffer(blob), "small": np.ones(3)})
    copied, region = staged.stage(image)
    data[:] = -1
    views = [v for g in image.groups for v in g.pickled.buffers]
    assert copied == staged.staged_bytes(image) >= data.nbytes + 24 and len(region) == copied
    assert any(np.array_equal(np.frombuffer(v, dtype=np.int64), np.arange(3_000_000)) for v in views if v.nbytes == data.nbytes)
    assert any(isinstance(v.obj, bytes) for v in views), "an immutable bytes buffer is written from where it is"


@pytest.mark.parametrize("meminfo, limit, current, expected", [
    ("MemTotal: 100 kB\nMemAvailable: 8000 kB\n", None, None, 4000 * 1024),
    ("MemAvailable: 8000 kB\n", "4096000", "1024000", (4096000 - 1024000) // 2),
    ("MemAvailable: 8000 kB\n", "max", "1", 4000 * 1024),
    ("nothing useful\n", None, None, 0),
])
def test_memory_for_staging_is_half_of_what_is_left(tmp_path, meminfo, limit, current, expected):
    (tmp_path / "meminfo").write_text(meminfo)
    cgroup = tmp_path / "cgroup"
    cgroup.mkdir()
    if limit is not None:
        (cgroup / "memory.max").write_text(limit + "\n")
        (cgroup / "memory.current").write_text(current + "\n")
    assert staged.memory_for_staging(tmp_path / "meminfo", cgroup) == expected


def _lazily_free_bytes() -> str:
    return "int(next(l.split()[1] for l in open('/proc/self/smaps_rollup') if l.startswith('LazyFree:'))) * 1024"


def test_consecutive_staged_snapshots_copy_into_one_region_kept_between_them(start_kernel, store_url):
    k = start_kernel("host")
    k.run("%load_ext spotwarp\n%spotwarp off\nimport numpy as np\nfrom spotwarp_jupyter.engine.writers import staged\n"
          + SESSION + "x = np.full(30_000_000, 1.0)\njob = None\ns.snapshot()")
    sizes, free_after = [], []
    for value in (2.0, 3.0, 4.0):
        out = k.run(f"x[:] = {value}\njob = s.snapshot_in_background(in_loop=True)\nx[:] = -1.0\n"
                    f"s.wait_in_flight(120)\nx[:] = {value}\n"
                    f"print(job.writer, s.last_error, staged.ARENA.size, {_lazily_free_bytes()})")
        writer, error, size, lazily_free = out.split()
        assert (writer, error) == ("staged", "None"), out
        sizes.append(int(size))
        free_after.append(int(lazily_free))
        ns: dict = {}
        make_engine(store_url, resolved=False).restore_kernel("latest", ns)
        assert np.all(ns["x"] == value), f"the snapshot of {value} holds {np.unique(ns['x'])}"
    assert sizes[0] >= 240_000_000 and sizes == [sizes[0]] * 3, sizes  # one region, not one per snapshot
    # the stored copy's pages stay with the kernel, free to the host: the next copy takes no page faults
    assert min(free_after) >= 200_000_000, free_after


def test_the_arena_gives_a_busy_or_small_region_to_no_second_copy():
    arena = staged.StagingArena()
    first = arena.take(10 << 20)
    assert arena.take(1 << 20) is not first  # still being written: the second copy gets memory of its own
    arena.give_back(first)
    assert arena.take(5 << 20) is first
    arena.give_back(first)
    larger = arena.take(100 << 20)
    assert larger is not first and len(larger) >= 100 << 20 and arena.size == len(larger)


def test_a_region_given_back_and_taken_again_holds_the_new_copy_only():
    arena = staged.StagingArena()
    data = np.arange(4_000_000, dtype=np.int64)
    _copied, region = staged.stage(capture_namespace({"data": data}), arena)
    arena.give_back(region)  # its pages marked free: the host may clear them, or leave them as they were
    data[:] = data[::-1].copy()
    image = capture_namespace({"data": data})
    _copied, again = staged.stage(image, arena)
    assert again is region
    data[:] = 0
    copies = [np.frombuffer(v, dtype=np.int64) for g in image.groups for v in g.pickled.buffers if v.nbytes == data.nbytes]
    assert len(copies) == 1 and np.array_equal(copies[0], np.arange(4_000_000)[::-1])
