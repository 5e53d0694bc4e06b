"""The staging folder DCP writes into is cleared by every rank without a word, whichever rank gets there first."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from spotwarp_jupyter.training import collective


def test_a_rank_clearing_a_stage_that_rank_0_already_removed_says_nothing(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    failures: list[BaseException] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: failures.append(args.exc_value))
    stage = tmp_path / "staging" / "snap"
    stage.mkdir(parents=True)
    (stage / "__1_0.distcp").write_bytes(b"x")
    collective._remove_staged(str(stage), 0)  # rank 0 first: the whole folder goes
    # rank 1 saw the folder just before rank 0 removed it
    monkeypatch.setattr(os.path, "isdir", lambda path: True)
    worker = threading.Thread(target=collective._remove_staged, args=(str(stage), 1))
    worker.start()
    worker.join()
    assert failures == []
    assert not stage.exists()
