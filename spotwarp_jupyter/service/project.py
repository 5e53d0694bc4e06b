"""One project's snapshots behind every door: the CLI, the server's REST API, the hub's restore-on-start.

Synchronous and free of Jupyter: a door parses its input, calls `Project`, and formats the record it gets
back (`wire.py`). Live kernels are outside: the server passes what they answered, or a callable that asks them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import time
from typing import Any, Callable, Iterator, Sequence

from ..engine.errors import SnapshotNotFound
from ..engine.files import Progress
from ..engine.journal import Journal, restoring
from ..engine.journal import report as preemption_report
from ..engine.keys import Trust, resume_trust, vouched
from ..engine.manifests import Manifest, committed_kernel_record, newer_state, newest_kernel_records
from ..engine.snapshots import SnapshotEngine
from .records import VIAS, KernelAnswer, KernelRestore, LiveKernel, ProjectStatus, RestoreResult, SnapshotSummary
from .run_cells import bring_back_run_cells

log = logging.getLogger("spotwarp")

# asks the live kernels of these notebooks to restore from this snapshot ref; what each answered
KernelRestorer = Callable[[frozenset[str], str], Sequence[KernelRestore]]


class Project:
    """A project's store and (optionally) its workspace folder: list, status, snapshot, restore, report."""

    def __init__(self, engine: SnapshotEngine, workspace: str | None = None, resume_unsigned: bool | None = None):
        """`resume_unsigned`: recorded cells no key vouches for may go into notebooks (the opt-in; None: from
        SPOTWARP_RESUME_UNSIGNED)."""
        self.engine = engine
        self.workspace = workspace
        if resume_unsigned is None:
            from ..engine.settings import resolve_setting

            resume_unsigned = bool(resolve_setting("resume_unsigned"))
        self.resume_unsigned = resume_unsigned
        self.journal = Journal(engine.store)  # one reader: a long-lived project fetches each event once

    @property
    def name(self) -> str:
        return self.engine.settings.project

    def list(self) -> list[SnapshotSummary]:
        """Every readable snapshot, newest first."""
        return [SnapshotSummary.of(m) for m in self.engine.manifests()]

    def status(self, recent_events: int = 5, with_report: bool = False,
               live: Sequence[LiveKernel] = ()) -> ProjectStatus:
        """Snapshots, the newest and its age, the newest `recent_events` events, the report; `live` kernels'
        newest snapshots."""
        listing = self.engine.manifests()
        report = None
        if with_report:
            events = self.journal.events()
            recent = events[-recent_events:] if recent_events > 0 else []
            report = preemption_report(events, listing)
        else:
            recent = self.journal.events(limit=recent_events) if recent_events > 0 else []
        last = SnapshotSummary.of(listing[0]) if listing else None
        kernels = [dataclasses.replace(k, last_snapshot=next(
            (m.id for m in listing if k.notebook and k.notebook in m.kernels), None), newer=stored_state_not_held(
            listing, k)) for k in live]
        return ProjectStatus(
            project=self.name, storage=self.engine.settings.storage, workspace=self.workspace,
            snapshots=len(listing), last_snapshot=last, age_s=None if last is None else last.age_s(),
            rejected=dict(self.engine.rejected), recent_events=list(recent), report=report, kernels=kernels)

    def report(self) -> dict[str, Any]:
        """Preemptions survived, work lost, time to resume, compute saved (engine.journal.report)."""
        return preemption_report(self.journal.events(), self.engine.manifests())

    # -- snapshots ----------------------------------------------------------------------------
    def snapshot(self, message: str | None = None, kernels: Sequence[KernelAnswer] | None = None,
                 only_if_changed: bool = False, progress: Progress | None = None) -> Manifest | None:
        """Workspace files plus each live kernel's state in one commit; None when nothing changed (`only_if_changed`).

        A kernel that committed gives its fresh record; one that did not keeps its newest committed state (stale),
        and, when it was asked, is listed with why (missing). `kernels` None: files only, no kernel stats.
        """
        records: dict[str, Any] = {}
        fresh, stale, missing = [], [], {}
        listing = self.engine.manifests() if kernels else []  # listed once, whatever the number of kernels
        newest = newest_kernel_records(listing)
        for k in kernels or ():
            if k.committed is not None and k.notebook is not None:
                record = committed_kernel_record(listing, k.committed, k.notebook)
                # never older state than one already committed: `latest` does not move back in training
                newer = newest.get(k.notebook)
                records[k.notebook] = newer if newer is not None and newer_state(newer, record) else record
                fresh.append(k.notebook)
                continue
            # a busy kernel keeps its newest committed state in the project snapshot
            if k.notebook in newest:
                records[k.notebook] = newest[k.notebook]
                stale.append(k.notebook)
            if k.asked:
                missing[k.notebook or k.kernel_id] = k.error or "failed"
        extra = {"kernels_fresh": sorted(fresh), "kernels_stale": sorted(stale), "kernels_missing": missing} \
            if kernels is not None else None
        return self.engine.snapshot_project(self._need_workspace(), records, message, extra, only_if_changed,
                                progress=progress)

    def catch_up(self, restored: str | None) -> str | None:
        """Just promoted: bring the workspace from the snapshot it was restored from at start (`restored`) to the
        newest holding files, which the previous holder may have committed since (a warm standby restored long
        before the loss). Files the newer snapshot no longer names are removed, so the workspace is that
        snapshot's. The id the workspace now holds; a workspace that was not restored at start (None: it held
        files already, or the project had none) is left as it is. If `restored` was pruned since (`gc --keep`),
        the newest files still come back, but files it held that the newer snapshot dropped stay."""
        if restored is None:
            return None
        manifest = self.choose("latest", files_only=True)
        if manifest is None or manifest.id == restored:
            return restored if manifest is None else manifest.id
        workspace = self._need_workspace()
        try:
            before = self.engine.get(restored) if restored else None
        except SnapshotNotFound:
            before = None
            log.warning("SpotWarp catch-up: snapshot %s restored at start was pruned; newest files %s restored, "
                        "files it dropped are left in the workspace", restored, manifest.id)
        self.engine.restore_files(manifest, workspace)
        bring_back_run_cells(workspace, self._records("latest", manifest))
        root = os.path.realpath(workspace)
        dropped = set(_entries(before)) - set(_entries(manifest)) if manifest.files else set()
        for relpath in sorted(dropped):
            named = os.path.join(root, *relpath.split("/"))
            path = os.path.realpath(named)
            if path.startswith(root + os.sep) and not os.path.islink(named) and os.path.isfile(path):
                os.remove(path)
        return manifest.id

    def promotion_snapshot(self) -> Manifest | None:
        """The first snapshot of a newly promoted host: the files and every notebook's newest kernel state."""
        return self.engine.snapshot_project(self._need_workspace(), newest_kernel_records(self.engine.manifests()),
                                f"promoted: generation {self.engine.fence.generation}")

    # -- restores -----------------------------------------------------------------------------
    def choose(self, ref: str = "latest", files_only: bool = False) -> Manifest | None:
        """The snapshot a restore of `ref` uses: for `latest` with a workspace, the newest holding files
        (refusing a newer one that fails its checks), else `ref` itself. Committed kernel state is never ignored:
        with no snapshot holding files (a loss before the first, an older store), the newest snapshot, whose
        notebooks are rebuilt from the cells their kernels ran. None only with `files_only` and no snapshot.
        `latest` is refused (RolledBack) when the snapshot the store's signed head names is missing or damaged."""
        if (ref or "").strip() in ("latest", ""):
            self.engine.check_head()  # RolledBack: the store's newest commit is missing, never gone back to silently
        manifest = self.engine.with_files(ref) if self.workspace else None
        if manifest is None and (not files_only or (self.workspace and ref in ("latest", "", None))):
            if files_only and not self.engine.manifests():
                return None
            manifest = self.engine.get(ref)
        return manifest

    def _records(self, ref: str, manifest: Manifest) -> dict[str, Any]:
        """The kernel records whose cells go into the restored notebooks: for `latest`, every notebook's newest
        (what its kernel restores), else the snapshot's own; only those a key vouches for, unless opted in (a
        store writer's recorded source never lands in a notebook unannounced)."""
        if (ref or "").strip() in ("latest", ""):
            sources = resume_sources(self.engine.manifests(), None, "latest")
        else:
            sources = {notebook: manifest for notebook in manifest.kernels}
        kept = {nb: m.kernels[nb] for nb, m in sources.items() if self.resume_unsigned or vouched(m, self.engine.key)}
        if len(kept) < len(sources):
            log.warning("SpotWarp: cells recorded in %s not put into the notebooks: no key vouches for them",
                        ", ".join(sorted(set(sources) - set(kept))))
        return kept

    def resume_trust(self, snapshot_id: str | None, ref: str = "latest") -> Trust:
        """Whether a resume from `snapshot_id` (files restored from it; `latest`: with the kernel snapshots taken
        after it) runs only code a key vouches for; or, opted in, the warning to show (blocking: lists the store)."""
        sources = resume_sources(self.engine.manifests(), snapshot_id, ref)
        return resume_trust(self.name, {m.id: m for m in sources.values()}.values(), self.engine.key, self.resume_unsigned)

    def restore(self, ref: str = "latest", *, via: str, files_only: bool = False, chosen: Manifest | None = None,
                progress: Progress | None = None, kernels: KernelRestorer | None = None,
                run: str | None = None, keep_existing: bool = False) -> RestoreResult | None:
        """Files back into the workspace, then (through `kernels`) the live kernels of the snapshot's notebooks.

        Journaled (restore_started / restore_finished, with `via`) so `report` shows the time to resume, unless
        this host is a standby failover candidate, which writes nothing to the project. With `files_only`, only a
        snapshot holding files is restored, and None says there is none (a new project). `chosen`: what
        `choose(ref, files_only)` already answered (a door that shows the id before the work). `run`: the
        server run restoring (as its notices name it), so a run's own restore never counts as its recovery.
        `keep_existing` (a kept home): files and notebooks on disk stay as they are; only missing ones come back.
        """
        if via not in VIAS:
            raise ValueError(f"unknown door {via!r}: one of {', '.join(VIAS)}")
        started = time.perf_counter()
        manifest = chosen if chosen is not None else self.choose(ref, files_only)
        if manifest is None:
            return None
        summary = SnapshotSummary.of(manifest)
        if self.workspace is None and kernels is None:  # nothing to bring back here: the kernel restores itself
            return RestoreResult(summary, via, None, None, [], 0.0, journaled=False)
        journaled = not self.engine.fence.candidate
        rebuilt: list[str] = []
        with self._journal(manifest.id, via, journaled, run) as outcome:
            files = None
            if self.workspace is not None:
                records = self._records(ref, manifest)
                if keep_existing:  # a notebook the user kept is theirs as it is; a missing one comes back whole
                    records = {nb: r for nb, r in records.items()
                               if not os.path.lexists(os.path.join(self.workspace, *nb.split("/")))}
                files = self.engine.restore_files(manifest, self.workspace, progress=progress,
                                                  keep_existing=keep_existing)
                outcome.update(files_restored=files.files_restored, bytes_restored=files.bytes_restored)
                # cells run but not saved before the snapshot: the notebook holds every cell behind the state
                rebuilt = bring_back_run_cells(self.workspace, records)
            restored = list(self._restore_kernels(ref, manifest, kernels)) if kernels is not None else []
            if kernels is not None:
                outcome.update(kernels=len(restored), kernels_failed=sum(1 for k in restored if k.error))
        return RestoreResult(summary, via, self.workspace, files, restored, time.perf_counter() - started,
                             journaled, tuple(rebuilt))

    def _restore_kernels(self, ref: str, manifest: Manifest, kernels: KernelRestorer) -> Sequence[KernelRestore]:
        # for `latest` each kernel restores its own notebook's newest state (kernels snapshot more often than files)
        if ref.strip() in ("latest", ""):
            held = frozenset(nb for m in self.engine.manifests() for nb in m.kernels)
            return kernels(held, "latest")
        return kernels(frozenset(manifest.kernels), manifest.id)

    @contextlib.contextmanager
    def _journal(self, snapshot: str, via: str, journaled: bool, run: str | None) -> Iterator[dict[str, Any]]:
        if not journaled:
            yield {}
            return
        with restoring(self.engine.store, snapshot, what="files", via=via, run=run) as outcome:
            yield outcome

    def _need_workspace(self) -> str:
        if self.workspace is None:
            raise ValueError("this project was opened without a workspace folder")
        return self.workspace


