"""The cadence of automatic snapshots at a loop's steps: with nothing configured a `resumable` loop is protected
within seconds of its start, then snapshots as often as their measured cost allows within 2% overhead and the
redo bound (`--max-redo`); the overhead bound wins when both cannot hold, and the status says what a loss redoes.
`--every` fixes the period."""

from __future__ import annotations

import pytest

from spotwarp_jupyter.kernel.policy import FIRST_STEP_S, MAX_OVERHEAD, LoopMeter, Policy, cadence

from engines import make_engine
from kernels import SESSION

WAIT = "assert s.wait_in_flight(120)"
# a training loop: real work at each step, for `seconds` of wall time, its start recorded in the kernel
LOOP = ("import itertools, time\nloop_start = time.time()\nacc = 0\n"
        "for step in spotwarp.resumable(itertools.count(), name='train'):\n"
        "    acc += sum(i * i for i in range(20_000)) % 7\n"
        "    if time.time() - loop_start > {seconds}:\n        break\n")


def _step_snapshots(store_url: str, since: float) -> list:
    engine = make_engine(store_url)
    return sorted((m for m in engine.manifests() if m.created >= since
                   and m.kernels.get("train.ipynb", {}).get("at") == "step"), key=lambda m: m.created)


# -- the cadence itself, from measured costs -------------------------------------------------------------------
def test_cheap_snapshots_are_taken_at_half_the_redo_bound_well_within_the_overhead_bound():
    c = cadence(cost_s=0.2, write_s=1.5, step_s=0.1)  # 0.2 s of training lost per snapshot, written in 1.5 s
    assert c.bounded_by == "redo"
    assert c.interval_s == pytest.approx((60 - 1.6) / 2)
    assert c.redo_window_s == pytest.approx(c.interval_s + 1.6) and c.redo_window_s <= 60
    assert c.overhead_pct == pytest.approx(100 * 0.2 / c.interval_s) and c.overhead_pct <= 100 * MAX_OVERHEAD
    assert c.text() == "snapshots every 29.2 s at steps: at most 30.8 s of training redone, ~0.7% overhead"


def test_a_costlier_snapshot_stretches_the_interval_to_the_overhead_bound_while_the_redo_bound_holds():
    c = cadence(cost_s=1.0, write_s=5.0, step_s=0.2)
    assert c.bounded_by == "overhead" and c.interval_s == pytest.approx(50.0)
    assert c.overhead_pct == pytest.approx(2.0) and c.redo_window_s == pytest.approx(55.2) and c.redo_window_s <= 60


def test_when_both_bounds_cannot_hold_the_overhead_bound_wins_and_the_text_names_the_redo_window():
    c = cadence(cost_s=2.0, write_s=10.0, step_s=0.5)
    assert c.bounded_by == "overhead" and c.interval_s == pytest.approx(100.0)
    assert c.overhead_pct == pytest.approx(2.0) and c.redo_window_s == pytest.approx(110.5)
    assert c.as_dict()["redo_window_s"] == 110.5
    assert c.text().startswith("snapshots every 1m 40s at steps: at most 1m 50s of training redone, ~2.0% overhead "
                               "(over the 1m redo bound")


def test_the_first_snapshots_cost_alone_keeps_the_redo_bound_until_a_later_one_is_measured():
    first = cadence(cost_s=1.65, write_s=2.2, step_s=1.0, first_only=True)  # a full write, staging memory touched
    assert first.bounded_by == "redo" and first.interval_s == pytest.approx((60 - 3.2) / 2)
    assert first.overhead_pct == pytest.approx(100 * 1.65 / first.interval_s)  # over 2% for one interval: said as it is
    assert cadence(cost_s=1.65, write_s=2.2, step_s=1.0).bounded_by == "overhead"


def test_a_smaller_redo_bound_shortens_the_interval_and_a_fixed_period_is_kept_as_given():
    c = cadence(cost_s=0.05, write_s=0.5, step_s=0.05, max_redo_s=20.0)
    assert c.bounded_by == "redo" and c.redo_window_s <= 20 and c.overhead_pct <= 100 * MAX_OVERHEAD
    fixed = cadence(cost_s=0.3, write_s=1.0, step_s=0.1, every_s=15.0)
    assert (fixed.bounded_by, fixed.interval_s, fixed.overhead_pct) == ("every", 15.0, pytest.approx(2.0))


