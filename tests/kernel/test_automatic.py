"""A session's automatic snapshots (kernel/automatic.py), in this process: when one is due, and a safe point's
snapshot carries the requests named for it and is committed through the session like a manual one."""

from __future__ import annotations

from spotwarp_jupyter.engine import Settings
from spotwarp_jupyter.kernel.policy import Policy
from spotwarp_jupyter.kernel.session import KernelSession


def _session(tmp_path, ns: dict, policy: Policy) -> KernelSession:
    session = KernelSession(ns, {}, Settings(project="proj", storage=str(tmp_path / "store")), policy,
                            notebook="a.ipynb")
    session.access.hooked = session.access.attached = True  # as in a kernel with the extension: cells are seen
    return session


def test_an_empty_session_is_never_due_and_one_holding_state_is_at_its_first_cells_end(tmp_path):
    ns: dict = {}
    automatic = _session(tmp_path, ns, Policy(enabled=True)).automatic
    assert automatic.due([], cell_end=True) is False  # it would become the notebook's newest over real state
    ns["x"] = 1
    assert automatic.due([], cell_end=True) is True  # protected at the end of its first cell
    assert automatic.due([], cell_end=True) is False  # then at the policy's interval
    assert automatic.due(["server request"]) is True  # asked for: at once


def test_automatic_snapshots_off_are_taken_only_when_asked_for(tmp_path):
    automatic = _session(tmp_path, {"x": 1}, Policy(enabled=False)).automatic
    assert automatic.due([], cell_end=True) is False and automatic.due(["preemption"]) is True


def test_a_safe_points_snapshot_answers_the_requests_named_for_it_and_becomes_the_baseline(tmp_path):
    ns = {"x": 1, "label": "kept"}
    session = _session(tmp_path, ns, Policy(enabled=True))
    session.snapshot()  # the baseline: after it, one small number is left to write (a writer thread, no fork)
    session.access.note("x = 2")
    ns["x"] = 2
    session.access.finished()
    session.automatic.answer_with_next_snapshot("request-1")
    session.automatic.at_safe_point("cell", ["server request"])
    assert session.wait_in_flight(60) and session.last_error is None and session.in_flight is None
    last = session.last
    assert last.requests == ["request-1"] and last.message == "requested: server request"
    assert last.stats["writer"] == "thread" and last.stats["groups_reused"] >= 1
    assert session.increments.baseline is not None and session.status()["in_flight"] is False
