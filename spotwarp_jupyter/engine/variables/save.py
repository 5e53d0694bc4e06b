"""Persist, the kernel-save pipeline's last stage (capture.py lists them): write a KernelImage's streams and
buffers as content-addressed objects, skipping unchanged ones, and name them in typed group records.

Large buffers are cut into fixed chunks; each chunk's object id is its blake3 digest. A chunk of 1 MiB or
more is first known by its xxh3-128 digest (half blake3's CPU, and it too lets the GIL go; while the detector
is empty, as in a process's first snapshot, a new chunk's digest is taken by its writer after the write, off
the hashing thread's path): when this process itself stored those very bytes before (hashing.ChangeDetector: digest and length -> object id, filled
only by this process and its forked writers, never from a store) and the previous snapshot names that object
and the store still holds it, the chunk is named again with no blake3 pass and no write. Any other chunk is
hashed with blake3: one an earlier snapshot already stored is named again without being written, and a new
one goes to a pool of writer threads with its id, as soon as its group is serialized, so disk or network
I/O overlaps with serializing the next groups. Records written before name chunks by an xxh3 `fp` too;
they are known again by their ids, never by that `fp`. On a local disk they are written as one batch
(Store.batch): no sync per object, one pass at the end makes them all durable before the commit; there
the large buffers pickling will hand over are announced before the groups are even worked out (the
pipeline's announce stage, `KernelImage.iter_groups`'s `on_values`), and written meanwhile (`_Writer.announce`).
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Iterable

from ..hashing import detector, fingerprint, learn, object_id
from ..pages import PAGE, address
from ..pickling.bulk import bulk_buffers
from ..records import BufferRecord, GroupRecord, MalformedRecord, ObjectRef, readable_groups
from ..storage import CHUNK_SIZE, Store
from ..timings import phase
from .capture import EXTRAS_NAME, GroupImage, KernelImage

# Buffers from this size up that pickling will hand over are written before the groups are worked out
# (see _Writer.announce): at 4 GB the grouping walk alone kept the disk idle for 0.3 s.
EARLY_MIN = 1024 * 1024
# Chunks from this size up are known by their xxh3 digest first (below it blake3 alone costs little).
DETECT_MIN = 1024 * 1024


def chunk_views(view: memoryview, page_aligned: bool = False) -> list[memoryview]:
    """`view` cut into the objects it is stored as: CHUNK_SIZE pieces from its start; with `page_aligned`
    (a local store writing with O_DIRECT) a large view not starting on a page first gives up the bytes before
    its first page boundary as a small object of their own, so every large piece starts on a page and goes to
    the disk straight from where it is, without a staging copy (torch and NumPy place arrays 64 or 16 bytes
    past a page). A restore maps the buffer at the same offset into a page (load._allocate), so its pieces
    land on pages too."""
    head = (-(address(view) or 0)) % PAGE if page_aligned and view.nbytes >= EARLY_MIN else 0
    return ([view[:head]] if head else []) + [view[i:i + CHUNK_SIZE] for i in range(head, view.nbytes, CHUNK_SIZE)]


# runs after each new buffer is stored: its memory is no longer needed (a forked writer releases its pages)
OnWritten = Callable[[memoryview], None]


class _Cancelled(RuntimeError):
    """A write not attempted because another one failed first."""


@dataclass
class PersistStats:
    """What one persist wrote and what it reused."""

    bytes_total: int = 0
    bytes_written: int = 0
    objects_written: int = 0
    objects_reused: int = 0
    groups_written: int = 0  # groups serialized (and hashed) again
    groups_reused: int = 0  # groups whose previous record was named again untouched (reuse.py)
    serialize_s: float = 0.0  # pickling and hashing, in this thread, while writes ran behind
    write_wait_s: float = 0.0  # then waiting for the last writes to be durable
    sync_s: float = 0.0  # of which the final pass making a local batch durable (sync, rename, folders)


def store_scope(store: Store) -> str:
    """Which store a change detector's entries hold for: its location and project."""
    return f"{getattr(store, 'url', '')}\0{getattr(store, 'project', '')}"


def _span(view: memoryview) -> tuple[int, int] | None:
    """The address range a writable buffer occupies (None for read-only ones, never released)."""
    start = address(view)
    return None if start is None else (start, start + view.nbytes)


