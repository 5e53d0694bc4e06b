"""The snapshot engine: one object that makes, lists, restores, verifies and prunes snapshots.

The kernel extension, the server, and the CLI are thin doors onto this class. Reading manifests is
manifests.ManifestCatalog's job, verifying verify.py's, pruning prune.py's; this class commits and
restores. Every commit, a kernel's variables or a project's files and kernel records, goes one way:
hold a write lock, store what changed, build the manifest, check the lock, then `commit_manifest`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
from typing import Any, Iterator, Mapping

from .coordination import Fence, Fenced, WriteLock
from .coordination.fence import lease_entry_times
from .coordination.head import RolledBack, advance_head, missing_head, read_head
from .errors import SnapshotNotFound, SpotWarpError, StorageError
from .files import (
    IGNORE_FILE,
    Cut,
    FileRestoreReport,
    IgnoreRules,
    Progress,
    backup_workspace,
    files_changed,
    restore_files,
    take_cut,
)
from .incremental import ReusePlan, StaleBaseline
from .keys import KeyState, settle_key, use_key
from .keys import project_key as kept_key
from .manifests import (
    RECORD,
    Manifest,
    ManifestCatalog,
    collect_facts,
    new_snapshot_id,
    newest_kernel_records,
    package_versions,
    record_objects,
    signing_scope,
    trust_warning,
    version_warnings,
    with_record,
)
from .pickling import main_namespace
from .prune import GcReport, collect_garbage
from .settings import Settings
from .storage import CHUNK_SIZE, Store
from .variables import (
    BackgroundLoad,
    CaptureOptions,
    KernelImage,
    LoadResult,
    OnWritten,
    capture_namespace,
    carry_damaged,
    load_record,
    persist_image,
    restore_progressive,
)
from .verify import VerifyReport, verify_snapshots

log = logging.getLogger("spotwarp")
DEFAULT_NOTEBOOK = "default"
PROJECT_KIND = "project"
__all__ = ["DEFAULT_NOTEBOOK", "GcReport", "SnapshotEngine", "VerifyReport"]


def _modules_used(record: dict[str, Any]) -> set[str]:
    """Top-level modules a kernel record's state comes from (for version checks)."""
    modules = {m.partition(".")[0] for m in (record.get("imports") or {}).values()}
    for info in (record.get("variables") or {}).values():
        modules.add(str(info.get("type", "")).partition(".")[0])
    return {m for m in modules if m}


LEASE_TIMES_TTL_S = 2.0  # how long the lease entries' times are reused between listings


