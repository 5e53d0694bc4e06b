"""Restore: read a kernel record's objects (verified against their hashes) and rebuild its variables.

Reading, hashing and unpickling overlap: every object is read by a pool of threads in pieces, each
piece hashed while it is still in the CPU's cache; group after group is unpickled as soon as its
objects are in, into a stand-in `__main__` (later groups find the names earlier ones define there).
The namespace itself is touched only once every object is read and checked and every group rebuilt,
so a damaged snapshot changes nothing.

A progressive restore (`restore_progressive`) binds the small groups at once and hands the large
ones to a `BackgroundLoad` (progressive.py), which the kernel binds between cells.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import mmap
import time
import types
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from .. import pages, pickling
from ..errors import SpotWarpError
from ..pages import PAGE
from ..records import BufferRecord, GroupRecord, group_records
from ..storage import Store
from ..timings import phase
from .capture import EXTRAS_NAME

_MISSING = object()


@dataclass
class LoadResult:
    """What a restore brought back; a progressive one fills `complete_s` once its large groups are bound."""

    restored: list[str] = field(default_factory=list)
    imports: dict[str, str] = field(default_factory=dict)
    skipped_at_snapshot: dict[str, str] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    extras: dict[str, Any] = field(default_factory=dict)
    bytes_read: int = 0
    usable_s: float | None = None  # restore start to every small variable bound (the kernel usable)
    complete_s: float | None = None  # restore start to every variable bound (None while some still load)
    loading: list[str] = field(default_factory=list)  # names still being loaded in the background
    failed: dict[str, str] = field(default_factory=dict)  # name -> why it could not be restored


def _select_groups(groups: list[GroupRecord], variables: list[str] | None) -> list[int]:
    """Indexes of the groups to restore (all, or those holding `variables` and what they require), in order."""
    provider = {name: i for i, g in enumerate(groups) for name in g.names}
    if variables is None:
        wanted = list(range(len(groups)))
    else:
        missing = [v for v in variables if v not in provider]
        if missing:
            known = ", ".join(sorted(n for n in provider if n != EXTRAS_NAME)) or "none"
            raise SpotWarpError(f"not in this snapshot: {', '.join(missing)} (it holds: {known})")
        wanted = sorted({provider[v] for v in variables})
        if EXTRAS_NAME in provider:
            wanted.append(provider[EXTRAS_NAME])
    # smallest first: their reads finish early and unpickling them (CPU) overlaps the large reads (I/O);
    # definitions a group refers to by name come first (topological order, cycles tolerated)
    wanted.sort(key=lambda i: groups[i].nbytes)
    order: list[int] = []
    state: dict[int, int] = {}

    def visit(i: int) -> None:
        if state.get(i):
            return
        state[i] = 1
        for name in groups[i].requires:
            if name in provider:
                visit(provider[name])
        state[i] = 2
        order.append(i)

    for i in wanted:
        visit(i)
    return order


def _allocate(size: int, head: int = 0) -> Any:
    """A writable buffer for a restored array: large ones are anonymous maps, untouched until `_fill` queues
    their population ahead of the reads: the map becomes the array's own memory, with no staging copy.
    A buffer stored with a `head` object (the bytes before its first page, see save.chunk_views) starts that
    far before a page, so its other chunks land on pages and are read straight into place with O_DIRECT.

    Not huge pages, whatever the system's THP setting: a fault may wait for memory to be compacted, or
    for memory the VM gave back to its host (1.1-2.6 s per GB against 0.22-0.33 s for small pages).
    """
    if size < (1 << 20):
        return bytearray(size)
    skip = (PAGE - head) % PAGE
    region = mmap.mmap(-1, size + skip, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    pages.no_huge_pages(region)
    return memoryview(region)[skip:] if skip else region


def _read_into(store: Store, oid: str, part: memoryview, populating: list[Future]) -> None:
    """Read one chunk into its place; its pages' population not started by then is dropped: the read faults
    them in itself, and a populating thread behind the readers would only contend with them for the CPU."""
    for piece in populating:
        piece.cancel()
    store.read_object_into(oid, part)


def _populate(piece: memoryview) -> None:
    with phase("populate", piece.nbytes):
        pages.populate_view(piece)


def _pieces_mostly_in(ahead: list[Future], size: int, offset: int, length: int) -> list[Future]:
    """The population pieces of a `size`-byte buffer (POPULATE_PIECE bytes each, in order) lying mostly in
    [offset, offset + length): those the chunk's read fills and would fault in itself. A buffer's head chunk
    (the bytes before its first page) leaves the piece holding it to the populating thread: the next chunk's
    read fills nearly all of that piece."""
    piece = pages.POPULATE_PIECE
    end = offset + length
    out = []
    for i in range(offset // piece, min(len(ahead), -(-end // piece))):
        start, stop = i * piece, min((i + 1) * piece, size)
        if 2 * (min(stop, end) - max(start, offset)) >= stop - start:
            out.append(ahead[i])
    return out


# a chunk already queued in this group: its read and where it lands (a later equal chunk is copied from there)
Placed = tuple[Future, memoryview]


@dataclass
class GroupRead:
    """One group's objects being read: its pickle stream and its buffers, filled by pool threads."""

    group: GroupRecord
    data: Future
    buffers: list[tuple[Any, list[Future]]]  # each buffer and the futures of its chunks' reads
    copies: list[tuple[Placed, memoryview]] = field(default_factory=list)  # chunks equal to one read already
    populating: list[Future] = field(default_factory=list)  # its buffers' pages, populated ahead of the reads

    def result(self) -> tuple[bytes, list[Any], int]:
        """Wait for every object; raise the first failure (a DamagedObjectError or StorageError)."""
        for _target, chunks in self.buffers:
            for chunk in chunks:
                chunk.result()
        for (read, source), target in self.copies:
            read.result()  # checked against its hash before anything is copied from it
            with phase("copy", target.nbytes):
                target[:] = source
        data = self.data.result()
        targets = [target for target, _chunks in self.buffers]
        return data, targets, len(data) + sum(len(b) for b in targets)

    def cancel(self) -> None:
        """Drop reads not started yet (after a failure elsewhere, or when the restore is abandoned)."""
        self.data.cancel()
        for _target, chunks in self.buffers:
            for chunk in chunks:
                chunk.cancel()
        for piece in self.populating:
            piece.cancel()


