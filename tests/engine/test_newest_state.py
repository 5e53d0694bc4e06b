"""A project snapshot never names older kernel state than one already committed for the same notebook.

Kernel snapshots are written in the background; one taken earlier may commit after a later one (a writer
that took longer). Each record carries the instant of its state (`state_at`), and project snapshots (a
preemption's final one, a server's request, the continuous backup) pick the newest state, so `latest`
never moves back in training. A notice's answer is the asked kernel's own snapshot, never the copy of its
record that another kernel's snapshot of the same notice holds.
"""

from __future__ import annotations

from spotwarp_jupyter.engine import SnapshotEngine
from spotwarp_jupyter.service import KernelAnswer, Project

from engines import make_engine


def _snapshot(engine: SnapshotEngine, step: int, state_at: float, run: str = "run-a"):
    return engine.snapshot_kernel({"step": step}, "train.ipynb", f"step {step}",
                                  annotations={"state_at": state_at, "kernel_run": run, "positions": {"train": step}})


def test_a_project_snapshot_keeps_the_newest_state_whatever_committed_last(tmp_path):
    (tmp_path / "ws").mkdir()
    (tmp_path / "ws" / "config.yaml").write_text("lr: 0.01\n")
    engine = make_engine(tmp_path / "store", "p")
    project = Project(engine, str(tmp_path / "ws"))
    _snapshot(engine, 100, state_at=2000.0)
    older = _snapshot(engine, 67, state_at=1000.0)  # taken first, committed last
    assert engine.manifests("train.ipynb")[0].id == older.id

    # the kernel answered with the snapshot it committed last: the project snapshot still holds step 100
    final = project.snapshot("final snapshot", [KernelAnswer("k1", "train.ipynb", committed=older.id)])
    assert final.kernels["train.ipynb"]["positions"] == {"train": 100}
    assert engine.restore_kernel(final.id, namespace := {}, "train.ipynb") and namespace["step"] == 100
    # a kernel that did not answer keeps its newest state, not the last committed
    backup = project.snapshot("backup", [KernelAnswer("k1", "train.ipynb", error="busy", asked=True)])
    assert backup.kernels["train.ipynb"]["positions"] == {"train": 100}

    # newer state committed last is taken as it is
    newest = _snapshot(engine, 126, state_at=3000.0)
    again = project.snapshot("again", [KernelAnswer("k1", "train.ipynb", committed=newest.id)])
    assert again.kernels["train.ipynb"]["positions"] == {"train": 126}

    # another kernel run (a new host, whose clock may be behind): its commit is the newest, whatever its clock
    other = _snapshot(engine, 10, state_at=500.0, run="run-b")
    after = project.snapshot("new host", [KernelAnswer("k2", "train.ipynb", committed=other.id)])
    assert after.kernels["train.ipynb"]["positions"] == {"train": 10}


def test_a_notices_answer_is_the_asked_kernels_own_snapshot_not_a_copy_in_another_kernels(tmp_path):
    from spotwarp_jupyter.protocol import NoticeAnswer
    from spotwarp_jupyter.server.kernel_link import snapshot_answering

    (tmp_path / "ws").mkdir()
    engine = make_engine(tmp_path / "store", "p", workspace=str(tmp_path / "ws"))
    _snapshot(engine, 6, state_at=1000.0)  # train.ipynb's periodic snapshot
    # one notice, one id, two kernels: idle.ipynb commits first, its snapshot holding the workspace copies
    # train.ipynb's newest record
    idle = engine.snapshot_kernel({"x": 1}, "idle.ipynb", "requested: preemption", requests=["n1"],
                                  annotations={"state_at": 2001.0, "kernel_run": "run-i"}, cut=engine.cut_workspace())
    assert idle.kernels["train.ipynb"]["positions"] == {"train": 6}
    asked = NoticeAnswer("n1", True, requested_at=2000.0, notebook="train.ipynb")
    assert snapshot_answering(engine.manifests(), asked, "n1") is None
    own = engine.snapshot_kernel({"step": 42}, "train.ipynb", "requested: preemption", requests=["n1"],
                                 annotations={"state_at": 2002.0, "kernel_run": "run-a", "positions": {"train": 42}})
    assert snapshot_answering(engine.manifests(), asked, "n1").id == own.id