def known_objects(records: Iterable[dict[str, Any]]) -> dict[str, int]:
    """object id -> size for every stream and chunk named by earlier kernel records."""
    known: dict[str, int] = {}
    for record in records:
        for group in readable_groups(record.get("groups") or ()):
            known.update(group.objects())
    return known


class _Writer:
    """Object refs for a kernel record; new content is written once, in the background, as it arrives."""

    def __init__(self, store: Store, known: dict[str, int], on_written: OnWritten | None = None):
        self.store = store
        self.known = known
        self.on_written = on_written
        self.stats = PersistStats()
        self.cancel = threading.Event()
        self.pool = ThreadPoolExecutor(max_workers=getattr(store, "workers", None) or 2,
                                       thread_name_prefix="spotwarp-persist")
        self.writes: dict[str, Future] = {}
        batch = getattr(store, "batch", None)
        self.pending = batch() if batch is not None else None
        self.page_aligned = self.pending is not None and getattr(self.pending, "direct", False)
        self.scope = store_scope(store)
        self.detector = detector(self.scope)
        self.detected: list[tuple[str, int, str]] = []  # (xxh3 digest, length, object id) of chunks seen
        self.named: set[str] = set()  # ids of new objects the record names (not those taken back in `finish`)
        self._checked: dict[str, bool] | None = None
        self._views: dict[str, memoryview] = {}
        self._written: list[memoryview] = []
        self._all_known = False
        self._lock = threading.Lock()
        self._check_lock = threading.Lock()
        # chunks announced before serializing, by (address, size): each a future of (object id, stored already);
        # the announced views are held until the end, so no other buffer can take their addresses meanwhile
        self._early: dict[tuple[int, int], Future] = {}
        self._announced: list[memoryview] = []
        self._early_thread: threading.Thread | None = None
        self._early_error: BaseException | None = None

    def announce(self, views: Iterable[memoryview]) -> None:
        """Buffers that serializing will hand over later: hashed (in a thread of their own, without the GIL)
        and written from now on, while the groups are worked out and pickled. `add` knows each chunk again by
        its address and size; a write nothing then names is taken back in `finish` (only for a local batch,
        where it can be: see persist_image)."""
        chunks = []
        for view in views:
            view = view.cast("B") if view.format != "B" or view.ndim != 1 else view
            start = address(view)
            if start is None:
                continue
            self._announced.append(view)
            for chunk in chunk_views(view, self.page_aligned):
                key = (address(chunk), chunk.nbytes)
                if key not in self._early:
                    self._early[key] = Future()
                    chunks.append((chunk, self._early[key]))
        if chunks:
            self._early_thread = threading.Thread(target=self._look_at_all, args=(chunks,),
                                                  name="spotwarp-announced", daemon=True)
            self._early_thread.start()

    def _look_at_all(self, chunks: list[tuple[memoryview, Future]]) -> None:
        """Fingerprint announced chunks in order, queueing each new one's write at once (`add` waits only for this)."""
        for i, (chunk, seen) in enumerate(chunks):
            try:
                seen.set_result(self._look_at(chunk))
            except BaseException as exc:  # noqa: BLE001 - `add` or `finish` raises it
                self._early_error = exc
                for _chunk, later in chunks[i:]:
                    later.set_exception(exc)
                return

    def _look_at(self, view: memoryview) -> tuple[str, bool]:
        """(object id, whether an earlier snapshot stored it); queues the write of new content."""
        if self.cancel.is_set():
            raise _Cancelled("cancelled after an earlier write failed")
        large = view.nbytes >= DETECT_MIN
        digest = self._digest(view) if large and len(self.detector) else None  # an empty detector finds nothing
        if digest is not None:
            oid = self.detector.get(digest, view.nbytes)
            if oid is not None and self.known.get(oid) == view.nbytes and self._still_there(oid):
                self.detected.append((digest, view.nbytes, oid))
                return oid, True
        with phase("hash", view.nbytes):
            oid = object_id(view)
        if self.known.get(oid) == view.nbytes and self._still_there(oid):
            if large:
                self.detected.append((digest or self._digest(view), view.nbytes, oid))
            return oid, True
        if digest is not None:
            self.detected.append((digest, view.nbytes, oid))
        with self._lock:
            if oid not in self.writes:
                self._views[oid] = view
                # new content's digest is taken by its writer once it is written, off this thread's path
                self.writes[oid] = self.pool.submit(self._put, view, oid, large and digest is None)
        return oid, False

    @staticmethod
    def _digest(view: memoryview) -> str:
        with phase("detect", view.nbytes):
            return fingerprint(view)

    def add(self, view: memoryview) -> ObjectRef:
        start = address(view) if self._early else None
        early = self._early.get((start, view.nbytes)) if start is not None else None
        oid, stored = early.result() if early is not None else self._look_at(view)
        self.stats.bytes_total += view.nbytes
        if stored:
            self.stats.objects_reused += 1
        else:
            self.named.add(oid)
        return ObjectRef(oid, view.nbytes)

    def _put(self, view: memoryview, oid: str, detect: bool = False) -> tuple[str, int]:
        if self.cancel.is_set():
            raise _Cancelled("cancelled after an earlier write failed")
        oid, size = self.store.put_object(view, oid, cancel=self.cancel, pending=self.pending)
        if detect:  # before `on_written` may give the pages back
            self.detected.append((self._digest(view), view.nbytes, oid))
        if self.on_written is not None:
            with self._lock:
                self._written.append(view)
                self._release_ready()
        return oid, size

    def capture_done(self) -> None:
        """Every buffer is known now: written ones whose memory no unwritten buffer shares can be released."""
        with self._lock:
            self._all_known = True
            self._release_ready()

    def _release_ready(self) -> None:
        # A view's pages may be shared by another buffer (numpy views, tensors sharing storage):
        # release them only once every buffer is known and none still unwritten overlaps them.
        if not self._all_known:
            return
        written = {id(v) for v in self._written}
        unwritten = [_span(v) for oid, v in self._views.items()
                     if id(v) not in written and not self.writes[oid].done()]
        keep = []
        for view in self._written:
            span = _span(view)
            if span and any(o and o[0] < span[1] and span[0] < o[1] for o in unwritten):
                keep.append(view)
            elif span:
                self.on_written(view)
        self._written = keep

    def _first_failure(self) -> BaseException:
        """The error that started the failure, not a write cancelled because of it."""
        errors = [f.exception() for f in self.writes.values() if f.done() and not f.cancelled() and f.exception()]
        real = [e for e in errors if not isinstance(e, _Cancelled)]
        return (real or errors)[0]

    def _still_there(self, oid: str) -> bool:
        # a concurrent `gc` may have dropped an object only old snapshots named
        with self._check_lock:
            if self._checked is None:  # one batched question (parallel on object stores), not one per object
                ids = set(self.known)
                present = self.store.present(ids)
                self._checked = {i: i in present for i in ids}
        return self._checked.get(oid, False) or self.store.has_object(oid)

    def finish(self) -> None:
        """Wait for every write and make them durable; raise the first failure (nothing is committed then)."""
        try:
            if self._early_thread is not None:
                self._early_thread.join()  # every announced chunk's write is queued by now
            if self._early_error is not None:
                self.cancel.set()
                raise (self._early_error if not isinstance(self._early_error, _Cancelled)
                       else self._first_failure()) from None
            results = {}
            for oid, future in self.writes.items():
                try:
                    results[oid] = future.result()
                except BaseException:  # noqa: BLE001 - the first failure is raised in its place
                    self.cancel.set()
                    raise self._first_failure() from None
            for oid in [oid for oid in results if oid not in self.named]:  # announced, written, then never handed over
                results.pop(oid)
                if self.pending is not None:
                    self.pending.forget(self.store.object_path(oid))
            if self.pending is not None:
                self.store.sync_batch(self.pending)
                self.stats.sync_s = round(self.pending.sync_s, 4)
            for oid, size in results.values():
                self.stats.bytes_written += size
                self.stats.objects_written += 1
        finally:
            self.cancel.set()
            self.pool.shutdown(wait=True, cancel_futures=True)
            if self.pending is not None:
                self.pending.discard()  # after a failure: temporaries nothing will name (a no-op once synced)