def _fill(store: Store, buf: BufferRecord, pool: ThreadPoolExecutor, placed: dict[str, Placed],
          copies: list[tuple[Placed, memoryview]], populating: list[Future]) -> tuple[Any, list[Future]]:
    """Map one buffer, queue the population of its pages (one thread, pages.populate_ahead) and then its
    chunks' reads, in the same order: the readers find their destination's pages in and never wait on faults.

    A chunk equal to one already queued for this group (same hash, so same bytes) is not read again
    but copied from there once that read is checked: an optimizer keeps one equal `step` tensor per
    parameter, which from an object store would be as many requests.
    """
    chunks = buf.chunks
    target = _allocate(buf.size, chunks[0].size if len(chunks) > 1 and chunks[0].size < PAGE else 0)
    view = memoryview(target)
    ahead = pages.populate_ahead(view, _populate) if not isinstance(target, bytearray) else []
    populating.extend(ahead)
    reads = []
    offset = 0
    for chunk in chunks:
        oid, part = chunk.id, view[offset:offset + chunk.size]
        pieces = _pieces_mostly_in(ahead, view.nbytes, offset, chunk.size)
        offset += chunk.size
        first = placed.get(oid)
        if first is not None and first[1].nbytes == part.nbytes:
            copies.append((first, part))
            continue
        read = pool.submit(_read_into, store, oid, part, pieces)
        placed.setdefault(oid, (read, part))
        reads.append(read)
    return target, reads


def start_read(store: Store, group: GroupRecord, pool: ThreadPoolExecutor) -> GroupRead:
    """Queue the reads of a group's objects, in order; returns at once.

    Equal chunks are read once per group, not per restore: a group bound early (between cells, in a
    progressive restore) may be changed by a cell before a later group would copy from it.
    """
    placed: dict[str, Placed] = {}
    data = pool.submit(store.read_object, group.pickle.id, group.pickle.size)
    copies: list[tuple[Placed, memoryview]] = []
    populating: list[Future] = []
    buffers = [_fill(store, buf, pool, placed, copies, populating) for buf in group.buffers]
    return GroupRead(group, data, buffers, copies, populating)


def read_pool(store: Store) -> ThreadPoolExecutor:
    """Threads that read (and hash) objects: enough to keep a disk or an object store busy."""
    workers = max(4, getattr(store, "workers", 4))
    return ThreadPoolExecutor(max_workers=workers, thread_name_prefix="spotwarp-get")


@contextlib.contextmanager
def collector_paused():
    """No cyclic garbage collection while unpickling: each collection would scan every object built so far,
    making a million small objects take six times as long (the time per object grows with their number)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def load_group(group: GroupRecord, data: bytes, buffers: list[Any]) -> dict[str, Any]:
    """Unpickle one group's variables (name -> value) from its stream and buffers."""
    with collector_paused(), phase("unpickle", len(data)):
        return pickling.loads(group.codec, data, buffers)