def test_the_meter_counts_the_steps_a_snapshot_overlaps_beyond_the_pace_of_the_others():
    meter, t = LoopMeter(), 0.0
    for _ in range(10):  # steps of 0.1 s with no snapshot
        meter.step(t, writing=False)
        t += 0.1
    meter.step(t, writing=False)
    meter.started(t, pause_s=0.05)  # a snapshot starts at this step; the kernel pauses 0.05 s
    for dt in (0.15, 0.12, 0.12):  # the steps its writer overlaps: the pause, then slower steps
        t += dt
        meter.step(t, writing=True)
    meter.written(t + 0.05)
    t += 0.1
    meter.step(t, writing=False)  # the first step after the writer is done
    assert meter.writes[-1] == pytest.approx(0.44)
    for _ in range(LoopMeter.AFTER):  # the load went up meanwhile: the steps after it are slower
        t += 0.104
        meter.step(t, writing=False)
    # 4 steps took 0.49 s where the pace around it, (0.1 + 0.104) / 2 s, gives 0.408 s
    assert meter.first_cost == pytest.approx(0.49 - 4 * 0.102) and not meter.costs
    c = meter.cadence(60.0)
    assert c.bounded_by == "redo" and c.overhead_pct == pytest.approx(100 * meter.first_cost / c.interval_s)


def _flight(meter: LoopMeter, t: float, pace: float, overlapped: tuple[float, ...]) -> float:
    """Steps at `pace`, then a snapshot whose writer overlaps steps taking `overlapped`; returns the clock."""
    for _ in range(12):
        meter.step(t, writing=False)
        t += pace
    meter.step(t, writing=False)
    meter.started(t, pause_s=0.05)
    for dt in overlapped:
        t += dt
        meter.step(t, writing=True)
    meter.written(t)
    t += pace
    meter.step(t, writing=False)  # the first step after the writer is done
    return t


def test_steps_slowed_after_the_writer_is_done_are_charged_to_the_snapshot_and_the_log_says_so():
    """What a snapshot leaves behind (memory handed back, caches refilled) slows the steps right after its writer
    is done: that time is lost to the snapshot too, measured against the pace the loop returns to."""
    meter, t = LoopMeter(), 0.0
    for _ in range(2):  # the first snapshot's cost is kept apart: the second one sets the cadence
        t = _flight(meter, t, 0.1, (0.15, 0.12, 0.12))
        for dt in [0.3] * 4 + [0.1] * (LoopMeter.AFTER - 4):
            t += dt
            meter.step(t, writing=False)
    # 4 steps of the flight took 0.49 s against 0.4 s; the 4 steps after it 0.8 s beyond the pace it returned to
    assert meter.costs[-1] == pytest.approx(0.09 + 0.8)
    assert meter.log[-1]["cost"] == pytest.approx(0.89) and meter.log[-1]["aftermath"] == pytest.approx(0.8)
    c = meter.cadence(60.0)
    assert c.bounded_by == "overhead" and c.interval_s == pytest.approx(0.89 / MAX_OVERHEAD)
    assert c.overhead_pct == pytest.approx(100 * MAX_OVERHEAD)


def test_a_load_that_falls_while_the_steps_after_a_snapshot_are_measured_is_not_charged_to_it():
    """Steps between the pace before a snapshot and the one the loop returns to are the load moving, not the
    snapshot: only steps slower than both are charged to it."""
    meter, t = LoopMeter(), 0.0
    for _ in range(2):
        t = _flight(meter, t, 0.2, (0.25, 0.22, 0.22))
        half = LoopMeter.AFTER // 2
        for dt in [0.2 - 0.1 * (i + 1) / (half + 1) for i in range(half)] + [0.1] * half:
            t += dt
            meter.step(t, writing=False)
        for _ in range(12):  # back to the pace before it, as the next flight's pace
            t += 0.2
            meter.step(t, writing=False)
    pace = (0.2 + 0.1) / 2  # 4 steps took 0.89 s against the pace before it and the pace after it
    assert meter.log[-1]["aftermath"] == 0.0 and meter.costs[-1] == pytest.approx(0.89 - 4 * pace)


def test_a_recorded_policy_keeps_its_cadence_and_a_record_without_max_redo_gets_the_adaptive_one():
    kept = Policy.from_dict(Policy(max_redo_s=90.0).as_dict(), Policy())
    assert (kept.every_s, kept.max_redo_s) == (None, 90.0)
    assert Policy.from_dict(Policy(every_s=45.0).as_dict(), Policy()).every_s == 45.0
    # a record of a format without max_redo_s: 5 minutes was its fixed default, a 2-minute period was a choice
    assert Policy.from_dict({"every_s": 300.0, "after_cell": True}, Policy()).every_s is None
    assert Policy.from_dict({"every_s": 120.0, "after_cell": True}, Policy()).every_s == 120.0


# -- in a real kernel ----------------------------------------------------------------------------------------------
def test_with_default_settings_a_loop_is_protected_within_seconds_of_its_start_and_the_status_says_the_cadence(
        start_kernel, store_url):
    k = start_kernel("host-a", JPY_SESSION_NAME="train.ipynb")
    k.run("%load_ext spotwarp\nimport spotwarp\n" + SESSION + "weights = [0.0]")
    k.run(WAIT)
    k.run(LOOP.format(seconds=14))
    k.run(WAIT)
    loop_start = k.value("loop_start")
    first = _step_snapshots(store_url, loop_start)
    assert first, "no snapshot at the loop's steps"
    assert first[0].created - loop_start <= 10  # committed within 10 s of the loop's start
    assert first[0].created - loop_start >= FIRST_STEP_S
    status = k.value("s.status()")
    assert status["cadence"]["bounded_by"] in ("redo", "overhead")
    assert status["cadence"]["overhead_pct"] is not None and status["cadence"]["max_redo_s"] == 60.0
    assert status["cadence"]["redo_window_s"] >= status["cadence"]["interval_s"]
    out = k.run("%spotwarp status").splitlines()
    assert f"  cadence   {status['cadence']['text']}" in out
    assert status["cadence"]["text"].startswith("snapshots every ")