def resume_sources(listing: list[Manifest], snapshot_id: str | None, ref: str) -> dict[str, Manifest]:
    """Each notebook's manifest a resume takes its kernel record from: for `latest`, the newest among the
    snapshot `snapshot_id` and those after it (all of `listing` when None), else that snapshot's own."""
    base = len(listing) - 1 if snapshot_id is None else \
        next((i for i, m in enumerate(listing) if m.id == snapshot_id), None)
    if base is None or base < 0:
        return {}
    scope = listing[:base + 1] if ref in ("latest", "", None) else [listing[base]]
    out: dict[str, Manifest] = {}
    for manifest in scope:
        for notebook in manifest.kernels:
            out.setdefault(notebook, manifest)
    return out


def _entries(manifest: Manifest | None) -> dict[str, Any]:
    """The files a snapshot names (relative path -> entry); none for None or a snapshot without files."""
    entries = ((manifest.files or {}) if manifest is not None else {}).get("entries")
    return entries if isinstance(entries, dict) else {}


def stored_state_not_held(listing: Sequence[Manifest], kernel: LiveKernel) -> dict[str, Any] | None:
    """The notebook's newest stored kernel state when `kernel` cannot hold it: the state is older than the
    kernel's start and the server did not restore the kernel (a kept home opened without a resume, a resume
    refused or off, a restarted kernel). None when the kernel was restored, or its start is unknown."""
    if kernel.notebook is None or kernel.started_at is None or kernel.restored_from is not None:
        return None
    for m in listing:
        record = m.kernels.get(kernel.notebook)
        if record is None:
            continue
        variables = record.get("variables") or {}
        state_at = record.get("state_at")
        at = state_at if isinstance(state_at, (int, float)) else m.created
        if not variables or at >= kernel.started_at:
            return None
        return {"id": m.id, "created": m.created_iso, "age_s": round(max(0.0, time.time() - at), 1),
                "variables": len(variables)}
    return None
