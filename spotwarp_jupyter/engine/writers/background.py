"""Background snapshots: a forked child serializes and writes while the parent runs on (Redis BGSAVE-style).

fork() gives the child a copy-on-write, point-in-time image of the whole process, so the snapshot
can never see a half-updated object, and the parent pauses only for the fork itself. State that
lives on a GPU cannot be read from a forked child: when CUDA is in use the parent serializes
first (staging device tensors to host memory), then forks a child that only writes. Where fork
is unavailable the caller falls back to a synchronous snapshot.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Protocol

from .. import hashing, pages
from ..incremental import ReusePlan
from ..manifests import Manifest
from ..pickling import main_namespace
from ..variables import CaptureOptions, KernelImage, OnWritten, capture_namespace


class Commit(Protocol):
    """What every writer calls to store an image: persist it and commit its manifest (the caller's
    SnapshotEngine.commit_image, bound to its notebook), returning the committed manifest.

    `on_written(view)`, when not None, runs after each new buffer is stored: a forked writer drops its
    copy-on-write share of the pages (`release_pages`), a staged one marks its copy's pages free.
    """

    def __call__(self, image: KernelImage, on_written: OnWritten | None) -> Manifest: ...


def fork_unavailable_reason() -> str | None:
    """Why a forked background snapshot cannot be used here, or None when it can."""
    if not hasattr(os, "fork"):
        return "this platform has no fork()"
    if os.environ.get("SPOTWARP_NO_FORK"):
        return "SPOTWARP_NO_FORK is set"
    return None


def cuda_in_use() -> bool:
    """True when this process has initialised CUDA (a forked child must not touch it)."""
    torch = sys.modules.get("torch")
    try:
        return bool(torch is not None and torch.cuda.is_initialized())
    except Exception:  # noqa: BLE001
        return False


@dataclass
class BackgroundResult:
    """What the child reported: the committed snapshot's id, or the error that stopped it."""

    ok: bool
    snapshot_id: str | None = None
    error: str | None = None
    stats: dict[str, Any] = field(default_factory=dict)
    exit_status: int | None = None


