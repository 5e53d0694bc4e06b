"""`spotwarp report`'s steps redone per resume (docs/resume.md): estimated from the lost host's step rate and its
last sign of life, never claimed where it cannot be known. The real-process checks are in
tests/failover/test_resume_failover.py and tests/e2e/test_resume_unattended.py; these cover the edges."""

from __future__ import annotations

from spotwarp_jupyter.engine.journal import HOST_LOST, KERNEL_RESUMED, resume_rows
from spotwarp_jupyter.engine.journal.events import Event
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
