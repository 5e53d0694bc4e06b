"""The server's door onto the engine: project status, snapshots of files and live kernels, restores.

HTTP handlers call these coroutines; blocking engine work (fsspec, hashing, file walks) runs in a
thread pool so the event loop keeps serving notebooks.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any, AsyncIterator, Callable, TypeVar

from .. import __version__
from ..cli import manifest_summary
from ..engine import Manifest, SnapshotEngine
from ..engine.fence import SERVING, STANDBY, WRITERS
from ..engine.journal import Journal
from ..engine.journal import report as preemption_report
from ..engine.project import (
    carried_kernel_states,
    kernel_state,
    latest_kernel_state,
    restore_project_files,
    snapshot_project,
    with_files,
)
from ..protocol import KernelRequest
from .kernel_link import KernelUnavailable, ask_kernel

log = logging.getLogger("spotwarp")
T = TypeVar("T")


class ProjectService:
    """One project's snapshots as seen by one Jupyter server."""

    def __init__(self, engine: SnapshotEngine, workspace: str, root_dir: str, kernel_manager: Any,
                 session_manager: Any, kernel_timeout: float = 60.0):
        self.engine = engine
        self.workspace = os.path.realpath(workspace)
        self.root_dir = os.path.realpath(root_dir)
        self.kernel_manager = kernel_manager
        self.session_manager = session_manager
        self.kernel_timeout = kernel_timeout
        self.watchers: list[Any] = []  # preemption watchers (server/watchers), started with the extension
        self.responder: Any = None  # their final-snapshot sequence
        self.last_error: str | None = None
        self.journal = Journal(engine.store)  # one reader: each event is fetched once per server
        self.heartbeat: Any = None  # server/heartbeat.Heartbeat: this host's role under the failover lease
        self._executor = ThreadPoolExecutor(max_workers=2, thread_name_prefix="spotwarp-server")
        self._lock = asyncio.Lock()  # one project snapshot or restore at a time

    async def run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run blocking engine work off the event loop."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, partial(fn, *args, **kwargs))

    def close(self) -> None:
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

    async def promoted(self) -> Manifest | None:
        """Just promoted: commit this generation's first snapshot, naming the files and every notebook's newest state.

        From then on `latest` (ordered by generation first) is this host's, whatever a fenced-off host still writes.
        """
        async with self._lock:
            kernels = await self.run(carried_kernel_states, self.engine)
            manifest = await self.run(snapshot_project, self.engine, self.workspace, kernels,
                                      f"promoted: generation {self.engine.fence.generation}")
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

    async def _ask_all(self, kernels: list[dict[str, Any]], request: KernelRequest) -> list[dict[str, Any] | str]:
        async def one(k: dict[str, Any]) -> dict[str, Any] | str:
            try:
                answer = await ask_kernel(self.kernel_manager, k["kernel_id"], request, self.kernel_timeout)
            except KernelUnavailable as exc:
                return str(exc)
            return answer if answer.get("ok") else str(answer.get("error") or "failed")
        return list(await asyncio.gather(*(one(k) for k in kernels)))

    # -- REST operations ----------------------------------------------------------------------
    async def status(self) -> dict[str, Any]:
        listing = await self.run(self.engine.manifests)
        events = await self.run(self.journal.events)
        last = listing[0] if listing else None
        kernels = await self.live_kernels()
        for k in kernels:
            k["last_snapshot"] = next((m.id for m in listing if k["notebook"] and k["notebook"] in m.kernels), None)
        return {
            "version": __version__,
            "project": self.engine.settings.project,
            "storage": self.engine.settings.storage,
            "workspace": self.workspace,
            "last_snapshot": None if last is None else {**manifest_summary(last), "age_s": round(time.time() - last.created, 1)},
            "kernels": kernels,
            "watchers": [w.describe() for w in self.watchers],
            "last_error": self.last_error,
            "report": preemption_report(events, listing),
            "failover": self.heartbeat.describe() if self.heartbeat is not None else
            {"role": self.role, "generation": self.engine.fence.generation, "candidate": self.engine.fence.candidate},
        }

    async def snapshots(self) -> list[dict[str, Any]]:
        return [manifest_summary(m) for m in await self.run(self.engine.manifests)]

    async def snapshot(self, message: str | None = None, ask_kernels: bool = True,
                       only_if_changed: bool = False, collected: dict[str, Any] | None = None,
                       lock_timeout: float | None = None) -> Manifest | None:
        """One project snapshot: every live kernel snapshots itself, then files, then one commit naming all.

        `collected` (kernel id -> `{"id", "notebook"}` it committed, or why not) replaces asking the kernels: a
        preemption notice gathers them at safe points. `lock_timeout` bounds the wait for other work in progress.
        """
        await self.check_fence()
        async with self._exclusive(lock_timeout):
            live = await self.live_kernels()
            if collected is not None:
                answers = [collected.get(k["kernel_id"], "started after the notice") for k in live]
            else:
                answers = await self._ask_all(live, KernelRequest.snapshot_now(message)) if ask_kernels \
                    else ["not asked"] * len(live)
            kernels: dict[str, Any] = {}
            fresh, stale, missing = [], [], {}
            for k, answer in zip(live, answers):
                if isinstance(answer, dict):
                    kernels[answer["notebook"]] = await self.run(kernel_state, self.engine, answer["id"], answer["notebook"])
                    fresh.append(answer["notebook"])
                    continue
                # a busy kernel keeps its newest committed state in the project snapshot
                previous = await self.run(latest_kernel_state, self.engine, k["notebook"]) if k["notebook"] else None
                if previous is not None:
                    kernels[k["notebook"]] = previous[1]
                    stale.append(k["notebook"])
                if ask_kernels or collected is not None:
                    missing[k["notebook"] or k["kernel_id"]] = answer
            extra = {"kernels_fresh": sorted(fresh), "kernels_stale": sorted(stale), "kernels_missing": missing}
            try:
                manifest = await self.run(snapshot_project, self.engine, self.workspace, kernels, message,
                                          extra, only_if_changed)
            except Exception as exc:
                self.last_error = f"{type(exc).__name__}: {exc}"
                raise
            self.last_error = None
            return manifest

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

    async def restore(self, ref: str) -> dict[str, Any]:
        """Files back into the workspace, then every live kernel of a notebook the snapshot holds.

        For `latest`, files come from the newest snapshot holding files and each kernel from the newest
        snapshot of its own notebook (kernels usually snapshot more often than files change).
        """
        async with self._lock:
            manifest = await self.run(with_files, self.engine, ref)
            if manifest is None:
                manifest = await self.run(self.engine.get, ref)
            report = await self.run(restore_project_files, self.engine, manifest, self.workspace)
            latest = ref.strip() in ("latest", "")
            held = {nb for m in await self.run(self.engine.manifests) for nb in m.kernels} if latest \
                else set(manifest.kernels)
            live = [k for k in await self.live_kernels() if k["notebook"] in held]
            answers = await self._ask_all(live, KernelRequest.restore_now("latest" if latest else manifest.id))
            kernels = []
            for k, answer in zip(live, answers):
                if isinstance(answer, dict):
                    kernels.append({**k, "id": answer.get("id"), "restored": answer.get("restored", []),
                                    "warnings": answer.get("warnings", [])})
                else:
                    kernels.append({**k, "restored": [], "error": answer})
            return {"id": manifest.id, "files_restored": report.files_restored,
                    "files_unchanged": report.files_unchanged, "bytes_restored": report.bytes_restored,
                    "duration_s": round(report.duration_s, 3), "kernels": kernels}

    async def backup_loop(self, interval: float) -> None:
        """Continuous backup: files (and the newest state of live kernels) every `interval` seconds, when changed."""
        while True:
            await asyncio.sleep(interval)
            if self.role not in WRITERS:
                continue  # standby or fenced: nothing to back up from here
            try:
                manifest = await self.snapshot("automatic backup", ask_kernels=False, only_if_changed=True)
                if manifest is not None:
                    log.info("SpotWarp: backup %s committed (%d files)", manifest.id, len(manifest.files["entries"]))
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - the loop keeps going; status shows the error
                log.warning("SpotWarp: automatic backup failed: %s", exc)

