"""Workspace backup: every file under the workspace as content-addressed chunks, only what changed read and written.

A file whose size, mtime and inode match the previous snapshot (and was not modified just before it)
is named again without being read. Changed files are read in fixed chunks; a chunk whose xxh3
fingerprint is already known (from the previous snapshot or another file) is not written again, so
editing a few bytes of a 10 GB file uploads one chunk. A file that changes while it is read is read
again; if it never holds still it is kept as read and marked `unstable`. Symbolic links are recorded,
never followed; one pointing outside the workspace is skipped. A file replaced by a pipe, socket or
device between the scan and its read is skipped (opened without waiting, checked after opening), and
a restore's temporaries are never backed up, whatever `.spotwarpignore` says.
"""

from __future__ import annotations

import errno
import os
import stat
import time
from dataclasses import dataclass, field
from operator import attrgetter, itemgetter
from typing import TYPE_CHECKING, Any, Callable, NamedTuple

from ..errors import SpotWarpError
from ..hashing import fingerprint
from ..manifests.files_record import chunk_ids
from ..storage import CHUNK_SIZE, Store
from .ignore import IgnoreRules
from .restore import is_valid_entry
from .temporaries import MARK as _MARK
from .temporaries import is_temporary

if TYPE_CHECKING:
    from .cut import Cut

__all__ = [
    "BATCH_BYTES",
    "RACY_WINDOW_NS",
    "READ_ATTEMPTS",
    "FileBackupStats",
    "NotRegularFile",
    "Progress",
    "Seen",
    "backup_workspace",
    "files_changed",
    "link_target",
    "scan",
]


class Seen(NamedTuple):
    """One file or symbolic link the scan found: its workspace path, its path on disk, its stat (a tuple: a scan
    makes one per file at a cut's instant, and `tuple.__new__` makes it without a Python call)."""

    relpath: str
    abspath: str
    st: os.stat_result


_seen = tuple.__new__
_ROOT_FLAGS = os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0)
_DIR_FLAGS = _ROOT_FLAGS | getattr(os, "O_NOFOLLOW", 0)  # a folder the scan found: never through a link
_IFMT, _IFDIR, _IFREG, _IFLNK = 0o170000, stat.S_IFDIR, stat.S_IFREG, stat.S_IFLNK


def scan(root: str, rules: IgnoreRules, skipped: dict[str, str], previous: dict[str, Any] | None = None,
         clean: dict[str, dict[str, Any]] | None = None) -> list[Seen]:
    """Every file and symlink under `root` that the rules keep, sorted (a folder's files, then each of its
    subfolders in turn), without following links. With `clean`, the previous entries of the stat-clean files
    (`_reusable`'s answer against the files record `previous`) go into it in the same pass: at a cut's instant
    every entry of a large workspace costs its stat and little more, and a folder whose names and stats are those
    the last cut found, its files all stat-clean against `previous`, is taken whole from that cut (`_Folder`)."""
    found: list[Seen] = []
    stack = [""]
    answers, excluded = rules.file_answers() or ({}, None)
    keys, before = (_Keys({}, {}), 0) if clean is None else _clean_against(previous)
    folders = None if clean is None else _folders_of(root, rules)
    visited: set[str] = set()
    while stack:
        reldir = stack.pop()
        absdir = os.path.join(root, reldir) if reldir else root
        listed = _open_folder(absdir, reldir, skipped)
        if listed is None:
            continue
        fd, names = listed
        try:
            stats = None
            if folders is not None:
                visited.add(reldir)
                try:
                    sts: list[os.stat_result] | None = [_stat(n, dir_fd=fd, follow_symlinks=False) for n in names]
                except OSError:
                    sts = None  # one vanished since the listing: the folder is seen name by name
                if sts is not None:
                    stats = list(map(_STAT_KEY, sts))
                    kept = _unchanged(folders, reldir, names, stats, keys, before)
                    if kept is not None:
                        found.extend(kept.seen)
                        clean.update(zip(kept.regular, kept.entries))  # type: ignore[union-attr, arg-type]
                        skipped.update(kept.skipped)
                        stack.extend(reversed(kept.subdirs))
                        continue
            else:
                sts = None
            folder = _scan_folder(fd, reldir, absdir, names, sts, rules, answers, excluded, keys, before)
            found.extend(folder.seen)
            skipped.update(folder.skipped)
            if clean is not None:
                clean.update(folder.clean)
            stack.extend(reversed(folder.subdirs))
            if folders is not None:
                if stats is not None:
                    whole = len(folder.clean) == len(folder.regular)  # every file clean against `keys`
                    folders[reldir] = folder._replace(names=names, stats=stats, clean=[], against=keys if whole else None,
                                                      entries=list(map(_SECOND, folder.clean)) if whole else None)
                else:
                    folders.pop(reldir, None)
        finally:
            os.close(fd)
    if folders is not None:
        for gone in [d for d in list(folders) if d not in visited]:
            folders.pop(gone, None)
        if len(found) > MEMO_FILES:
            folders.clear()
    return found


