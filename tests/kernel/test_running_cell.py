"""Each snapshot records the cell running when it was taken (JupyterLab's cell id and the source as it was sent)
and where: at a `resumable` loop's step, at a cell's end, or elsewhere inside a cell (docs/resume.md)."""

from __future__ import annotations

from engines import make_engine

SETUP = "%load_ext spotwarp\n%spotwarp policy --every 1h --no-after-cell\nimport spotwarp\nfrom spotwarp_jupyter import safepoints\n"
# the source exactly as sent, trailing spaces and all: the record must not be the notebook's later text
LOOP = ("total = 0\nfor i in spotwarp.resumable(range(6), name='train'):   \n"
        "    total += i\n    if i == 2:\n        safepoints.request('test')\n")



def _newest_record(store_url: str) -> dict:
    engine = make_engine(store_url)
    return engine.manifests()[0].kernels["train.ipynb"]


def test_a_snapshot_at_a_loop_step_records_the_running_cell_and_where(start_kernel, store_url):
    k = start_kernel("host-a", JPY_SESSION_NAME="train.ipynb")
    k.run_cell("setup", SETUP)
    k.run_cell("loop", LOOP)
    k.run("from spotwarp_jupyter.kernel.session import current\nassert current().wait_in_flight(60)")
    record = _newest_record(store_url)
    assert record["at"] == "step"
    assert record["running"] == {"id": "loop", "source": LOOP}
    assert record["positions"] == {"train": 3}


def test_a_snapshot_inside_a_cell_or_at_its_end_is_not_at_a_step(start_kernel, store_url):
    k = start_kernel("host-a", JPY_SESSION_NAME="train.ipynb")
    k.run_cell("setup", SETUP)
    k.run_cell("snap", "x = 1\n%spotwarp snapshot")
    record = _newest_record(store_url)
    assert (record["at"], record["running"]) == ("call", {"id": "snap", "source": "x = 1\n%spotwarp snapshot"})
    # asked for during a cell, taken at its end: nothing was running any more
    k.run_cell("end", "y = 2\nsafepoints.request('test')")
    k.run("from spotwarp_jupyter.kernel.session import current\nassert current().wait_in_flight(60)")
    record = _newest_record(store_url)
    assert record["at"] == "cell" and "running" not in record
    assert {"id": "end", "source": "y = 2\nsafepoints.request('test')"} in record["cells"]


def test_the_kernel_restored_by_the_server_says_what_was_running_and_what_comes_next(start_kernel, store_url):
    a = start_kernel("host-a", JPY_SESSION_NAME="train.ipynb")
    a.run_cell("setup", SETUP)
    a.run_cell("loop", LOOP)
    a.run("from spotwarp_jupyter.kernel.session import current\nassert current().wait_in_flight(60)")
    a.kill()
    b = start_kernel("host-b", JPY_SESSION_NAME="train.ipynb")
    # what the server runs in the notebook's new kernel (server/resume.py)
    b.run("%load_ext spotwarp\n__import__('spotwarp_jupyter.kernel.resume', fromlist=['_']).restore_for_resume()")
    outcome = b.value("_j.loads(__import__('spotwarp_jupyter.kernel.resume', fromlist=['_']).outcome_json())")
    assert (outcome["at"], outcome["running"], outcome["positions"]) == ("step", {"id": "loop", "source": LOOP},
                                                                         {"train": 3})
    assert outcome["resume"] is True and "error" not in outcome
    status = b.value("__import__('spotwarp_jupyter.kernel.session', fromlist=['_']).current().status()")
    assert status["resumed"]["rerun"] is True and status["resumed"]["cell"] == "loop"
    line = [ln for ln in b.run("%spotwarp status").splitlines() if ln.startswith("  resumed ")]
    assert line == [f"  resumed   on this host from snapshot {outcome['snapshot']} ({outcome['host']}, "
                    f"{outcome['created']}) at step 3 of loop 'train': cell loop run again by the server"]
    assert b.value("total") == 3  # the state at that step: 0 + 1 + 2


def test_a_restore_for_resume_that_fails_says_why_in_one_line(start_kernel, store_url):
    b = start_kernel("host-b", JPY_SESSION_NAME="train.ipynb")
    b.run("%load_ext spotwarp\n__import__('spotwarp_jupyter.kernel.resume', fromlist=['_']).restore_for_resume()")
    outcome = b.value("_j.loads(__import__('spotwarp_jupyter.kernel.resume', fromlist=['_']).outcome_json())")
    assert list(outcome) == ["error"] and "no snapshot" in outcome["error"] and "\n" not in outcome["error"]


def test_the_widget_says_the_session_was_resumed_until_its_next_snapshot():
    from spotwarp_jupyter.widget.status import protection

    status = {"last_error": None, "policy": {"enabled": True}, "last_snapshot": None, "restore": {"id": "k7m2qx9a"},
              "resumed": {"line": "on this host from snapshot k7m2qx9a (host-a, 2026-12-04T18:36:41Z): no cell was running"}}
    assert protection(status) == (True, "protected: resumed on this host from snapshot k7m2qx9a (host-a, "
                                        "2026-12-04T18:36:41Z): no cell was running")
    assert protection({**status, "last_snapshot": {"id": "newer"}}) == (True, "protected")


def test_the_widget_names_a_cell_interrupted_outside_a_loop_and_the_panel_button_that_runs_it():
    from spotwarp_jupyter.kernel.resume import resumed_facts
    from spotwarp_jupyter.widget.status import protection

    facts = resumed_facts({"snapshot": "k7m2qx9a", "host": "host-a", "created": "2026-12-04T18:36:41Z",
                           "positions": {}, "at": "call", "running": {"id": "load", "source": "x = 1"}, "resume": True})
    assert (facts["rerun"], facts["cell"]) == (False, "load")
    status = {"last_error": None, "policy": {"enabled": True}, "last_snapshot": None, "restore": {"id": "k7m2qx9a"},
              "resumed": facts}
    assert protection(status) == (True, "protected: resumed on this host from snapshot k7m2qx9a (host-a, "
                                        "2026-12-04T18:36:41Z): cell load was interrupted outside a resumable loop and "
                                        "is not run again (run it, or click 'Run cell load' in the SpotWarp panel)")
