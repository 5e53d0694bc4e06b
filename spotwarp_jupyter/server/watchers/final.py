"""From a notice to a committed final snapshot: kernels snapshot at their next safe point, then files, one commit.

1. Every live kernel gets a `spotwarp_notice_request` on its control channel (served even while a cell
   runs) and answers at once; it snapshots at its next safe point (a `resumable` step, the end of the
   running cell, or right away when idle), in the background, writing only what changed.
2. The server watches the store for each answering kernel's new snapshot (its manifest names the notice's
   request id, see protocol.py), until the notice's deadline less the time the files need.
3. A project snapshot names the workspace files (only changed ones are written) and each kernel's newest
   record: the fresh one, else its newest committed state. Its manifest is the final commit.
4. Every step is recorded in the events journal; Azure's event is acknowledged once committed.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from typing import TYPE_CHECKING, Any

from ...engine import Manifest, SpotWarpError
from ...engine.journal import FINAL_SNAPSHOT_COMMITTED, NOTICE_SEEN, Journal
from ...protocol import NoticeAnswer, NoticeRequest
from ..kernel_link import request_safe_point_snapshot, snapshot_answering
from .base import Notice

if TYPE_CHECKING:
    from ..async_project import AsyncProject

log = logging.getLogger("spotwarp")
ACK_TIMEOUT_S = 2.0
POLL_S = 0.1


class PreemptionResponder:
    """Runs the final-snapshot sequence for the notices of one server run, one at a time."""

    def __init__(self, service: "AsyncProject"):
        self.service = service
        self.run_id = secrets.token_hex(4)
        self.journal = Journal(service.engine.store)
        self.last: dict[str, Any] | None = None
        self._lock = asyncio.Lock()

    async def _record(self, event: str, snapshot: str | None = None, **details: Any) -> None:
        try:
            fence = self.service.engine.fence
            heartbeat = self.service.heartbeat
            await self.service.run(self.journal.record, event, snapshot, run=self.run_id, candidate=fence.candidate,
                                   generation=fence.generation or None,
                                   host_id=heartbeat.id if heartbeat is not None else None, **details)
        except Exception as exc:  # noqa: BLE001 - the record never stops the snapshot
            log.warning("SpotWarp: event %s not recorded: %s", event, exc)

    async def __call__(self, notice: Notice) -> Manifest | None:
        try:
            await self.service.check_fence()
        except SpotWarpError as exc:
            # a standby candidate torn down, or a host that lost the lease: it must write nothing, not even this
            log.warning("SpotWarp: %s notice from %s, but %s: no final snapshot", notice.kind, notice.source, exc)
            return None
        log.warning("SpotWarp: %s notice from %s (%s); final snapshot within %.1f s", notice.kind, notice.source,
                    "fatal" if notice.fatal else "a warning", notice.window_s)
        recorded = asyncio.ensure_future(self._record(NOTICE_SEEN, source=notice.source, kind=notice.kind,
                                                      fatal=notice.fatal, window_s=round(notice.window_s, 3),
                                                      seen=notice.seen))
        async with self._lock:
            try:
                manifest = await self._final_snapshot(notice)
            finally:
                await recorded
        if notice.watcher is not None and manifest is not None:
            try:
                await notice.watcher.acknowledge(notice)
            except Exception as exc:  # noqa: BLE001
                log.warning("SpotWarp: %s notice not acknowledged: %s", notice.source, exc)
        return manifest

    def _files_reserve(self, manifests: list[Manifest], window: float) -> float:
        """Seconds to keep for the files and the commit: 1.5x the last project snapshot's, within limits."""
        last = next((m for m in manifests if m.kind == "project"), None)
        took = float(last.stats.get("duration_s") or 0.5) if last else 1.0
        return min(max(0.5, 1.5 * took), 0.4 * window)

    async def _final_snapshot(self, notice: Notice) -> Manifest | None:
        service = self.service
        live = await service.live_kernels()
        request = NoticeRequest.new(notice.fatal, notice.deadline)
        ack_timeout = min(ACK_TIMEOUT_S, max(0.2, notice.window_s / 4))
        acks = await asyncio.gather(*(request_safe_point_snapshot(service.kernel_manager, k["kernel_id"], ack_timeout,
                                                                  request)
                                      for k in live))
        waiting = {k["kernel_id"]: ack for k, ack in zip(live, acks) if isinstance(ack, NoticeAnswer)}
        collected: dict[str, Any] = {k["kernel_id"]: ack for k, ack in zip(live, acks) if isinstance(ack, str)}
        manifests = await service.run(service.engine.manifests)
        stop_waiting = notice.deadline - self._files_reserve(manifests, notice.window_s)
        while waiting:
            for kernel_id, ack in list(waiting.items()):
                found = snapshot_answering(manifests, ack, request.request_id)
                if found is not None:
                    collected[kernel_id] = {"id": found.id, "notebook": ack.notebook}
                    del waiting[kernel_id]
            if not waiting or time.time() >= stop_waiting:
                break
            await asyncio.sleep(POLL_S)
            manifests = await service.run(service.engine.manifests)
        for kernel_id in waiting:
            collected[kernel_id] = "no snapshot at a safe point before the deadline (a cell without resumable steps?)"
        waited = time.time() - notice.seen
        message = f"final snapshot: {notice.kind} notice from {notice.source}" if notice.fatal \
            else f"snapshot on a {notice.kind} from {notice.source}"
        lock_timeout = max(0.1, notice.deadline - time.time() - 0.5)
        manifest = await service.snapshot(message, collected=collected, lock_timeout=lock_timeout)
        took = time.time() - notice.seen
        stats = manifest.stats if manifest is not None else {}
        self.last = {"id": manifest.id if manifest else None, "notice": notice.kind, "source": notice.source,
                     "notice_to_commit_s": round(took, 3), "kernels_waited_s": round(waited, 3)}
        if manifest is not None:
            log.warning("SpotWarp: final snapshot %s committed %.2f s after the %s notice (%s fresh, %s stale)",
                        manifest.id, took, notice.kind, stats.get("kernels_fresh"), stats.get("kernels_stale"))
            await self._record(FINAL_SNAPSHOT_COMMITTED, manifest.id, source=notice.source, kind=notice.kind,
                               fatal=notice.fatal, notice_to_commit_s=round(took, 3),
                               kernels_waited_s=round(waited, 3), kernels_fresh=stats.get("kernels_fresh"),
                               kernels_stale=stats.get("kernels_stale"), bytes_written=stats.get("bytes_written"))
        return manifest