@dataclass
class BackgroundSnapshot:
    """A snapshot being written by a child process."""

    pid: int | None  # None: written by a thread of this process (nothing left to serialize, see start_in_thread)
    started: float
    pause_s: float
    staged: bool
    writer: str = "fork"  # "fork": a child process; "thread": few small values; "staged": a copy (engine/writers/staged.py)
    done: threading.Event = field(default_factory=threading.Event)
    result: BackgroundResult | None = None

    def wait(self, timeout: float | None = None) -> BackgroundResult | None:
        self.done.wait(timeout)
        return self.result

    def kill(self) -> None:
        """Stop the writer (its snapshot is then not committed; the previous ones stay intact)."""
        if self.pid is None:  # a thread writing a few small objects: it finishes on its own
            return
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _quiet_child() -> None:
    """Detach the child from the kernel's I/O: no prints over zmq, default signals, one torch thread."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        try:
            signal.signal(sig, signal.SIG_DFL)
        except (ValueError, OSError):
            pass
    devnull = open(os.devnull, "w")  # noqa: SIM115 - lives until os._exit
    sys.stdout = sys.stderr = devnull
    try:
        os.dup2(devnull.fileno(), 1)
        os.dup2(devnull.fileno(), 2)
    except OSError:
        pass
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            torch.set_num_threads(1)
        except Exception:  # noqa: BLE001
            pass


def release_pages(view: memoryview) -> None:
    """In the child, drop our copy-on-write share of pages already written, so the parent's later
    writes to them no longer need a copy (keeps the kernel's extra memory low while training runs on)."""
    if not sys.platform.startswith("linux") or view.nbytes < (1 << 20):
        return
    address = pages.address(view)  # None for a read-only view: never ours to drop
    if address is not None:
        pages.drop_range(address, view.nbytes)


def start_background(
    commit: Commit,
    namespace: Mapping[str, Any],
    hidden: Mapping[str, Any] | None,
    options: CaptureOptions | None,
    extras: Callable[[], Mapping[str, Any]],
    on_done: Callable[[BackgroundSnapshot], None] | None = None,
    reuse: ReusePlan | None = None,
    urgent: bool = False,
    captured: KernelImage | None = None,
) -> BackgroundSnapshot:
    """Fork a child that captures (unless CUDA forces staging first, or `captured` is the image) and commits.

    `commit` runs in the child, with `release_pages` as its `on_written`.
    `on_done` runs in a reaper thread of the parent once the child has exited.
    The child runs below this process's priority (the training loop keeps the CPU), unless `urgent`
    (a preemption notice's snapshot, with the loop held until it commits).
    """
    paused = time.perf_counter()
    staged_image: KernelImage | None = captured
    staged = captured is not None or cuda_in_use()
    extra_state = dict(extras()) if captured is None else {}  # RNG states, loop positions: taken at this safe point
    if staged and staged_image is None:
        staged_image = capture_now(namespace, hidden, options, extra_state, reuse)
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns
        os.close(read_fd)

        def image() -> KernelImage:
            return staged_image or capture_namespace(namespace, hidden, options, extra_state, lazy=True, reuse=reuse)

        _child(write_fd, lambda: commit(image(), release_pages), _as_dict(namespace))
    os.close(write_fd)
    if not urgent:
        _lower_priority(pid)
    job = BackgroundSnapshot(pid=pid, started=time.time(), pause_s=time.perf_counter() - paused, staged=staged)
    threading.Thread(target=_reap, args=(job, read_fd, on_done), name=f"spotwarp-reap-{pid}", daemon=True).start()
    return job


def _lower_priority(pid: int) -> None:
    """Set the writer 10 below this process (done from here: raising a child's niceness needs no privilege,
    while lowering it again, for a notice, would; so an urgent writer is never lowered in the first place)."""
    try:
        os.setpriority(os.PRIO_PROCESS, pid, min(19, os.getpriority(os.PRIO_PROCESS, 0) + 10))
    except (OSError, AttributeError):
        pass


def start_in_thread(
    commit: Commit,
    namespace: Mapping[str, Any],
    hidden: Mapping[str, Any] | None,
    options: CaptureOptions | None,
    extras: Callable[[], Mapping[str, Any]],
    on_done: Callable[[BackgroundSnapshot], None] | None = None,
    reuse: ReusePlan | None = None,
    urgent: bool = False,  # unused: a thread of this process runs at its priority anyway
) -> BackgroundSnapshot:
    """Serialize now, in this thread, and commit from a writer thread: for snapshots whose plan leaves only a
    few small values to serialize (the rest reused), cheaper than forking a copy of the whole process."""
    paused = time.perf_counter()
    image = capture_now(namespace, hidden, options, extras(), reuse)
    job = BackgroundSnapshot(pid=None, started=time.time(), pause_s=time.perf_counter() - paused, staged=True,
                             writer="thread")
    run_writer_thread(job, lambda: commit(image, None), on_done)  # the buffers are the kernel's own: kept
    return job


def run_writer_thread(job: BackgroundSnapshot, run: Callable[[], Any],
                      on_done: Callable[[BackgroundSnapshot], None] | None = None) -> None:
    """Commit from a thread of this process (`run` returns the manifest), at the kernel's priority: a thread
    set below it would hold the GIL while descheduled on a busy machine, and the kernel would wait on it."""

    def write() -> None:
        try:
            manifest = run()
            job.result = BackgroundResult(True, manifest.id, stats=manifest.stats, exit_status=0)
        except BaseException as exc:  # noqa: BLE001 - reported like a child's failure
            job.result = BackgroundResult(False, error=f"{type(exc).__name__}: {exc}")
        job.done.set()
        if on_done is not None:
            on_done(job)

    threading.Thread(target=write, name="spotwarp-writer", daemon=True).start()


def capture_now(namespace: Mapping[str, Any], hidden: Mapping[str, Any] | None, options: CaptureOptions | None,
                extras: Mapping[str, Any], reuse: ReusePlan | None) -> KernelImage:
    """Serialize the image in this process, at this safe point (what the thread, staged and GPU writers start from)."""
    with main_namespace(_as_dict(namespace)):
        return capture_namespace(namespace, hidden, options, dict(extras), reuse=reuse)


def _as_dict(namespace: Mapping[str, Any]) -> dict[str, Any]:
    return namespace if isinstance(namespace, dict) else dict(namespace)


def _child(write_fd: int, run: Callable[[], Any], namespace: dict[str, Any]) -> None:
    """In the forked child: run the snapshot, report its id (or error) through the pipe, exit."""
    code = 1
    try:
        _quiet_child()
        hashing.start_journal()  # what the writer learns of the buffers' digests goes back to the kernel
        with main_namespace(namespace):
            manifest = run()
        payload = {"ok": True, "id": manifest.id, "stats": manifest.stats, "detected": hashing.journal()}
        code = 0
    except BaseException as exc:  # noqa: BLE001 - report everything to the parent
        payload = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    try:
        os.write(write_fd, json.dumps(payload).encode())
        os.close(write_fd)
    finally:
        os._exit(code)


def _reap(job: BackgroundSnapshot, read_fd: int, on_done: Callable[[BackgroundSnapshot], None] | None) -> None:
    """In a parent thread: read the child's report, wait for its exit, record the result, call `on_done`."""
    chunks = []
    with os.fdopen(read_fd, "rb") as pipe:
        while True:
            data = pipe.read(65536)
            if not data:
                break
            chunks.append(data)
    _, status = os.waitpid(job.pid, 0)
    exit_status = os.waitstatus_to_exitcode(status)
    try:
        payload = json.loads(b"".join(chunks) or b"{}")
    except ValueError:
        payload = {}
    if payload.get("ok"):
        hashing.adopt(payload.get("detected") or [])  # our own child's blake3 results: the next snapshot skips them
        job.result = BackgroundResult(True, payload["id"], stats=payload.get("stats", {}), exit_status=exit_status)
    else:
        reason = payload.get("error") or (
            f"background writer was killed by signal {-exit_status}" if exit_status < 0
            else f"background writer exited with status {exit_status}"
        )
        job.result = BackgroundResult(False, error=reason, exit_status=exit_status)
    job.done.set()
    if on_done is not None:
        on_done(job)
