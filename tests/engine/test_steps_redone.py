"""`spotwarp report`'s steps redone per resume (docs/resume.md): estimated from the lost host's step rate and its
end (a final snapshot on notice, its last heartbeat), flagged where it is an upper bound, never claimed where it
cannot be known; a loss without notice that a resume detected counts as a preemption. The real-process checks are in
tests/failover/test_resume_failover.py and tests/e2e/test_resume_unattended.py; these cover the edges."""

from __future__ import annotations

from spotwarp_jupyter.engine.journal import (
    FINAL_SNAPSHOT_COMMITTED,
    HOST_LOST,
    KERNEL_RESUMED,
    NOTICE_SEEN,
    PREEMPTION_DETECTED,
    loss_without_notice,
    report,
    resume_rows,
)
from spotwarp_jupyter.engine.journal.events import RESTORE_STARTED, Event
from spotwarp_jupyter.engine.manifests.manifest import Manifest

NB = "train.ipynb"


def _step(sid: str, created: float, **positions: int) -> Manifest:
    return Manifest(sid, "proj", created, "host-a", kernels={NB: {"at": "step", "positions": positions}})


def _resumed(snapshot: str, at: float, start_to_running_s: float = 5.0) -> Event:
    return Event(KERNEL_RESUMED, at, "host-b", snapshot, NB, {"cell": "loop", "positions": {},
                                                            "start_to_running_s": start_to_running_s})


def test_the_rate_over_the_newest_epoch_times_the_time_to_the_last_heartbeat():
    # epoch 0 ends at step 16; in epoch 1, 2 steps a second; lost 3 s after the newest snapshot
    manifests = [_step("s1", 100.0, epochs=0, train=14), _step("s2", 101.0, epochs=1, train=0),
                 _step("s3", 102.0, epochs=1, train=2), _step("s4", 104.0, epochs=1, train=6)]
    lost = Event(HOST_LOST, 111.0, "orchestrator", details={"lost_at": 107.0})
    (row,) = resume_rows([lost, _resumed("s4", 120.0)], manifests)
    assert row["steps_redone"] == 6, row
    assert row["steps_redone_how"] == "estimated: 2.00 steps/s of loop 'train' x 3.0 s from the snapshot to its last heartbeat"


def test_without_a_recorded_loss_it_counts_to_the_resuming_hosts_start_and_says_so():
    manifests = [_step("s1", 100.0, train=0), _step("s2", 102.0, train=4)]
    (row,) = resume_rows([_resumed("s2", 112.0, start_to_running_s=5.0)], manifests)
    assert row["steps_redone"] == 10 and "to the resuming host's start (an upper bound)" in row["steps_redone_how"]


def test_a_heartbeat_older_than_the_snapshot_means_nothing_redone():
    manifests = [_step("s1", 100.0, train=0), _step("s2", 102.0, train=4)]
    lost = Event(HOST_LOST, 106.0, "orchestrator", details={"lost_at": 101.5})
    (row,) = resume_rows([lost, _resumed("s2", 112.0)], manifests)
    assert row["steps_redone"] == 0 and "x 0.0 s from the snapshot to its last heartbeat" in row["steps_redone_how"]


def test_unknown_without_a_rate_or_the_snapshot():
    manifests = [_step("s1", 100.0, epochs=0, train=15), _step("s2", 101.0, epochs=1, train=0)]
    (row,) = resume_rows([_resumed("s2", 112.0)], manifests)  # one step snapshot since the epoch began: no rate
    assert row["steps_redone"] is None and row["steps_redone_how"].startswith("unknown: ")
    (row,) = resume_rows([_resumed("gone", 112.0)], manifests)
    assert row["steps_redone"] is None and "not in the listing" in row["steps_redone_how"]


def test_after_a_final_snapshot_on_notice_the_count_ends_at_its_commit():
    # notice at 102.5 while the loop was at step 4 (s2); the final snapshot commits at 102.9 and the kernels stop
    manifests = [_step("s1", 100.0, train=0), _step("s2", 102.0, train=4),
                 Manifest("s3", "proj", 102.9, "host-a", kind="project", kernels={NB: {"at": "step",
                                                                                       "positions": {"train": 4}}})]
    events = [Event(NOTICE_SEEN, 102.5, "host-a", details={"run": "r1", "fatal": True, "source": "sigterm"}),
              Event(FINAL_SNAPSHOT_COMMITTED, 102.9, "host-a", "s3", details={"run": "r1", "fatal": True}),
              Event(RESTORE_STARTED, 107.0, "host-b", "s3"), _resumed("s3", 120.0)]
    out = report(events, manifests)
    (row,) = out["resumes"]
    assert row["steps_redone"] == 2 and row["steps_redone_upper_bound"] is False, row
    assert "to the final snapshot's commit on notice" in row["steps_redone_how"]
    (loss,) = out["events"]  # the same resume: work lost and steps redone span the same 0.9 s
    assert loss["work_lost_s"] == 0.9 and loss["with_notice"] is True


def test_an_estimate_to_the_resuming_hosts_start_is_flagged_an_upper_bound():
    manifests = [_step("s1", 100.0, train=0), _step("s2", 102.0, train=4)]
    (row,) = resume_rows([_resumed("s2", 112.0, start_to_running_s=5.0)], manifests)
    assert row["steps_redone_upper_bound"] is True


def test_a_loss_without_notice_detected_at_resume_is_a_preemption_in_the_report():
    manifests = [_step("s1", 100.0, train=0), _step("s2", 102.0, train=4)]
    events = [Event(RESTORE_STARTED, 106.0, "host-b", "s2"),
              Event(PREEMPTION_DETECTED, 110.0, "host-b", "s2", NB, {"lost_host": "host-a", "lost_at": 104.0}),
              _resumed("s2", 112.0, start_to_running_s=6.0)]
    out = report(events, manifests)
    assert (out["preemptions"], out["preemptions_survived"]) == (1, 1)
    (loss,) = out["events"]
    assert loss["with_notice"] is False and loss["notice"] is None and loss["host"] == "host-a"
    assert loss["restored_snapshot"] == "s2" and loss["restored_on"] == "host-b"
    assert loss["work_lost_s"] == 2.0 and loss["resume_s"] == 6.0
    (row,) = out["resumes"]  # steps redone up to the lost host's last heartbeat, which the detection names
    assert row["steps_redone"] == 4 and "to its last heartbeat" in row["steps_redone_how"]


def test_a_loss_is_without_notice_unless_a_fatal_notice_came_since_the_lost_run_began():
    notice = Event(NOTICE_SEEN, 50.0, "host-a", details={"fatal": True})
    warning = Event(NOTICE_SEEN, 80.0, "host-b", details={"fatal": False})
    resumed_b = Event(RESTORE_STARTED, 60.0, "host-b", "s1")
    assert loss_without_notice([notice], started_at=100.0) is False  # host-a's notice, its run never restored
    assert loss_without_notice([notice, resumed_b, warning], started_at=100.0) is True  # host-b: no fatal notice
    assert loss_without_notice([notice], started_at=100.0, lost_run_began=70.0) is True


def test_a_final_snapshot_asked_for_a_replacement_is_a_planned_end_not_a_loss():
    replaced = Event(FINAL_SNAPSHOT_COMMITTED, 90.0, "host-a", "s9", details={"fatal": False})
    assert loss_without_notice([replaced], started_at=100.0) is False