def persist_image(
    store: Store, image: KernelImage, previous: Iterable[dict[str, Any]] = (), on_written: OnWritten | None = None,
) -> tuple[dict[str, Any], dict[str, int], PersistStats]:
    """Stage 6: write what is new; return (kernel record for the manifest, objects it names, stats).

    Drives the image's groups out of stages 2 to 5 (capture.py) one at a time, storing each as it comes.
    `on_written(view)` runs after each new buffer is stored (written to storage, or to a local batch's
    temporary: its memory is no longer needed; a forked writer releases its pages).
    """
    writer = _Writer(store, known_objects(previous), on_written)
    # a local batch can take back an early write that nothing names; an object store's PUT is final
    announce = (lambda values: writer.announce(bulk_buffers(values, EARLY_MIN))) if writer.pending is not None else None
    groups: list[GroupRecord] = []
    started = time.perf_counter()
    try:
        groups_in = image.iter_groups(on_values=announce)
        while True:
            with phase("serialize"):
                g = next(groups_in, None)
            if g is None:
                break
            groups.append(_store_group(writer, g))
        writer.capture_done()
        serialized = time.perf_counter()
    finally:
        writer.finish()
    writer.stats.serialize_s = round(serialized - started, 4)
    writer.stats.write_wait_s = round(time.perf_counter() - serialized, 4)
    writer.stats.groups_written = sum(1 for g in groups if g.names != (EXTRAS_NAME,))
    writer.stats.groups_reused = len(image.reused)
    for record in image.reused:  # named again as they are: nothing pickled, hashed or written
        refs = record.refs()
        writer.stats.bytes_total += sum(ref.size for ref in refs)
        writer.stats.objects_reused += len(refs)
        groups.append(record)
    kernel, objects = _kernel_record(groups, image)
    # stored and durable now (an announced chunk nothing named was taken back: not remembered)
    learn(writer.scope, [e for e in writer.detected if objects.get(e[2]) == e[1]])
    return kernel, objects, writer.stats


