"""The quick tier (`pytest -m "not slow and not process"`) starts no process: a test outside the `process` and
`slow` markers that starts one fails, so the marker stays true as tests are added."""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys

import pytest

REFUSED = "mark it @pytest.mark.process"


def test_a_command_started_by_an_unmarked_test_is_refused():
    with pytest.raises(RuntimeError, match=REFUSED):
        subprocess.run([sys.executable, "-c", "pass"], check=True)


def test_a_fork_or_spawned_worker_started_by_an_unmarked_test_is_refused():
    with pytest.raises(RuntimeError, match=REFUSED):
        os.fork()
    with pytest.raises(RuntimeError, match=REFUSED):
        multiprocessing.get_context("spawn").Process(target=print).start()


@pytest.mark.process
def test_a_test_marked_process_starts_one():
    assert subprocess.run([sys.executable, "-c", "print('started')"], capture_output=True, text=True,
                          check=True).stdout == "started\n"