MEMO_FILES = 200_000  # a larger workspace is scanned whole at every cut: the folders' memo would hold too much
_stat = os.stat
_STAT_KEY = attrgetter("st_mtime_ns", "st_size", "st_ino", "st_mode", "st_ctime_ns")  # what a change moves


class _Folder(NamedTuple):
    """One folder as a cut's scan found it: its names and each one's stat (`_STAT_KEY`: mtime, size, inode, mode,
    ctime, which any write, replacement, chmod or rename moves), what the rules kept of it, and its regular files
    with the (size, mtime, inode) a record names a clean file by (`expected`). A later scan finding the same names
    and stats, against a record that names every one of those files so and was scanned after the newest of them
    was written (`newest`, the racy-write window included), has every file stat-clean: it takes the folder as it
    is instead of looking at each file again."""

    names: list[str]
    stats: list[tuple[int, ...]]
    seen: list[Seen]
    subdirs: list[str]
    skipped: list[tuple[str, str]]
    clean: list[tuple[str, dict[str, Any]]]  # against the record of the scan that found it (not kept)
    regular: list[str]
    expected: list[tuple[int, int, int]]
    newest: int
    against: Any = None  # the record's stat keys (`_stat_keys`) every regular file was found clean against
    entries: list[dict[str, Any]] | None = None  # each regular file's entry in `against` (one list: no object per
    # file that outlives a cut and that the collection after its pause would visit)


_SECOND = itemgetter(1)


def _unchanged(folders: dict[str, _Folder], reldir: str, names: list[str], stats: list[tuple[int, ...]],
               keys: _Keys, before: int) -> _Folder | None:
    """The folder as the last cut found it when it is unchanged since and every regular file in it stat-clean
    against `keys` (older than `before`), its `entries` those files' entries; else None. Against the very keys the
    last cut found them all clean against (a record's keys are never changed), the files' entries are those."""
    kept = folders.get(reldir)
    if kept is None or kept.stats != stats or kept.names != names or not kept.newest < before:
        return None
    if kept.against is keys:
        return kept
    if list(map(keys.stat.get, kept.regular)) != kept.expected:
        return None
    kept = kept._replace(entries=list(map(keys.entry.__getitem__, kept.regular)), against=keys)
    folders[reldir] = kept
    return kept


_folders: list[tuple[str, IgnoreRules, dict[str, _Folder]]] = []  # the last cut's folders, for its root and rules


def _folders_of(root: str, rules: IgnoreRules) -> dict[str, _Folder]:
    for known_root, known_rules, folders in _folders:
        if known_root == root and known_rules is rules:
            return folders
    folders: dict[str, _Folder] = {}
    _folders[:] = [(root, rules, folders)]
    return folders