def _store_group(writer: _Writer, g: GroupImage) -> GroupRecord:
    """One serialized group's buffers, then its stream, handed to the writer; the record naming them."""
    buffers = []
    for view in g.pickled.buffers:
        view = view.cast("B") if view.format != "B" or view.ndim != 1 else view
        chunks = tuple(writer.add(chunk) for chunk in chunk_views(view, writer.page_aligned))
        buffers.append(BufferRecord(view.nbytes, chunks))
    return GroupRecord(names=tuple(g.names), types=g.types, codec=g.pickled.codec,
                       requires=tuple(sorted(g.pickled.requires)), pickle=writer.add(memoryview(g.pickled.data)),
                       buffers=tuple(buffers))


def _kernel_record(groups: list[GroupRecord], image: KernelImage) -> tuple[dict[str, Any], dict[str, int]]:
    """The kernel record naming `groups` (each variable's group and size), and every object they name."""
    objects: dict[str, int] = {}
    variables: dict[str, Any] = {}
    for index, record in enumerate(groups):
        objects.update(record.objects())
        for name in record.names:
            if name != EXTRAS_NAME:
                variables[name] = {"type": record.types[name], "group": index, "size": record.nbytes}
    kernel = {"groups": [g.to_dict() for g in groups], "variables": variables, "imports": image.imports,
              "skipped": image.skipped}
    if image.changed:
        kernel["changed"] = image.changed  # saved, but not as they were: name -> why
    return kernel, objects


def carry_damaged(kernel: dict[str, Any], objects: dict[str, int], damaged: dict[str, Any]) -> dict[str, Any]:
    """Carry variables that failed to restore into a new kernel record, so that no snapshot drops them silently.

    `damaged`: name -> {"why", "from" (the snapshot that holds it), "group" (its group record there)}. A name
    captured anew (the user assigned it again) is not carried; a group is carried whole, once, as it was, its
    variables marked `damaged`, and the record says which and why (`damaged`: name -> {why, from}). Returns that.
    """
    noted: dict[str, Any] = {}
    index_of: dict[str, int] = {}
    for name, info in sorted(damaged.items()):
        group = _carried_group(info)
        if name in kernel["variables"] or group is None or name not in group.names:
            continue
        if any(other in kernel["variables"] for other in group.names):
            continue  # part of its group was captured anew: the old group would bind it twice
        key = group.pickle.id
        if key not in index_of:
            index_of[key] = len(kernel["groups"])
            kernel["groups"].append(group.to_dict())
            objects.update(group.objects())
        kernel["variables"][name] = {"type": group.types.get(name), "group": index_of[key],
                                     "size": group.nbytes, "damaged": True}
        noted[name] = {"why": str(info.get("why") or "it failed to restore"), "from": info.get("from")}
    if noted:
        kernel["damaged"] = noted
    return noted


def _carried_group(info: Any) -> GroupRecord | None:
    """The group record a damaged variable's entry holds; None when it holds none that can be read."""
    group = info.get("group") if isinstance(info, dict) else None
    try:
        return GroupRecord.from_dict(group) if isinstance(group, dict) else None
    except MalformedRecord:
        return None
