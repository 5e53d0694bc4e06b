"""Kill the kernel at random moments while it writes a large snapshot: the previous one always survives."""

from __future__ import annotations

import random
import time

import numpy as np
import pytest

from engines import make_engine

# ~160 MB over several variables, so the write spans many objects and takes a while
STATE = r'''
%load_ext spotwarp
import numpy as np
def fill(gen):
    global a, b, c, meta
    a = np.full(20_000_000, gen, dtype=np.float32)
    b = np.full(10_000_000, gen, dtype=np.float64)
    c = [np.full(1_000_000, gen, dtype=np.int32) for _ in range(5)]
    meta = {"gen": gen}
'''


def _generation(ns: dict) -> int:
    """The one generation number every restored variable carries; fails on a mixed image."""
    gens = {int(ns["meta"]["gen"]), int(ns["a"][0]), int(ns["a"][-1]), int(ns["b"][0]), int(ns["b"][-1])}
    gens |= {int(x[0]) for x in ns["c"]} | {int(x[-1]) for x in ns["c"]}
    assert len(gens) == 1, f"a snapshot mixes generations {sorted(gens)}"
    assert np.all(ns["a"] == ns["a"][0]) and np.all(ns["b"] == ns["b"][0])
    return gens.pop()


def _wait_busy(kernel, deadline_s: float = 30.0) -> None:
    """Block until the kernel reports it started executing (iopub status busy)."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        msg = kernel.kc.get_iopub_msg(timeout=deadline_s)
        if msg["header"]["msg_type"] == "status" and msg["content"]["execution_state"] == "busy":
            return
    raise AssertionError("kernel never started executing")


@pytest.mark.parametrize("seed", range(6))
def test_kill_during_snapshot_leaves_previous_intact(start_kernel, store_url, seed):
    rng = random.Random(seed)
    kernel = start_kernel(f"host{seed}")
    kernel.run(STATE + "fill(1)\n%spotwarp snapshot -m gen1")
    engine = make_engine(store_url, resolved=False)
    first = engine.get("latest")

    # start snapshot of generation 2 and kill the kernel at a random moment while it runs
    kernel.kc.execute("fill(2)\n%spotwarp snapshot -m gen2")
    _wait_busy(kernel)
    time.sleep(rng.uniform(0.0, 2.5))  # the random kill point, not a synchronisation
    kernel.kill()

    fresh = make_engine(store_url, resolved=False)
    listing = fresh.manifests()
    assert listing, "the first snapshot vanished"
    assert first.id in [m.id for m in listing]
    assert all(m.message in ("gen1", "gen2") for m in listing)
    assert not fresh.rejected, f"a half-written manifest is visible: {fresh.rejected}"
    report = fresh.verify()
    assert report.ok, report.problems
    for m in listing:
        ns: dict = {}
        fresh.restore_kernel(m.id, ns)
        assert _generation(ns) == int(m.message[-1])


def test_newest_restores_in_a_new_kernel_after_a_kill(start_kernel, store_url):
    a = start_kernel("hostA")
    a.run(STATE + "fill(7)\n%spotwarp snapshot -m gen7")
    a.kc.execute("fill(8)\n%spotwarp snapshot -m gen8")
    _wait_busy(a)
    time.sleep(0.3)
    a.kill()
    b = start_kernel("hostB")
    b.run("%load_ext spotwarp\n%spotwarp restore latest")
    gen = b.value("int(meta['gen'])")
    assert gen in (7, 8)
    assert b.value("sorted({int(a[0]), int(a[-1]), int(b[0]), int(b[-1]), *[int(x[-1]) for x in c]})") == [gen]
