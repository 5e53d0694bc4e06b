"""The server's door onto the project service: an async adapter that runs the core and asks live kernels.

HTTP handlers call these coroutines and format the records they return (service/wire.py). The core
(service/project.py) does the work; it is blocking (fsspec, hashing, file walks), so it runs in a thread
pool and the event loop keeps serving notebooks. Only this adapter talks to kernels.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import time
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any, AsyncIterator, Callable, TypeVar

from .. import __version__
from ..engine import Manifest, SnapshotEngine
from ..engine.coordination import FENCED, SERVING, STANDBY, WRITERS, Fenced
from ..engine.errors import SpotWarpError
from ..protocol import SERVER_REQUEST, KernelRequest, NoticeAnswer, NoticeRequest
from ..service import (
    VIA_REST,
    KernelAnswer,
    KernelRestore,
    LiveKernel,
    Project,
    ProjectStatus,
    RestoreResult,
    ServerFacts,
    SnapshotSummary,
)
from .kernel_link import KernelUnavailable, ask_kernel, request_safe_point_snapshot, snapshot_answering

log = logging.getLogger("spotwarp")
T = TypeVar("T")
CONTROL_TIMEOUT_S = 2.0  # a kernel answers a control request at once, even while a cell runs
POLL_S = 0.1  # how often the store is read for a requested kernel snapshot


class ServerStopping(SpotWarpError):
    """The server is shutting down: it takes no more snapshot or restore work."""


class PromotionInProgress(SpotWarpError):
    """Just promoted: the workspace is not yet caught up and the promotion snapshot not committed."""


class AsyncProject:
    """One project's snapshots as seen by one Jupyter server."""

    def __init__(self, engine: SnapshotEngine, workspace: str, root_dir: str, kernel_manager: Any,
                 session_manager: Any, kernel_timeout: float = 60.0):
        self.engine = engine
        self.workspace = os.path.realpath(workspace)
        self.project = Project(engine, self.workspace)
        self.root_dir = os.path.realpath(root_dir)
        self.kernel_manager = kernel_manager
        self.session_manager = session_manager
        self.kernel_timeout = kernel_timeout
        self.watchers: list[Any] = []  # preemption watchers (server/watchers), started with the extension
        self.responder: Any = None  # their final-snapshot sequence
        self.last_error: str | None = None
        self.resumed: list[dict[str, Any]] = []  # what resuming each notebook did on this host (server/resume.py)
        # this host's key (key_id, or the line saying it has none) and its resume's trust (engine/keys.py)
        self.trust: dict[str, Any] = {"key_id": None, "line": None}
        self.resumer: Any = None  # the Resumer of this host's resume, once one began (POST resume/run)
        # kernel id -> when this server started or restarted it, and -> the snapshot it restored it from:
        # whether a kernel can hold its notebook's stored state (GET status `newer`)
        self.kernel_started: dict[str, float] = {}
        self.restored_from: dict[str, str] = {}
        self.resuming: set[str] = set()  # notebooks whose kernels the resume is restoring now
        self.journal = self.project.journal  # one reader: each event is fetched once per server
        self.heartbeat: Any = None  # server/heartbeat.Heartbeat: this host's role under the failover lease
        # a restore holds one worker while the kernels it asks answer: room for status and snapshots meanwhile
        self._executor = ThreadPoolExecutor(max_workers=3, thread_name_prefix="spotwarp-server")
        self._lock = asyncio.Lock()  # one project snapshot or restore at a time
        # set once a promoted standby caught up and committed its promotion snapshot (at once on other hosts):
        # until then its workspace may be older than the previous holder's newest files, so nothing is committed
        self.promotion_committed = asyncio.Event()
        if not engine.fence.candidate:
            self.promotion_committed.set()
        self._closed = False

    async def run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run blocking engine work off the event loop; refused in one line once the server is stopping."""
        if self._closed:
            raise self._why_stopping()
        try:
            future = asyncio.get_running_loop().run_in_executor(self._executor, partial(fn, *args, **kwargs))
        except RuntimeError:  # the executor shut down between the check and the call
            raise self._why_stopping() from None
        try:
            return await future
        except asyncio.CancelledError:
            if self._closed:  # still queued when the server stopped (close() cancels what has not started)
                raise self._why_stopping() from None
            raise

    async def check_open(self) -> None:
        """Refused in one line, as `run` is, once the server is stopping (work that needs no thread asks this)."""
        if self._closed:
            raise self._why_stopping()

    def _why_stopping(self) -> SpotWarpError:
        # a fenced host stops itself: the request that races its shutdown learns why, not "Unhandled error"
        if self.role == FENCED:
            return Fenced(self.heartbeat.why if self.heartbeat is not None and self.heartbeat.why
                          else "this host lost the lease: it writes nothing more")
        return ServerStopping("this Jupyter server is stopping: it takes no more snapshot or restore requests")

    def close(self) -> None:
        self._closed = True
        self._executor.shutdown(wait=False, cancel_futures=True)

    @property
    def role(self) -> str:
        """serving, standby, holder or fenced (docs/failover.md)."""
        if self.heartbeat is not None:
            return self.heartbeat.role
        return STANDBY if self.engine.fence.candidate else SERVING

    async def check_fence(self) -> None:
        """Fenced (a SpotWarpError) unless this host may write to the project now; reads the lease."""
        await self.run(self.engine.fence.check, self.engine.store)

    async def catch_up(self, restored: str | None) -> str | None:
        """Just promoted: the workspace brought to the newest snapshot holding files (Project.catch_up); its id."""
        async with self._lock:
            return await self.run(self.project.catch_up, restored)

    async def promoted(self) -> Manifest | None:
        """Just promoted: commit this generation's first snapshot, naming the files and every notebook's newest state.

        From then on `latest` (ordered by generation first) is this host's, whatever a fenced-off host still writes.
        """
        async with self._lock:
            manifest = await self.run(self.project.promotion_snapshot)
        self.promotion_committed.set()
        log.warning("SpotWarp: promotion snapshot %s committed", manifest.id if manifest else None)
        return manifest

    # -- kernels ------------------------------------------------------------------------------
    def notebook_of(self, api_path: str) -> str:
        """A session's notebook as the kernel names it: its path relative to the workspace."""
        absolute = os.path.realpath(os.path.join(self.root_dir, api_path.lstrip("/")))
        relative = os.path.relpath(absolute, self.workspace)
        return api_path.lstrip("/") if relative.startswith("..") else relative.replace(os.sep, "/")

    async def live_kernels(self) -> list[dict[str, Any]]:
        """Every running kernel with the notebook of its session (None for a kernel without one)."""
        sessions = await self.session_manager.list_sessions()
        notebooks = {s["kernel"]["id"]: self.notebook_of(s["path"]) for s in sessions if s.get("kernel")}
        return [{"kernel_id": kid, "notebook": notebooks.get(kid)} for kid in self.kernel_manager.list_kernel_ids()]

    def execution_state(self, kernel_id: str) -> str | None:
        """What the server last heard of the kernel (its IOPub status): no message is sent to the kernel."""
        try:
            return getattr(self.kernel_manager.get_kernel(kernel_id), "execution_state", None)
        except KeyError:
            return None

    async def _ask_all(self, kernels: list[dict[str, Any]], request: KernelRequest) -> list[dict[str, Any] | str]:
        async def one(k: dict[str, Any]) -> dict[str, Any] | str:
            try:
                # each kernel hears its session's notebook: one renamed before it loaded SpotWarp takes the name
                addressed = dataclasses.replace(request, notebook=k["notebook"]) if k["notebook"] else request
                answer = await ask_kernel(self.kernel_manager, k["kernel_id"], addressed, self.kernel_timeout)
            except KernelUnavailable as exc:
                return str(exc)
            return answer if answer.get("ok") else str(answer.get("error") or "failed")
        return list(await asyncio.gather(*(one(k) for k in kernels)))

    # -- REST operations ----------------------------------------------------------------------
    async def status(self) -> tuple[ProjectStatus, ServerFacts]:
        """The project with its report and live kernels, and what this server knows of itself."""
        resumed = {e["kernel_id"]: e["snapshot"] for e in self.resumed if e.get("kernel_id") and e.get("snapshot")}
        live = [LiveKernel(k["kernel_id"], k["notebook"], execution_state=self.execution_state(k["kernel_id"]),
                           started_at=None if k["notebook"] in self.resuming else self.kernel_started.get(k["kernel_id"]),
                           restored_from=self.restored_from.get(k["kernel_id"]) or resumed.get(k["kernel_id"]))
                for k in await self.live_kernels()]
        status = await self.run(self.project.status, 0, True, live)
        failover = self.heartbeat.describe() if self.heartbeat is not None else \
            {"role": self.role, "generation": self.engine.fence.generation, "candidate": self.engine.fence.candidate}
        return status, ServerFacts(__version__, [w.describe() for w in self.watchers], self.last_error, failover,
                                   list(self.resumed), dict(self.trust))

    async def snapshots(self) -> list[SnapshotSummary]:
        return await self.run(self.project.list)

    async def snapshot(self, message: str | None = None, ask_kernels: bool = True,
                       only_if_changed: bool = False, collected: dict[str, Any] | None = None,
                       lock_timeout: float | None = None) -> Manifest | None:
        """One project snapshot: every live kernel snapshots itself, then files, then one commit naming all.

        A kernel running a cell is asked through its control channel and snapshots at its next safe point (a
        `resumable` step), so the answer never waits for the cell's end; that wait holds no lock, so a notice's
        final snapshot is never held up by it. `collected` (kernel id -> `{"id", "notebook"}` it committed, or
        why not) replaces asking the kernels: a preemption notice gathers them at safe points. `lock_timeout`
        bounds the wait for other work in progress.
        """
        await self.check_fence()
        busy: dict[str, Any] = {}
        if collected is None and ask_kernels:
            busy = await self._at_next_safe_point([k for k in await self.live_kernels()
                                                   if self.execution_state(k["kernel_id"]) == "busy"])
        async with self._exclusive(lock_timeout):
            if not self.promotion_committed.is_set():
                raise PromotionInProgress("promotion in progress: this host's files are not caught up yet; "
                                          "snapshot again once the promotion snapshot is committed")
            live = await self.live_kernels()
            if collected is not None:
                answers = [collected.get(k["kernel_id"], "started after the notice") for k in live]
            elif ask_kernels:
                idle = [k for k in live if k["kernel_id"] not in busy]
                asked = dict(zip((k["kernel_id"] for k in idle),
                                 await self._ask_all(idle, KernelRequest.snapshot_now(message))))
                answers = [busy[k["kernel_id"]] if k["kernel_id"] in busy else asked[k["kernel_id"]] for k in live]
            else:
                answers = ["not asked"] * len(live)
            asked_any = ask_kernels or collected is not None
            kernels = [KernelAnswer(k["kernel_id"], a["notebook"], committed=a["id"]) if isinstance(a, dict)
                       else KernelAnswer(k["kernel_id"], k["notebook"], error=a, asked=asked_any)
                       for k, a in zip(live, answers)]
            try:
                manifest = await self.run(self.project.snapshot, message, kernels, only_if_changed)
            except Exception as exc:
                self.last_error = f"{type(exc).__name__}: {exc}"
                raise
            self.last_error = None
            return manifest

    async def _at_next_safe_point(self, kernels: list[dict[str, Any]]) -> dict[str, Any]:
        """Busy kernels (a cell running) snapshot at their next safe point, asked on the control channel:
        kernel id -> `{"id", "notebook"}` of that snapshot, or why none came within `kernel_timeout`."""
        if not kernels:
            return {}
        request = NoticeRequest.new(fatal=False, reason=SERVER_REQUEST)
        acks = await asyncio.gather(*(request_safe_point_snapshot(self.kernel_manager, k["kernel_id"],
                                                                  CONTROL_TIMEOUT_S, request) for k in kernels))
        out: dict[str, Any] = {k["kernel_id"]: ack for k, ack in zip(kernels, acks) if isinstance(ack, str)}
        waiting = {k["kernel_id"]: ack for k, ack in zip(kernels, acks) if isinstance(ack, NoticeAnswer)}
        deadline = asyncio.get_running_loop().time() + self.kernel_timeout
        while waiting:
            manifests = await self.run(self.engine.manifests)
            for kernel_id, ack in list(waiting.items()):
                found = snapshot_answering(manifests, ack, request.request_id)
                if found is not None:
                    out[kernel_id] = {"id": found.id, "notebook": ack.notebook}
                    del waiting[kernel_id]
            if not waiting or asyncio.get_running_loop().time() >= deadline:
                break
            await asyncio.sleep(POLL_S)
        for kernel_id in waiting:
            out[kernel_id] = f"no snapshot at a safe point within {self.kernel_timeout:g} s (a cell without " \
                             "resumable steps?)"
        return out

    @contextlib.asynccontextmanager
    async def _exclusive(self, timeout: float | None = None) -> AsyncIterator[None]:
        """One snapshot or restore at a time; past `timeout` a final snapshot goes ahead anyway (commits are atomic)."""
        try:
            await asyncio.wait_for(self._lock.acquire(), timeout)
            held = True
        except asyncio.TimeoutError:
            log.warning("SpotWarp: another snapshot or restore is still running; the final snapshot goes ahead")
            held = False
        try:
            yield
        finally:
            if held:
                self._lock.release()

    async def restore(self, ref: str) -> RestoreResult:
        """Files back into the workspace, then every live kernel of a notebook the snapshot holds (journaled)."""
        loop = asyncio.get_running_loop()

        def ask_kernels(notebooks: frozenset[str], snapshot: str) -> list[KernelRestore]:
            # called by the core in the executor: the kernels are asked on the event loop, this thread waits
            return asyncio.run_coroutine_threadsafe(self._restore_kernels(notebooks, snapshot), loop).result()

        async with self._lock:
            result = await self.run(self.project.restore, ref, via=VIA_REST, kernels=ask_kernels,
                                    run=getattr(self.responder, "run_id", None))
        assert result is not None  # not files_only: a missing snapshot raised SnapshotNotFound
        return result

    async def _restore_kernels(self, notebooks: frozenset[str], snapshot: str) -> list[KernelRestore]:
        live = [k for k in await self.live_kernels() if k["notebook"] in notebooks]
        answers = await self._ask_all(live, KernelRequest.restore_now(snapshot))
        for k, a in zip(live, answers):
            if isinstance(a, dict) and a.get("id"):
                self.restored_from[k["kernel_id"]] = a["id"]
        return [KernelRestore(k["kernel_id"], k["notebook"], a.get("id"), a.get("restored", []), a.get("warnings", []))
                if isinstance(a, dict) else KernelRestore(k["kernel_id"], k["notebook"], error=a)
                for k, a in zip(live, answers)]

    async def backup_loop(self, interval: float) -> None:
        """Continuous backup: files (and the newest state of live kernels) every `interval` seconds, when changed."""
        while True:
            await asyncio.sleep(interval)
            if self.role not in WRITERS or not self.promotion_committed.is_set():
                continue  # standby, fenced or promotion in progress: nothing to back up from here
            try:
                manifest = await self.snapshot("automatic backup", ask_kernels=False, only_if_changed=True)
                if manifest is not None:
                    log.info("SpotWarp: backup %s committed (%d files)", manifest.id, len(manifest.files["entries"]))
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - the loop keeps going; status shows the error
                log.warning("SpotWarp: automatic backup failed: %s", exc)

    async def kernel_action(self, logger: Any = None, schema_id: str = "", data: Any = None) -> None:
        """jupyter_server's kernel_actions event (jupyter_events calls listeners with these keywords): a kernel
        started or restarted holds none of the state before."""
        if not isinstance(data, dict):
            return
        kernel_id = data.get("kernel_id")
        if data.get("status") != "success" or not kernel_id:
            return
        if data.get("action") in ("start", "restart"):
            self.kernel_started[kernel_id] = time.time()
            self.restored_from.pop(kernel_id, None)
        elif data.get("action") == "shutdown":
            self.kernel_started.pop(kernel_id, None)
            self.restored_from.pop(kernel_id, None)