def test_a_loop_started_while_the_previous_cells_snapshot_is_written_is_protected_within_seconds(
        start_kernel, store_url):
    """The previous cell's snapshot holds the state from before the loop, even when it commits after the loop's
    first step: the loop's own first snapshot still comes seconds after its start, not a whole interval later."""
    k = start_kernel("host-a", JPY_SESSION_NAME="train.ipynb")
    # pickling `slow` takes 2 s in the writer, so the first cell's snapshot is still being written as the loop starts
    k.run("%load_ext spotwarp\nimport spotwarp, time\n" + SESSION + "weights = [0.0]\n"
          "class Slow:\n    def __getstate__(self):\n        time.sleep(2)\n        return {}\n"
          "slow = Slow()")
    k.run(LOOP.format(seconds=12))
    k.run(WAIT)
    loop_start = k.value("loop_start")
    engine = make_engine(store_url)
    cell_end = [m for m in engine.manifests() if m.kernels.get("train.ipynb", {}).get("at") == "cell"]
    assert cell_end and min(m.created for m in cell_end) > loop_start  # committed once the loop ran
    first = _step_snapshots(store_url, loop_start)
    assert first and first[0].created - loop_start <= 10, [(m.created - loop_start, m.stats) for m in first]


def test_a_first_step_snapshot_that_reuses_the_cells_snapshot_sets_the_cadence_by_its_cost(start_kernel, store_url):
    """Only a full write carries one-time costs: a loop's first snapshot at a step that reuses what the cell's
    snapshot wrote costs what the next ones will, and the overhead bound holds from the first interval on."""
    k = start_kernel("host-a", JPY_SESSION_NAME="train.ipynb")
    # pickling `slow` takes 0.8 s, in the pause of each snapshot at a step that writes it: more than 2% of 30 s
    k.run("%load_ext spotwarp\nimport spotwarp, time\n" + SESSION + "weights = [0.0]\n"
          "class Slow:\n    def __getstate__(self):\n        time.sleep(0.8)\n        return {'n': self.n}\n"
          "slow = Slow()\nslow.n = 0")
    k.run(WAIT)
    k.run(LOOP.format(seconds=6).replace("    acc +=", "    slow.n = step\n    acc +="))
    k.run(WAIT)
    assert len(_step_snapshots(store_url, k.value("loop_start"))) == 1
    cadence = k.value("s.status()['cadence']")
    assert cadence["bounded_by"] == "overhead", cadence
    assert cadence["interval_s"] >= 0.8 / MAX_OVERHEAD and cadence["overhead_pct"] <= 100 * MAX_OVERHEAD


def test_a_fixed_every_is_not_adapted_and_every_auto_adapts_again(start_kernel, store_url):
    k = start_kernel("host-a", JPY_SESSION_NAME="train.ipynb")
    k.run("%load_ext spotwarp\nimport spotwarp\n" + SESSION + "%spotwarp policy --every 1h\nweights = [0.0]")
    k.run(WAIT)
    assert k.value("s.status()['cadence']['bounded_by']") == "every"
    k.run(LOOP.format(seconds=FIRST_STEP_S + 3))
    k.run(WAIT)
    assert _step_snapshots(store_url, k.value("loop_start")) == []  # the hour has not passed
    assert "then adapted" in k.run("%spotwarp policy --every auto")
    k.run(LOOP.format(seconds=FIRST_STEP_S + 3))
    k.run(WAIT)
    assert _step_snapshots(store_url, k.value("loop_start"))


def test_max_redo_is_a_policy_flag_and_a_bad_value_is_one_line_that_changes_nothing(start_kernel):
    k = start_kernel("host-a")
    k.run("%load_ext spotwarp\n" + SESSION)
    assert "at most 1m 30s redone" in k.run("%spotwarp policy --max-redo 90s")
    for bad in ("0", "soon", "0s", "5y"):
        ename, evalue, _ = k.run_error(f"%spotwarp policy --max-redo {bad} --every 10s")
        assert ename == "UsageError" and "\n" not in evalue.strip() and "bad duration" in evalue
    assert k.value("[s.policy.max_redo_s, s.policy.every_s]") == [90.0, None]


def test_max_redo_comes_from_the_environment(start_kernel):
    k = start_kernel("host-a", SPOTWARP_MAX_REDO="45s")
    k.run("%load_ext spotwarp\n" + SESSION)
    assert k.value("s.status()['cadence']['max_redo_s']") == 45.0