def _scan_folder(fd: int, reldir: str, absdir: str, names: list[str], sts: list[os.stat_result] | None,
                 rules: IgnoreRules, answers: dict[str, bool], excluded: frozenset[int] | None,
                 keys: _Keys, before: int) -> _Folder:
    """One folder's files (`sts`: their stats when taken already), name by name."""
    seen: list[Seen] = []
    keep = seen.append
    subdirs: list[str] = []
    skipped: list[tuple[str, str]] = []
    clean: list[tuple[str, dict[str, Any]]] = []
    regular: list[str] = []
    expected: list[tuple[int, int, int]] = []
    newest = -(1 << 63)
    ignored = rules.ignored
    stat_of, entry_of = keys
    prefix = f"{reldir}/" if reldir else ""
    absprefix = os.path.join(absdir, "")
    for i, name in enumerate(names):
        if _MARK in name and is_temporary(name):
            continue  # a restore's half-written file (or a killed one's leftover): never part of a snapshot
        if sts is not None:
            st = sts[i]
        else:
            try:
                st = _stat(name, dir_fd=fd, follow_symlinks=False)
            except OSError:
                continue  # vanished since listing
        rel = prefix + name
        kind = st.st_mode & _IFMT
        if kind == _IFREG:
            left_out = answers.get(rel) if excluded is not None and st.st_ino not in excluded else None
            if left_out is None:
                left_out = ignored(rel, False, absprefix + name, st)
            if not left_out:
                keep(_seen(Seen, (rel, absprefix + name, st)))
                regular.append(rel)
                expected.append((st.st_size, st.st_mtime_ns, st.st_ino))
                if st.st_mtime_ns > newest:
                    newest = st.st_mtime_ns
                if stat_of.get(rel) == expected[-1] and st.st_mtime_ns < before:
                    clean.append((rel, entry_of[rel]))
        elif kind == _IFDIR:
            if not ignored(rel, True, absprefix + name, st):
                subdirs.append(rel)
        elif kind == _IFLNK:
            if not ignored(rel, False, absprefix + name, st):
                keep(_seen(Seen, (rel, absprefix + name, st)))
        elif not ignored(rel, False, absprefix + name, st):
            skipped.append((rel, "not a regular file (device, socket or pipe)"))
    return _Folder(names, [], seen, subdirs, skipped, clean, regular, expected, newest)


def _open_folder(absdir: str, reldir: str, skipped: dict[str, str]) -> tuple[int, list[str]] | None:
    """The folder open (files are then stat-ed by name within it: a shorter lookup than a whole path, and a folder
    replaced by a link since it was seen is not followed) and its names sorted; None, noted in `skipped`, when it
    cannot be read."""
    try:
        fd = os.open(absdir, _DIR_FLAGS if reldir else _ROOT_FLAGS)
    except OSError as exc:
        skipped[reldir or "."] = f"cannot list: {exc.strerror or exc}"
        return None
    try:
        names = os.listdir(fd)
    except OSError as exc:
        os.close(fd)
        skipped[reldir or "."] = f"cannot list: {exc.strerror or exc}"
        return None
    names.sort()
    return fd, names


def link_target(root: str, seen: Seen) -> str | None:
    """The link's target relative to its folder, or None when it resolves outside the workspace."""
    real_root = os.path.realpath(root)
    resolved = os.path.realpath(seen.abspath)
    if resolved != real_root and not resolved.startswith(real_root + os.sep):
        return None
    return os.path.relpath(resolved, os.path.realpath(os.path.dirname(seen.abspath)))


READ_ATTEMPTS = 3


class NotRegularFile(OSError):
    """The path names a pipe, socket or device now, not the regular file the scan saw."""


def _read_exactly(f, n: int) -> bytes:
    """Up to `n` bytes, fewer only at end of file (a short read is not EOF on every filesystem)."""
    parts = []
    while n > 0:
        data = f.read(n)
        if not data:
            break
        parts.append(data)
        n -= len(data)
    return parts[0] if len(parts) == 1 else b"".join(parts)


def _same_stat(a: os.stat_result, b: os.stat_result) -> bool:
    return (a.st_size, a.st_mtime_ns, a.st_ino) == (b.st_size, b.st_mtime_ns, b.st_ino)


