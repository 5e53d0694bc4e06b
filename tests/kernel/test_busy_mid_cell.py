"""A client that connects while a `resumable` loop runs (a browser tab opened on the cell the server re-ran on a new
host) hears the kernel say `busy` for that cell within a couple of seconds: JupyterLab takes a kernel's state only
from IOPub `status` messages, which a kernel otherwise sends only when a request starts and ends."""

from __future__ import annotations

import time
from queue import Empty

import pytest

from kernels import Kernel

pytestmark = pytest.mark.process  # every test here starts a process (a kernel, server or command)

LOOP = """import spotwarp, time
print('looping', flush=True)
for step in spotwarp.resumable(range(400), name='train'):
    time.sleep(0.05)
"""


def _until_printed(kernel: Kernel, msg_id: str, text: str) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            msg = kernel.kc.get_iopub_msg(timeout=0.5)
        except Empty:
            continue
        if msg["parent_header"].get("msg_id") == msg_id and text in msg["content"].get("text", ""):
            return
    raise AssertionError(f"{text!r} not printed")


def _statuses_heard(client, seconds: float, until: tuple[str, str] | None = None) -> list[tuple[str, str]]:
    """The (execution_state, parent msg_id) of each status `client` hears within `seconds` (or until `until`)."""
    heard: list[tuple[str, str]] = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and (until is None or until not in heard):
        try:
            msg = client.get_iopub_msg(timeout=0.5)
        except Empty:
            continue
        if msg["msg_type"] == "status":
            heard.append((msg["content"]["execution_state"], msg["parent_header"].get("msg_id")))
    return heard


def _quiet_kernel(tmp_path, project: str) -> Kernel:
    """A kernel with SpotWarp loaded whose policy takes no snapshot during these tests."""
    kernel = Kernel(tmp_path / "k", {"HOME": str(tmp_path / "home"), "SPOTWARP_STORAGE": str(tmp_path / "store"),
                                     "SPOTWARP_PROJECT": project})
    try:
        kernel.run("%load_ext spotwarp\n%spotwarp policy --every 10m --no-after-cell")
    except BaseException:
        kernel.close()
        raise
    return kernel


def _late_client(kernel: Kernel):
    """A second client of `kernel` listening on IOPub only, as a tab opened later would."""
    late = kernel.km.client()
    late.start_channels(shell=False, iopub=True, stdin=False, hb=False, control=False)
    return late


def test_a_client_connecting_mid_loop_hears_the_kernel_busy(tmp_path):
    kernel = _quiet_kernel(tmp_path, "busy")
    late = None
    try:
        msg_id = kernel.kc.execute(LOOP)
        _until_printed(kernel, msg_id, "looping")  # the loop runs: its `busy` went out before the next client
        late = _late_client(kernel)  # a second client, connected after the loop started
        # the loop runs for 20 s: its start is long gone
        heard = _statuses_heard(late, 5, until=("busy", msg_id))
        assert ("busy", msg_id) in heard, heard
        assert not any(state == "idle" for state, parent in heard if parent == msg_id), heard
    finally:
        if late is not None:
            late.stop_channels()
        kernel.close()


THREADED = """import spotwarp, threading, time
def train():
    for step in spotwarp.resumable(range(400), name='threaded'):
        time.sleep(0.05)
threading.Thread(target=train, name='train', daemon=True).start()
"""


def test_a_loop_left_running_in_a_thread_says_nothing_after_its_cell_ended(tmp_path):
    kernel = _quiet_kernel(tmp_path, "busy-thread")
    late = None
    try:
        msg_id = kernel.kc.execute(THREADED)
        kernel.kc.get_shell_msg(timeout=60)  # the cell ended (its reply); the thread's loop runs on for 20 s
        late = _late_client(kernel)
        heard = _statuses_heard(late, 4)  # the loop reaches a step every 0.05 s: a `busy` every second before
        assert ("busy", msg_id) not in heard, heard
        assert kernel.value("any(t.name == 'train' for t in threading.enumerate())")  # it was still looping
    finally:
        if late is not None:
            late.stop_channels()
        kernel.close()