class SnapshotEngine:
    """Snapshots of one project in one storage location."""

    def __init__(self, settings: Settings, key: bytes | None = None, create: bool = True, fence: Fence | None = None):
        self.settings = settings
        # SPOTWARP_KEY, else the project's key kept on this host (engine/keys.py); `settle_key` creates one
        self.key = key if key is not None else kept_key(settings.project, settings.storage)
        self.fence = fence if fence is not None else Fence.from_env()
        self.store = Store(settings.storage, settings.project, settings.storage_options, create=create)
        self.scope = signing_scope(settings)
        self.catalog = ManifestCatalog(self.store, settings, self.key, self.scope)
        self.catalog.screen = self._drop_late_writes
        self._written_at: dict[str, float | None] = {}  # manifest name -> the store's write time (immutable)
        self._lease_times: tuple[float, dict[int, float | None]] = (0.0, {})
        self._lock = threading.Lock()
        self._rules: tuple[tuple[Any, ...], IgnoreRules] | None = None  # the workspace's, while its file is unchanged

    def settle_key(self) -> KeyState:
        """Sign from now on with this host's key for the project, created when the store holds none of its
        snapshots; made this process's (and its children's) SPOTWARP_KEY. Blocking: lists the store once when
        no key is known. A store that holds snapshots gets no new key: `line` says what the host needs."""
        if self.key:
            state = KeyState(self.key, "environment" if os.environ.get("SPOTWARP_KEY") else "file")
        else:
            try:
                stored: list[Manifest] | None = self.manifests()
            except SpotWarpError as exc:
                log.warning("SpotWarp: the store's snapshots could not be listed, no key created: %s", exc)
                stored = None
            if stored is not None and not stored and self.store.manifest_names():
                stored = None  # snapshots none of which could be read: never a new key over them
            state = settle_key(self.settings.project, self.settings.storage, stored)
        if state.key:
            self.key = self.catalog.key = state.key
            use_key(state.key)
        return state

    # -- reading: manifests/catalog.py ---------------------------------------------------------------
    @property
    def rejected(self) -> dict[str, str]:
        """Manifests refused (damaged, unsigned, foreign), with why."""
        return self.catalog.rejected

    def manifests(self, notebook: str | None = None) -> list[Manifest]:
        """Committed snapshots, newest first (for one notebook's kernel when `notebook` is given)."""
        return self.catalog.manifests(notebook)

    def _drop_late_writes(self, listing: list[Manifest]) -> list[Manifest]:
        """Leave out manifests written after the lease moved past their generation (by the store's own times).

        A writer that dies between its manifest's write and its re-check of the lease leaves such a manifest
        behind; it would otherwise be `latest` until the new holder's first snapshot lands.
        """
        if not listing:
            return listing
        when, entries = self._lease_times
        if time.monotonic() - when > LEASE_TIMES_TTL_S:
            try:
                entries = lease_entry_times(self.store, self.key)
            except SpotWarpError:
                return listing  # the store unreachable: nothing to compare with
            self._lease_times = (time.monotonic(), entries)
        if not entries:
            return listing
        top = max(entries)
        suspects = [m.name for m in listing if m.generation < top and m.name not in self._written_at]
        if suspects:
            try:
                self._written_at.update(self.store.manifest_times(suspects))
            except SpotWarpError:
                return listing
        out = []
        for m in listing:
            if m.generation < top:
                moved = min((t for g, t in entries.items() if g > m.generation and t is not None), default=None)
                written = self._written_at.get(m.name)
                if moved is not None and written is not None and written > moved:
                    continue  # a late write of a fenced-off holder: never `latest`, never restored
            out.append(m)
        return out

    def get(self, ref: str = "latest", notebook: str | None = None) -> Manifest:
        """A snapshot by `latest`, full id, or unique id prefix."""
        return self.catalog.get(ref, notebook)

    def refuse_newer_than(self, manifest: Manifest | None) -> None:
        """Raise the refusal of a snapshot newer than `manifest` (or any, for None) that fails its checks."""
        self.catalog.refuse_newer_than(manifest)

    @contextlib.contextmanager
    def writing(self) -> Iterator[WriteLock]:
        """Hold a write lock from before the first presence check of reused objects until the commit."""
        lock = WriteLock(self.store).acquire()
        try:
            self.store.sweep_temporaries()
            yield lock
        finally:
            lock.release()

    # -- kernels ----------------------------------------------------------------------------
    def snapshot_kernel(
        self,
        namespace: Mapping[str, Any],
        notebook: str = DEFAULT_NOTEBOOK,
        message: str | None = None,
        hidden: Mapping[str, Any] | None = None,
        options: CaptureOptions | None = None,
        extras: Mapping[str, Any] | None = None,
        requests: list[str] | None = None,
        reuse: ReusePlan | None = None,
        stats: dict[str, Any] | None = None,
        annotations: Mapping[str, Any] | None = None,
        cut: Cut | None = None,
    ) -> Manifest:
        """Capture and commit the variables of `namespace` as one snapshot, synchronously.

        `requests`: ids of the requests (protocol.py) this snapshot answers, recorded in its manifest.
        `annotations`: facts about the kernel kept in its record (`aliases`, `policy`, `positions`: docs/design.md).
        `cut`: the workspace at this instant (`cut_workspace`), committed in the same manifest.
        """
        started = time.perf_counter()
        with main_namespace(dict(namespace) if not isinstance(namespace, dict) else namespace):
            image = capture_namespace(namespace, hidden, options, extras, lazy=True, reuse=reuse)
            return self.commit_image(image, notebook, message, started=started, stats=stats, requests=requests,
                                     annotations=annotations, cut=cut)

    def cut_workspace(self, previous: Manifest | None = None) -> Cut | None:
        """The workspace now (`settings.workspace`), for a kernel snapshot taken at this instant; None without one.

        `previous`: a snapshot holding files (this kernel's last), against which small changed files are found
        and read now (engine/files/cut.py); every other file costs one stat here."""
        workspace = self.settings.workspace
        if not workspace or not os.path.isdir(workspace):
            return None
        return take_cut(workspace, self.ignore_rules(workspace), previous.files if previous is not None else None)

    def commit_image(self, image: KernelImage, notebook: str = DEFAULT_NOTEBOOK, message: str | None = None,
                     started: float | None = None, stats: dict[str, Any] | None = None,
                     on_written: OnWritten | None = None,
                     requests: list[str] | None = None, annotations: Mapping[str, Any] | None = None,
                     cut: Cut | None = None) -> Manifest:
        """Persist a captured image (only what changed) and commit its manifest (naming `requests` it answers).

        The image's groups come out of capture's stages as persisting asks for them (the pipeline's order is in
        variables/capture.py); a stale reuse plan is dropped before they start (`_check_reuse_base`).

        `annotations`: facts about the kernel kept in its record: the notebook's former names (`aliases`), its
        policy, its `resumable` positions (docs/design.md). `cut`: the workspace at the image's instant; the
        manifest then also holds those files and every other notebook's newest kernel record, so a restore of it
        gives files and kernel state of one moment."""
        started = time.perf_counter() if started is None else started
        # the manifest's package versions (a metadata scan, ~0.5 s once per process) are learnt while the
        # objects are written, not after them
        threading.Thread(target=package_versions, name="spotwarp-env", daemon=True).start()
        with self._lock, self.writing() as lock:
            listing = self._listing()
            previous = [m for m in listing if notebook in m.kernels][:1]
            records = [r for m in previous for r in m.kernels.values()]
            dropped = self._check_reuse_base(image, previous, notebook)
            kernel, objects, pstats = persist_image(self.store, image, records, on_written)
            annotations = dict(annotations or {})
            carry_damaged(kernel, objects, annotations.pop("damaged", None) or {})
            for name, value in annotations.items():
                if value and name not in kernel:  # what persist_image wrote is never replaced
                    kernel[name] = value
            kernels, files, file_stats = {notebook: kernel}, None, {}
            if cut is not None:
                kernels, files, file_stats = self._with_cut(cut, listing, notebook, kernel, objects)
            manifest = self.new_manifest("kernel", message, parent=previous[0].id if previous else None,
                                         kernels=kernels, objects=objects, requests=list(requests or []),
                                         **({"files": files} if files is not None else {}))
            manifest.stats = {
                "bytes_total": pstats.bytes_total,
                "bytes_written": pstats.bytes_written,
                "objects_written": pstats.objects_written,
                "objects_reused": pstats.objects_reused,
                "groups_written": pstats.groups_written,
                "groups_reused": pstats.groups_reused,
                "serialize_s": pstats.serialize_s,
                "write_wait_s": pstats.write_wait_s,
                "sync_s": pstats.sync_s,
                "variables": len(kernel["variables"]),
                "skipped": len(kernel["skipped"]),
                **file_stats,
                **(stats or {}),
                **({"full_reason": dropped} if dropped else {}),
            }
            return self._commit(lock, manifest, started)

    def _listing(self) -> list[Manifest]:
        try:
            return self.manifests()
        except SpotWarpError:
            return []

    def _with_cut(self, cut: Cut, listing: list[Manifest], notebook: str, kernel: dict[str, Any],
                  objects: dict[str, int]) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
        """The kernel manifest's other half: the cut's files (only what changed is stored) and the newest record of
        every other notebook (its former names are this notebook's own); adds what they name to `objects`."""
        started = time.perf_counter()
        previous = next((m for m in listing if (m.files or {}).get("entries") is not None), None)
        # listed under this lock: no gc deletes what it names meanwhile, so its objects are not asked for again
        files, file_objects, fstats = backup_workspace(self.store, cut.root, previous.files if previous else None,
                                                       cut=cut, previous_listed=True)
        files = with_record(self.store, files, previous.files if previous else None)
        file_objects[files[RECORD]] = files["record_size"]
        own = {notebook, *(kernel.get("aliases") or ())}
        others = {nb: rec for nb, rec in newest_kernel_records(listing).items() if nb not in own}
        named: dict[str, int] = {}
        for record in others.values():
            named.update(record_objects(record))
        # those records come from manifests a gc may have dropped (with their objects) before our lock
        missing = set(named) - self.store.present(named)
        if missing:
            others = {nb: rec for nb, rec in others.items() if not set(record_objects(rec)) & missing}
            named = {oid: size for rec in others.values() for oid, size in record_objects(rec).items()}
        objects.update(file_objects)
        objects.update(named)
        stats = {**fstats.as_dict(), "cut_s": round(cut.took_s, 4),
                 "files_s": round(time.perf_counter() - started, 4)}
        return {**others, notebook: kernel}, files, stats

    def _check_reuse_base(self, image: KernelImage, previous: list[Manifest], notebook: str) -> str | None:
        """Reuse records of the notebook's newest snapshot (gc never drops its objects); else serialize all.

        The newest may be a project snapshot naming the very same kernel record (the server's periodic
        backups copy it). A stale plan not taken over yet is dropped (every variable is serialized); an image
        that took it over already (serialized before a fork, or staged) keeps it if every object it reuses
        is still stored.
        """
        if image.reuse is None:
            return None
        newest = previous[0] if previous else None
        if newest is not None and (newest.id == image.reuse.base_id
                                   or (newest.kernels.get(notebook) or {}).get("groups")
                                   == [g.to_dict() for g in image.reuse.groups]):
            return None
        if image.takeover is None:
            return f"snapshot {image.drop_reuse()} is not this notebook's newest state any more"
        refs = set(image.takeover.objects())
        if refs - self.store.present(refs):
            raise StaleBaseline(f"snapshot {image.reuse.base_id} is no longer this notebook's newest and some of its "
                                "objects are gone: the next snapshot will be a full one")
        return None

    def commit_manifest(self, manifest: Manifest) -> Manifest:
        """Commit: write the manifest (signed when a key is set) after every object it names is stored.

        Fenced: only the lease's holder (or, without failover, any host) commits. The lease is read before
        the write and again after it; a manifest written while the lease moved is taken back.
        """
        self.fence.check(self.store)
        manifest.generation, manifest.holder = self.fence.generation, self.fence.candidate
        self.store.write_manifest(manifest.name, manifest.to_bytes(self.key))
        try:
            self.fence.check(self.store)
        except Fenced:
            self.store.delete_manifest(manifest.name)
            raise
        manifest.signed = bool(self.key)
        self.catalog.remember(manifest)
        try:
            advance_head(self.store, self.key, manifest.id, manifest.name, manifest.created)
        except (SpotWarpError, OSError) as exc:  # committed all the same: a missed head only weakens the rollback check
            log.warning("SpotWarp: snapshot %s committed, but the store's head was not advanced: %s", manifest.id, exc)
        return manifest

    def check_head(self) -> None:
        """RolledBack when the snapshot the store's signed head names is missing and nothing newer is there: the
        store was rolled back or its newest manifest deleted (a resume of `latest` would go back silently)."""
        head = read_head(self.store, self.key)
        if head is None:
            return
        self.catalog.manifests()
        valid = self.catalog.valid
        why = missing_head(head, valid, max(valid, default=None), self.catalog.rejected.get(head.name))
        if why is not None:
            raise RolledBack(why, head.snapshot)

    def _commit(self, lock: WriteLock, manifest: Manifest, started: float) -> Manifest:
        """The end of every commit: time it, make sure a lapsed lock lost nothing, write the manifest."""
        manifest.stats["duration_s"] = round(time.perf_counter() - started, 4)
        self.check_lock(lock, manifest)
        return self.commit_manifest(manifest)

    def check_lock(self, lock: WriteLock, manifest: Manifest) -> None:
        """Before a commit: if our lock may have looked stale to a gc, make sure every object is still stored."""
        if not lock.lapsed():
            return
        missing = set(manifest.objects) - self.store.present(manifest.objects)
        if missing:
            raise StorageError(f"snapshot {manifest.id} not committed: {len(missing)} reused objects were removed "
                               "meanwhile by a gc (this writer stood still past its lock); take it again")

    def new_manifest(self, kind: str, message: str | None = None, **fields: Any) -> Manifest:
        """A manifest for this project, stamped now on this host, with environment facts."""
        return Manifest(id=new_snapshot_id(), project=self.settings.project, created=time.time(),
                        host=socket.gethostname(), kind=kind, message=message, env=collect_facts(),
                        scope=self.scope, **fields)

    def restore_kernel(
        self,
        ref: str,
        namespace: dict[str, Any],
        notebook: str = DEFAULT_NOTEBOOK,
        variables: list[str] | None = None,
        device_map: dict[str, str] | None = None,
        listing: list[Manifest] | None = None,
    ) -> tuple[Manifest, LoadResult]:
        """Bring a snapshot's kernel variables back into `namespace`; nothing changes if it fails.

        `listing`: what `manifests()` returned earlier in the same operation (the store is then not listed again).
        """
        manifest, record = self._restore_source(ref, notebook, listing)
        result = load_record(self.store, record, namespace, variables, device_map)
        return manifest, self._with_notes(manifest, record, result)

    def restore_kernel_progressive(
        self,
        ref: str,
        namespace: dict[str, Any],
        notebook: str = DEFAULT_NOTEBOOK,
        variables: list[str] | None = None,
        device_map: dict[str, str] | None = None,
        listing: list[Manifest] | None = None,
    ) -> tuple[Manifest, LoadResult, BackgroundLoad | None]:
        """Bind the small variables now (nothing changes if that fails); large ones load behind them.

        The caller binds the large ones with `load.bind_ready(namespace)` as they arrive.
        """
        manifest, record = self._restore_source(ref, notebook, listing)
        # the version notes read a few small files (package metadata): read now, not once the large
        # groups' reads fill the disk's queue, where each waited behind them (usable 0.1-0.2 s later)
        notes = self._with_notes(manifest, record, LoadResult())
        result, load = restore_progressive(self.store, record, namespace, variables, device_map)
        result.warnings[:0] = notes.warnings
        return manifest, result, load

    def _restore_source(self, ref: str, notebook: str, listing: list[Manifest] | None) -> tuple[Manifest, dict[str, Any]]:
        """The snapshot to restore and its record for `notebook`, from one listing of the store."""
        listing = self.manifests() if listing is None else listing
        own = ref in ("latest", "", None) and any(notebook in m.kernels for m in listing)
        manifest = self.catalog.get(ref, notebook if own else None, listing)
        return manifest, self.kernel_record(manifest, notebook)

    def _with_notes(self, manifest: Manifest, record: dict[str, Any], result: LoadResult) -> LoadResult:
        result.warnings[:0] = version_warnings(manifest.env, _modules_used(record))
        warning = trust_warning(self.key)
        if warning:
            result.warnings.insert(0, warning)
        return result

    @staticmethod
    def kernel_record(manifest: Manifest, notebook: str) -> dict[str, Any]:
        """The manifest's state for `notebook`, or its only kernel's."""
        if notebook in manifest.kernels:
            return manifest.kernels[notebook]
        if len(manifest.kernels) == 1:
            return next(iter(manifest.kernels.values()))
        if not manifest.kernels:
            raise SnapshotNotFound(f"snapshot {manifest.id} holds no kernel state")
        raise SnapshotNotFound(
            f"snapshot {manifest.id} holds kernels of {', '.join(sorted(manifest.kernels))}, not of {notebook!r}"
        )

    # -- project snapshots: the workspace's files plus every live notebook's kernel record ----------
    def with_files(self, ref: str = "latest", past_refused: bool = False) -> Manifest | None:
        """The snapshot `ref`, or for `latest` the newest one holding workspace files; None when there is none.

        `past_refused`: for `latest`, the newest that passes its checks even when a newer one fails them (a
        failover candidate, which nobody is there to ask); otherwise such a newer one is refused.
        """
        if ref not in ("latest", "", None):
            return self.get(ref)
        found = next((m for m in self.manifests() if (m.files or {}).get("entries") is not None), None)
        # a newer snapshot that fails its checks may be the one with files: refuse rather than fall back past it
        if not past_refused:
            self.refuse_newer_than(found)
        return found

    def ignore_rules(self, workspace: str) -> IgnoreRules:
        """The workspace's rules, plus the local store itself when it lives inside the workspace.

        The same rules object while `.spotwarpignore` is unchanged: it keeps its answers (a cut at every kernel
        snapshot asks them for every file)."""
        excluded = [self.store.base] if self.store.local else []
        try:
            st = os.stat(os.path.join(workspace, IGNORE_FILE), follow_symlinks=False)
            key: tuple[Any, ...] = (workspace, st.st_ino, st.st_size, st.st_mtime_ns)
        except OSError:
            key = (workspace,)
        cached = self._rules
        if cached is not None and cached[0] == key:
            return cached[1]
        rules = IgnoreRules.for_workspace(workspace, excluded)
        self._rules = (key, rules)
        return rules

    def snapshot_project(
        self,
        workspace: str,
        kernels: Mapping[str, Mapping[str, Any]] | None = None,
        message: str | None = None,
        extra_stats: Mapping[str, Any] | None = None,
        only_if_changed: bool = False,
        chunk_size: int = CHUNK_SIZE,
        progress: Progress | None = None,
    ) -> Manifest | None:
        """Back up the workspace (only what changed) and commit one manifest naming it and `kernels`' records.

        With `only_if_changed`, nothing is committed (None is returned) when the newest snapshot holding files
        (a project snapshot or a kernel snapshot with its cut) holds the same files and each of `kernels`' records.
        """
        started = time.perf_counter()
        with self.writing() as lock:  # before any presence check of what is reused: gc waits or leaves objects
            try:
                previous = self.with_files()
            except SpotWarpError:
                previous = None  # a refused newest snapshot: back up everything afresh rather than fail
            files, objects, stats = backup_workspace(
                self.store, workspace, previous.files if previous else None, self.ignore_rules(workspace),
                chunk_size=chunk_size, progress=progress,
            )
            kernels = {nb: dict(rec) for nb, rec in (kernels or {}).items()}
            # unchanged: the same files, and each record already in that snapshot (a kernel snapshot's cut also
            # holds every other notebook's newest record; one of a notebook no longer open is not a change)
            if only_if_changed and previous is not None and not files_changed(previous.files, files) \
                    and all(previous.kernels.get(nb) == rec for nb, rec in kernels.items()):
                return None
            files = with_record(self.store, files, previous.files if previous else None)
            objects[files[RECORD]] = files["record_size"]
            named_by_kernels: dict[str, int] = {}
            for record in kernels.values():
                named_by_kernels.update(record_objects(record))
            # kernels' records come from manifests a gc may have dropped (with their objects) before our lock
            missing = set(named_by_kernels) - self.store.present(named_by_kernels)
            if missing:
                raise StorageError(f"{len(missing)} objects of the kernels' snapshots were removed by a gc meanwhile: "
                                   "snapshot not committed; take it again")
            objects.update(named_by_kernels)
            manifest = self.new_manifest(PROJECT_KIND, message, parent=previous.id if previous else None,
                                         kernels=kernels, files=files, objects=objects)
            manifest.stats = {**stats.as_dict(), "bytes_written": stats.bytes_written,
                              "objects_written": stats.objects_written, "bytes_total": manifest.size,
                              "variables": sum(len(r.get("variables", {})) for r in kernels.values()),
                              **(extra_stats or {})}
            return self._commit(lock, manifest, started)

    def restore_files(self, manifest: Manifest, workspace: str, progress: Progress | None = None,
                      keep_existing: bool = False) -> FileRestoreReport:
        """Bring the snapshot's files back into `workspace` (checked, verified, never outside it); `keep_existing`:
        only those missing there."""
        return restore_files(self.store, manifest.files or {}, workspace, progress=progress,
                             keep_existing=keep_existing)

    # -- maintenance --------------------------------------------------------------------------
    def verify(self, ref: str | None = None) -> VerifyReport:
        """Re-read and re-hash every object of one snapshot (or all); collect every problem found (verify.py)."""
        return verify_snapshots(self.store, self.catalog, ref)

    def gc(self, keep: int, grace_s: float = 3600.0) -> GcReport:
        """Drop all but the newest `keep` snapshots (and each notebook's newest), then objects no manifest names.

        The rules (what is never deleted, and when objects are left) are in prune.py.
        """
        with self._lock:
            return collect_garbage(self.store, self.catalog, keep, grace_s)