def read_file(seen: Seen, uploads: Uploads, chunk_size: int,
               on_chunk: Callable[[int], None]) -> tuple[list[dict[str, Any]], os.stat_result, bool]:
    """Chunk refs of the file's content, its stat, and whether it held still while read."""
    st = seen.st
    chunks: list[dict[str, Any]] = []
    for _attempt in range(READ_ATTEMPTS):
        chunks = []
        # O_NONBLOCK: a pipe put in the file's place since the scan must not hold the backup (and its lock) forever
        fd = os.open(seen.abspath, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
        try:
            before = os.fstat(fd)
            if not stat.S_ISREG(before.st_mode):
                raise NotRegularFile(seen.relpath)
            os.set_blocking(fd, True)
            with os.fdopen(fd, "rb", buffering=0, closefd=False) as f:
                offset = 0
                while True:
                    # one byte past the expected end, so growth since the stat shows up
                    want = min(chunk_size, max(before.st_size - offset, 0) + 1)
                    data = _read_exactly(f, want)
                    if not data:
                        break
                    offset += len(data)
                    uploads.stats.bytes_read += len(data)
                    chunks.append(uploads.add(data))
                    on_chunk(len(data))
                    if len(data) < chunk_size:
                        break
            after = os.fstat(fd)
        finally:
            os.close(fd)
        try:
            on_disk = os.stat(seen.abspath, follow_symlinks=False)
        except FileNotFoundError:
            on_disk = after
        total = sum(c["size"] for c in chunks)
        if _same_stat(before, after) and _same_stat(after, on_disk) and total == after.st_size:
            return chunks, after, True
        st = after
    return chunks, st, False


def read_prefix(seen: Seen, size: int, uploads: Uploads, chunk_size: int,
                on_chunk: Callable[[int], None]) -> list[dict[str, Any]] | None:
    """Chunk refs of the first `size` bytes of the file `seen` names (the same inode); None when it is another
    file now or holds fewer bytes."""
    fd = os.open(seen.abspath, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_ino != seen.st.st_ino:
            return None
        chunks, offset = [], 0
        while offset < size:
            data = os.pread(fd, min(chunk_size, size - offset), offset)
            if not data:
                return None
            offset += len(data)
            uploads.stats.bytes_read += len(data)
            chunks.append(uploads.add(data))
            on_chunk(len(data))
        return chunks
    finally:
        os.close(fd)


BATCH_BYTES = 256 * 1024 * 1024


class Uploads:
    """New chunks queued for writing in batches; content already known is named, not written."""

    def __init__(self, store: Store, known: dict[str, tuple[str, int]], stats: "FileBackupStats", present: set[str]):
        self.store = store
        self.known = known
        self.stats = stats
        self.present = present
        self.pending: dict[str, bytes] = {}
        self.pending_bytes = 0
        self.waiting: list[tuple[dict[str, Any], str]] = []

    def add(self, data: bytes) -> dict[str, Any]:
        fp = fingerprint(data)
        ref: dict[str, Any] = {"size": len(data), "fp": fp}
        hit = self.known.get(fp)
        if hit is not None and hit[1] == len(data) and self._still_there(hit[0]):
            ref["id"] = hit[0]
            self.stats.objects_reused += 1
        elif fp in self.pending:
            self.waiting.append((ref, fp))
        else:
            self.pending[fp] = data
            self.pending_bytes += len(data)
            self.waiting.append((ref, fp))
            if self.pending_bytes >= BATCH_BYTES:
                self.flush()
        return ref

    def _still_there(self, oid: str) -> bool:
        # a concurrent or earlier gc may have dropped what only old snapshots named
        if oid not in self.present:
            if not self.store.has_object(oid):
                return False
            self.present.add(oid)
        return True

    def flush(self) -> None:
        if not self.pending:
            return
        fps = list(self.pending)
        results = self.store.put_objects([self.pending[fp] for fp in fps])
        for fp, (oid, size) in zip(fps, results):
            self.known[fp] = (oid, size)
            self.present.add(oid)
            self.stats.bytes_written += size
            self.stats.objects_written += 1
        for ref, fp in self.waiting:
            ref["id"] = self.known[fp][0]
        self.pending.clear()
        self.waiting.clear()
        self.pending_bytes = 0


def known_chunks(previous: dict[str, Any] | None) -> dict[str, tuple[str, int]]:
    """Fingerprint -> (object id, size) of every chunk the previous `files` record names."""
    known: dict[str, tuple[str, int]] = {}
    for entry in ((previous or {}).get("entries") or {}).values():
        for chunk in entry.get("chunks", []):
            if chunk.get("fp") and chunk.get("id"):
                known[chunk["fp"]] = (chunk["id"], int(chunk["size"]))
    return known


RACY_WINDOW_NS = 2_000_000_000  # mtimes this close to a scan may hide a later write with the same mtime

Progress = Callable[[int, int, str], None]



@dataclass
class FileBackupStats:
    """What one workspace backup read, reused and wrote."""

    files: int = 0
    files_read: int = 0
    files_reused: int = 0
    bytes_total: int = 0
    bytes_read: int = 0
    bytes_written: int = 0
    objects_written: int = 0
    objects_reused: int = 0
    unstable: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {
            "files": self.files, "files_read": self.files_read, "files_reused": self.files_reused,
            "file_bytes_total": self.bytes_total, "file_bytes_read": self.bytes_read,
            "file_bytes_written": self.bytes_written, "file_objects_written": self.objects_written,
            "file_objects_reused": self.objects_reused,
        }


_checked: list[tuple[Any, dict[str, Any]]] = []  # the last entries checked (each cut checks its previous's)


def _well_formed(previous: Any) -> dict[str, Any] | None:
    """The previous files record without what a damaged or crafted manifest could break this backup with.

    The answers for the last few `entries` are kept (entries are never changed once committed, and an unchanged
    workspace's manifests share them)."""
    if not isinstance(previous, dict):
        return None
    scanned = previous.get("scanned_at_ns")
    entries = previous.get("entries")
    checked = next((c for e, c in _checked if e is entries), None)
    if checked is None:
        checked = {p: e for p, e in entries.items() if is_valid_entry(p, e) and ("link" in e or "mode" in e)} \
            if isinstance(entries, dict) else {}
        if isinstance(entries, dict) and len(checked) == len(entries):
            checked = entries  # all well formed: the same object, which a cut's answers were computed against
        _keep_checked(entries, checked)
    return {"scanned_at_ns": scanned if isinstance(scanned, int) and not isinstance(scanned, bool) else 0,
            "entries": checked}


def _keep_checked(entries: Any, checked: dict[str, Any]) -> None:
    _checked[:] = [(entries, checked), *_checked[:3]]


def _clean_against(previous: dict[str, Any] | None) -> tuple[_Keys, int]:
    """The previous record's entries by path with their (size, mtime, inode), and the mtime a clean file is older
    than (not written just before that record's scan, when a later write could keep the same mtime)."""
    prev_entries = (previous or {}).get("entries") or {}
    prev_scanned = (previous or {}).get("scanned_at_ns") or 0
    if not isinstance(prev_entries, dict) or not isinstance(prev_scanned, int):
        return _Keys({}, {}), 0
    return _stat_keys(prev_entries), prev_scanned - RACY_WINDOW_NS


def _reusable(seen_all: list[Seen], previous: dict[str, Any] | None) -> dict[str, dict[str, Any]]:
    """Previous entries of stat-clean files: same size, mtime and inode, and not written just before that scan."""
    (stat_of, entry_of), before = _clean_against(previous)
    reuse: dict[str, dict[str, Any]] = {}
    if not stat_of:
        return reuse
    for seen in seen_all:
        st = seen.st
        if (stat_of.get(seen.relpath) == (st.st_size, st.st_mtime_ns, st.st_ino) and st.st_mtime_ns < before
                and stat.S_ISREG(st.st_mode)):
            reuse[seen.relpath] = entry_of[seen.relpath]
    return reuse


class _Keys(NamedTuple):
    """A record's entries that name chunks, by path: their (size, mtime, inode) and the entries themselves (two
    dicts, so a folder's files are looked up and compared in C)."""

    stat: dict[str, tuple[Any, Any, Any]]
    entry: dict[str, dict[str, Any]]


_stat_keyed: list[tuple[Any, _Keys]] = []


def _stat_keys(entries: dict[str, Any]) -> _Keys:
    """The `_Keys` of `entries`; kept for the last few entries (never changed once committed, and built by the
    backup that writes them), so a cut at the kernel's instant compares tuples."""
    for known, keyed in _stat_keyed:
        if known is entries:
            return keyed
    stat_of = {p: (e.get("size"), e.get("mtime_ns"), e.get("ino")) for p, e in entries.items()
               if isinstance(e, dict) and "chunks" in e}
    keyed = _Keys(stat_of, entries if len(stat_of) == len(entries) else {p: entries[p] for p in stat_of})
    _stat_keyed[:] = [(entries, keyed), *_stat_keyed[:2]]
    return keyed


_REUSED_KEYS = ("size", "mode", "mtime_ns", "ino", "chunks")


class _Sums(NamedTuple):
    """What an unchanged cut reports of the entries it names again: their bytes, their chunks, and whether each is
    exactly a reused entry (`_REUSED_KEYS`, nothing more)."""

    size: int
    chunks: int
    plain: bool


_summed: list[tuple[Any, _Sums]] = []


def _sums(entries: dict[str, dict[str, Any]], keep: bool) -> _Sums:
    """The entries' `_Sums`; with `keep`, kept for the last few records' entries (never changed once committed),
    so a cut of an unchanged workspace costs no pass over its 10,000 entries here."""
    for known, sums in _summed:
        if known is entries:
            return sums
    values = entries.values()
    sums = _Sums(sum(e["size"] for e in values), sum(len(e["chunks"]) for e in values),
                 all(len(e) == 5 for e in values))
    if keep:
        _summed[:] = [(entries, sums), *_summed[:2]]
    return sums


class _Backup:
    """One backup in progress: the entry of each file seen, reused, read or skipped, and how far it has got."""

    def __init__(self, root: str, uploads: Uploads, reuse: dict[str, dict[str, Any]], chunk_size: int,
                 total: int, progress: Progress | None, held: dict[str, bytes] | None = None):
        self.root, self.uploads, self.reuse, self.chunk_size = root, uploads, reuse, chunk_size
        self.held = held  # a cut's: the bytes read at its instant; None: files are read as they are now
        self.stats = uploads.stats
        self.total, self.done, self.progress = total, 0, progress

    def advance(self, n: int, relpath: str) -> None:
        self.done = min(self.done + n, self.total)
        if self.progress is not None:
            self.progress(self.done, self.total, relpath)

    def entry(self, seen: Seen) -> dict[str, Any] | None:
        """The `files` entry of one file or link; None when it is left out (and why is in the stats)."""
        if stat.S_ISLNK(seen.st.st_mode):
            return self._link(seen)
        old = self.reuse.get(seen.relpath)
        if old is not None and all(c["id"] in self.uploads.present for c in old["chunks"]):
            # the previous entry itself when it holds exactly these (records are never changed once committed)
            entry = old if len(old) == 5 else {k: old[k] for k in _REUSED_KEYS}
            self.stats.files_reused += 1
            self.stats.objects_reused += len(old["chunks"])
            self.advance(entry["size"], seen.relpath)
        else:
            entry = self._read(seen) if self.held is None else self._as_at_cut(seen)
            if entry is None:
                return None
        self.stats.files += 1
        self.stats.bytes_total += entry["size"]
        return entry

    def _link(self, seen: Seen) -> dict[str, Any] | None:
        target = link_target(self.root, seen)
        if target is None:
            self.stats.skipped[seen.relpath] = "symbolic link to a path outside the workspace (not followed)"
            return None
        return {"link": target, "size": 0}

    def _as_at_cut(self, seen: Seen) -> dict[str, Any] | None:
        """The entry of a file as it was at the cut's instant: held bytes, the same file, the part of it that existed
        then (it was appended to since), or, replaced or shrunk since, as it is now and marked unstable."""
        data = self.held.get(seen.relpath) if self.held is not None else None
        if data is not None:
            chunks = [self.uploads.add(data[i:i + self.chunk_size]) for i in range(0, len(data), self.chunk_size)]
            self.stats.bytes_read += len(data)
            self.advance(len(data), seen.relpath)
            self.stats.files_read += 1
            return {"size": len(data), "mode": stat.S_IMODE(seen.st.st_mode), "mtime_ns": seen.st.st_mtime_ns,
                    "ino": seen.st.st_ino, "chunks": chunks}
        try:
            now = os.stat(seen.abspath, follow_symlinks=False)
        except OSError:
            return None  # deleted since the instant: its content then is nowhere to read
        if _same_stat(now, seen.st):
            return self._read(seen)
        if stat.S_ISREG(now.st_mode) and now.st_ino == seen.st.st_ino and now.st_size >= seen.st.st_size:
            try:
                chunks = read_prefix(seen, seen.st.st_size, self.uploads, self.chunk_size,
                                     lambda n, rel=seen.relpath: self.advance(n, rel))
            except OSError:
                chunks = None
            if chunks is not None:
                self.stats.files_read += 1
                return {"size": seen.st.st_size, "mode": stat.S_IMODE(seen.st.st_mode),
                        "mtime_ns": seen.st.st_mtime_ns, "ino": seen.st.st_ino, "chunks": chunks}
        entry = self._read(Seen(seen.relpath, seen.abspath, now))
        if entry is not None and not entry.get("unstable"):
            entry["unstable"] = True
            self.stats.unstable.append(seen.relpath)
        return entry

    def _read(self, seen: Seen) -> dict[str, Any] | None:
        try:
            chunks, st, stable = read_file(seen, self.uploads, self.chunk_size,
                                           lambda n, rel=seen.relpath: self.advance(n, rel))
        except FileNotFoundError:
            return None  # deleted since the scan: not part of this snapshot
        except NotRegularFile:
            self.stats.skipped[seen.relpath] = "not a regular file (device, socket or pipe)"
            return None
        except OSError as exc:
            if exc.errno != errno.ELOOP:  # ELOOP: replaced by a symlink since the scan
                self.stats.skipped[seen.relpath] = f"cannot read: {exc.strerror or exc}"
            return None
        entry = {"size": sum(c["size"] for c in chunks), "mode": stat.S_IMODE(st.st_mode),
                 "mtime_ns": st.st_mtime_ns, "ino": st.st_ino, "chunks": chunks}
        if not stable:
            entry["unstable"] = True
            self.stats.unstable.append(seen.relpath)
        self.stats.files_read += 1
        return entry


def backup_workspace(
    store: Store,
    root: str,
    previous: dict[str, Any] | None = None,
    rules: IgnoreRules | None = None,
    chunk_size: int = CHUNK_SIZE,
    progress: Progress | None = None,
    cut: Cut | None = None,
    previous_listed: bool = False,
) -> tuple[dict[str, Any], dict[str, int], FileBackupStats]:
    """Back up `root`: (the manifest's `files` record, objects it names, stats). Writes only new chunks.

    `cut`: the workspace as `take_cut` saw it at a kernel snapshot's instant; the files are stored as they were
    then (cut.py), not as they are now. `previous_listed`: `previous` belongs to a manifest listed under the
    write lock this backup holds, whose objects no gc deletes (engine/prune.py): they are not asked for again."""
    previous = _well_formed(previous)
    stats = FileBackupStats()
    if cut is not None:
        root, scanned_at, seen_all = cut.root, cut.scanned_at_ns, cut.seen
        stats.skipped.update(cut.skipped)
    else:
        root = os.path.realpath(root)
        if not os.path.isdir(root):
            raise SpotWarpError(f"workspace {root} is not a folder")
        rules = rules or IgnoreRules.for_workspace(root)
        scanned_at = time.time_ns()
        seen_all = scan(root, rules, stats.skipped)
    # stat-clean files are named again without reading, if their chunks are still stored
    if cut is not None and previous is not None and cut.clean_against == (id(previous["entries"]), previous["scanned_at_ns"]) \
            and cut.previous_entries is previous["entries"]:
        reuse = cut.clean  # the cut's answer against these very entries
    else:
        reuse = _reusable(seen_all, previous)
    # every file stat-clean: the entries are the previous ones, whose chunk ids are known already
    whole = previous is not None and len(reuse) == len(seen_all) == len(previous["entries"])
    reused = set(chunk_ids(previous["entries"])) if whole else {c["id"] for e in reuse.values() for c in e["chunks"]}
    present = reused if previous_listed else store.present(reused)  # an older listing's: a gc may have dropped some
    # every file stat-clean: each entry's size is its file's at the cut
    sums = _sums(previous["entries"] if whole else reuse, whole) if len(reuse) == len(seen_all) else None
    total = sums.size if sums is not None else sum(s.st.st_size for s in seen_all if stat.S_ISREG(s.st.st_mode))
    if sums is not None and sums.plain and len(present) == len(reused):
        # nothing changed: the previous entries themselves, each file having cost its stat
        entries = previous["entries"] if whole else reuse
        stats.files = stats.files_reused = len(entries)
        stats.objects_reused, stats.bytes_total = sums.chunks, total
        if progress is not None and seen_all:
            progress(total, total, seen_all[-1].relpath)
    else:
        uploads = Uploads(store, known_chunks(previous), stats, present)
        backup = _Backup(root, uploads, reuse, chunk_size, total, progress, None if cut is None else cut.held)
        entries = {seen.relpath: entry for seen in seen_all if (entry := backup.entry(seen)) is not None}
        uploads.flush()
    objects = dict(chunk_ids(entries))
    files = {"scanned_at_ns": scanned_at, "chunk_size": chunk_size, "entries": entries,
             "skipped": stats.skipped, "unstable": stats.unstable}
    # well formed as built (from checked entries and files read here): the next backup in this process need not
    # check it again, and the next cut finds its stat keys built here rather than at the kernel's instant
    _keep_checked(entries, entries)
    _stat_keys(entries)
    return files, objects, stats


def files_changed(a: dict[str, Any] | None, b: dict[str, Any] | None) -> bool:
    """True when two `files` records name different content, modes or links."""
    def shape(files: dict[str, Any] | None) -> dict[str, Any]:
        return {p: (e.get("link"), e.get("mode"), tuple(c["id"] for c in e.get("chunks", [])))
                for p, e in ((files or {}).get("entries") or {}).items()}
    return shape(a) != shape(b)