def rebuild(reads: list[GroupRead], main: pickling.main_namespace) -> tuple[list[tuple[str, Any]], int]:
    """Unpickle each group as its objects arrive; (name, value) pairs in order, and the bytes read."""
    values: list[tuple[str, Any]] = []
    total = 0
    for read in reads:
        with phase("wait for reads"):
            data, buffers, n = read.result()
        total += n
        for name, value in load_group(read.group, data, buffers).items():
            main.bind(name, value)
            values.append((name, value))
    return values, total


def _import_modules(record: dict[str, Any], variables: list[str] | None, result: LoadResult) -> list[tuple[str, Any]]:
    out = []
    for name, module in (record.get("imports") or {}).items():
        if variables is not None and name not in variables:
            continue
        try:
            out.append((name, _import(module)))
        except Exception as exc:  # noqa: BLE001
            result.warnings.append(f"module {module} (as {name}) is not importable here: {exc}")
            continue
        result.imports[name] = module
    return out


def _import(path: str) -> Any:
    """The module `path` names: imported, or an attribute of its package (an extension's submodule is no
    module of the import system: `tokenizers.trainers` is the attribute `trainers` of `tokenizers`)."""
    try:
        return importlib.import_module(path)
    except ModuleNotFoundError:
        package, _, attr = path.rpartition(".")
        if not package:
            raise
        found = getattr(importlib.import_module(package), attr, None)
        if not isinstance(found, types.ModuleType):
            raise
        return found


def start_reads(store: Store, groups: list[GroupRecord], pool: ThreadPoolExecutor) -> list[GroupRead]:
    """Queue the reads of `groups`, in order (the pool takes them first come, first served); returns at once."""
    reads: list[GroupRead] = []
    try:
        for group in groups:
            reads.append(start_read(store, group, pool))
    except BaseException:
        for read in reads:
            read.cancel()
        raise
    return reads


def _rebuild_all(reads: list[GroupRead], namespace: dict[str, Any], device_map: dict[str, str] | None,
                 modules: list[tuple[str, Any]], moved: set[str], said: list[str]) -> tuple[list[tuple[str, Any]], int]:
    """Check and unpickle the groups of `reads` (in order) against a copy of `namespace`; binds nothing."""
    with pickling.main_namespace(dict(namespace)) as main, pickling.device_notes(device_map) as notes:
        for name, value in modules:
            main.bind(name, value)
        values, total = rebuild(reads, main)
        moved.update(notes.moved)
        said.extend(notes.said)
    return values, total


def restore_groups(
    store: Store, record: dict[str, Any], groups: list[GroupRecord], namespace: dict[str, Any],
    variables: list[str] | None, device_map: dict[str, str] | None, result: LoadResult,
) -> None:
    """Read, check and rebuild `groups` (of `record`) in order, then bind them (and the record's imports) in one go.

    The reads are queued before the record's modules are imported, so the disk works while they import.
    """
    moved: set[str] = set()
    said: list[str] = []
    try:
        with read_pool(store) as pool:
            reads = start_reads(store, groups, pool)
            try:
                modules = _import_modules(record, variables, result)
                values, result.bytes_read = _rebuild_all(reads, namespace, device_map, modules, moved, said)
            except BaseException:
                for read in reads:
                    read.cancel()
                raise
    except SpotWarpError:
        raise
    except Exception as exc:  # noqa: BLE001
        raise SpotWarpError(f"restore failed and changed nothing: {type(exc).__name__}: {exc}") from exc
    for name, value in modules:
        namespace[name] = value
    for name, value in values:
        if name == EXTRAS_NAME:
            result.extras = value
            continue
        namespace[name] = value
        result.restored.append(name)
    result.warnings.extend(change_notes(record, result.restored))
    result.warnings.extend(moved_notes(moved))
    result.warnings.extend(said)


def change_notes(record: dict[str, Any], names: list[str]) -> list[str]:
    """Warnings for restored variables the snapshot saved, but not as they were."""
    changed = record.get("changed") or {}
    return [f"{name}: {changed[name]}" for name in sorted(set(names) & set(changed))]


def moved_notes(devices: set[str]) -> list[str]:
    """Warnings for devices missing here, whose tensors were restored to CPU."""
    return [f"tensors saved on {d} were restored to CPU: {d} is not available here" for d in sorted(devices)]


def load_record(
    store: Store,
    record: dict[str, Any],
    namespace: dict[str, Any],
    variables: list[str] | None = None,
    device_map: dict[str, str] | None = None,
) -> LoadResult:
    """Bring the record's variables (all, or `variables` and what they need) back into `namespace`."""
    started = time.perf_counter()
    result = LoadResult(skipped_at_snapshot=dict(record.get("skipped", {})))
    groups = group_records(record)
    order = _select_groups(groups, variables)
    restore_groups(store, record, [groups[i] for i in order], namespace, variables, device_map, result)
    result.usable_s = result.complete_s = time.perf_counter() - started
    return result
