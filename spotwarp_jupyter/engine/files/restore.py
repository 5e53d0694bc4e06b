"""Restore workspace files from a snapshot, never writing outside the workspace whatever the manifest says.

Every path and entry is checked before anything is written: an absolute path, a `..` component,
a malformed chunk list, mode or time, or a link leading out of the workspace (followed through every
other link, those on disk and those the restore plants: link_safety) refuses the whole restore. Folders
on the way are created one by one and never entered through a symbolic link. Each file is written
to a short temporary name and renamed into place, so a failed restore leaves no half-written file,
and the temporaries a killed restore left are removed by the next one (temporaries.py).
Files already holding the snapshot's content are left alone; files the snapshot does not name are
never deleted. A running server's own state (ignore.SERVER_STATE_PATTERNS: Jupyter's file-id database, runtime
files, collaboration history, checkpoints) is never written, whatever the snapshot holds. With `keep_existing`
(a kept home), whatever is on disk stays as it is: only what is missing comes back.
"""

from __future__ import annotations

import os
import posixpath
import stat
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, BinaryIO, Callable

from ..errors import ManifestError, SpotWarpError
from ..hashing import fingerprint, is_object_id
from ..storage import Store, replace_with
from . import temporaries
from .ignore import is_server_state
from .link_safety import Links

_NS_LIMIT = 2**63  # file times are signed 64-bit nanoseconds


class UnsafePathError(ManifestError):
    """A snapshot names a file outside the workspace (absolute, `..`, or through a link)."""


def check_relpath(relpath: Any) -> str:
    """`relpath` if it names a place inside the workspace, else raise UnsafePathError."""
    if not isinstance(relpath, str) or not relpath or "\x00" in relpath:
        raise UnsafePathError(f"snapshot names an invalid file path {relpath!r}: refusing to restore")
    parts = relpath.split("/")
    if (relpath.startswith("/") or "\\" in relpath or (len(relpath) > 1 and relpath[1] == ":")
            or any(p in ("", ".", "..") for p in parts)):
        raise UnsafePathError(
            f"snapshot names a file outside the workspace ({relpath!r}): refusing to restore anything from it")
    return relpath


def _check_entry(relpath: str, entry: Any) -> None:
    if not isinstance(entry, dict):
        raise ManifestError(f"snapshot entry for {relpath!r} is malformed")
    if "link" in entry:
        _check_link(relpath, entry["link"])
    else:
        _check_file(relpath, entry)


def _check_link(relpath: str, target: Any) -> None:
    if not isinstance(target, str) or not target or target.startswith("/") or "\x00" in target:
        raise UnsafePathError(f"snapshot link {relpath!r} -> {target!r} leaves the workspace: refusing to restore")
    joined = posixpath.normpath(posixpath.join(posixpath.dirname(relpath), target))
    if joined == ".." or joined.startswith("../") or joined.startswith("/"):
        raise UnsafePathError(f"snapshot link {relpath!r} -> {target!r} leaves the workspace: refusing to restore")


def _check_file(relpath: str, entry: dict[str, Any]) -> None:
    chunks = entry.get("chunks")
    size = entry.get("size")
    if not isinstance(chunks, list) or not isinstance(size, int) or size < 0:
        raise ManifestError(f"snapshot entry for {relpath!r} is malformed")
    mode, mtime = entry.get("mode", 0o644), entry.get("mtime_ns")
    if not _is_int(mode) or not 0 <= mode <= 0o7777:
        raise ManifestError(f"snapshot entry for {relpath!r} has a malformed mode {_short(mode)}: refusing to restore")
    if mtime is not None and (not _is_int(mtime) or not -_NS_LIMIT < mtime < _NS_LIMIT):
        raise ManifestError(f"snapshot entry for {relpath!r} has a malformed mtime_ns {_short(mtime)}: "
                            "refusing to restore")
    total = 0
    for c in chunks:
        if (not isinstance(c, dict) or not is_object_id(str(c.get("id", ""))) or not isinstance(c.get("size"), int)
                or c["size"] < 0):
            raise ManifestError(f"snapshot entry for {relpath!r} has a malformed chunk")
        total += c["size"]
    if total != size:
        raise ManifestError(f"snapshot entry for {relpath!r}: chunks hold {total} bytes, not {size}")


def is_valid_entry(relpath: Any, entry: Any) -> bool:
    """True when a restore would accept this entry (a safe path, well-formed chunks, mode and time)."""
    try:
        check_relpath(relpath)
        _check_entry(relpath, entry)
    except ManifestError:
        return False
    return all(isinstance(c.get("fp", ""), str) for c in entry.get("chunks", []))


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def check_files(files: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The entries of a `files` record, every one checked; raises before anything is written."""
    entries = (files or {}).get("entries") or {}
    if not isinstance(entries, dict):
        raise ManifestError("snapshot files record is malformed")
    for relpath, entry in entries.items():
        check_relpath(relpath)
        _check_entry(relpath, entry)
    folders = {posixpath.dirname(p) for p in entries}
    for relpath in entries:
        if any(f == relpath or f.startswith(relpath + "/") for f in folders if f):
            raise ManifestError(f"snapshot names {relpath!r} both as a file and as a folder")
    return entries


def folder_for(root: str, reldir: str) -> str:
    """The absolute folder for `reldir`, created one level at a time, never through a symbolic link."""
    path = root
    for part in reldir.split("/") if reldir else []:
        path = os.path.join(path, part)
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            try:
                os.mkdir(path, 0o755)
            except FileExistsError:
                pass
            st = os.lstat(path)
        if stat.S_ISLNK(st.st_mode):
            raise UnsafePathError(f"{path} is a symbolic link: refusing to restore files through it")
        if not stat.S_ISDIR(st.st_mode):
            raise SpotWarpError(f"cannot restore into {reldir!r}: {path} exists and is not a folder")
    return path


def holds(path: str, entry: dict[str, Any]) -> bool:
    """True when the regular file at `path` already has exactly the entry's content."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    if not stat.S_ISREG(st.st_mode) or st.st_size != entry["size"]:
        return False
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return False  # replaced since the stat (by a link, a pipe...): write it again
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return False
        for chunk in entry["chunks"]:
            data = f.read(chunk["size"])
            if not chunk.get("fp") or fingerprint(data) != chunk["fp"]:
                return False
    return True


def write_file(store: Store, folder: str, name: str, entry: dict[str, Any], on_bytes: Callable[[int], None]) -> None:
    """Write one file's chunks (each checked against its hash) to a temporary, then rename it into place."""
    tmp, fd = temporaries.create_locked(folder)  # short name: any name the filesystem allows fits

    def fill(f: BinaryIO) -> None:
        for chunk in entry["chunks"]:
            data = store.read_object(chunk["id"], chunk["size"])  # checked against its hash
            f.write(data)
            on_bytes(len(data))

    # the lock on the temporary is released when it closes: only after the rename
    replace_with(tmp, fd, os.path.join(folder, name), fill, mode=entry.get("mode", 0o644) & 0o777,
                 mtime_ns=entry.get("mtime_ns"), check=_no_folder_in_the_way, sync_folder=False)


def _no_folder_in_the_way(target: str) -> None:
    if os.path.isdir(target) and not os.path.islink(target):
        raise SpotWarpError(f"cannot restore file {target}: a folder is in the way")


def write_link(folder: str, name: str, target: str) -> None:
    """Plant a symbolic link, replacing whatever has its name in one rename."""
    path = os.path.join(folder, name)
    try:
        os.symlink(target, path)
        return
    except FileExistsError:
        pass  # replaced through a temporary, in one rename
    tmp = os.path.join(folder, temporaries.new_name())
    os.symlink(target, tmp)
    try:
        if os.path.isdir(path) and not os.path.islink(path):
            raise SpotWarpError(f"cannot restore link {path}: a folder is in the way")
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


Progress = Callable[[int, int, str], None]
TMP_MARK = temporaries.MARK

__all__ = [
    "TMP_MARK",
    "FileRestoreReport",
    "Progress",
    "UnsafePathError",
    "check_files",
    "check_links",
    "check_relpath",
    "is_valid_entry",
    "restore_files",
    "survey",
]


@dataclass
class FileRestoreReport:
    """What came back into the workspace."""

    files_restored: int = 0
    files_unchanged: int = 0
    links_restored: int = 0
    bytes_restored: int = 0
    bytes_total: int = 0
    duration_s: float = 0.0
    unstable: list[str] = field(default_factory=list)
    temporaries_removed: int = 0
    files_kept: int = 0  # on disk already, left as they are (keep_existing)
    server_state_skipped: list[str] = field(default_factory=list)  # a server's own state, never written

    def as_dict(self) -> dict[str, Any]:
        return {
            "files_restored": self.files_restored, "files_unchanged": self.files_unchanged,
            "links_restored": self.links_restored, "bytes_restored": self.bytes_restored,
            "bytes_total": self.bytes_total, "duration_s": round(self.duration_s, 3), "unstable": self.unstable,
            "temporaries_removed": self.temporaries_removed, "files_kept": self.files_kept,
            "server_state_skipped": self.server_state_skipped,
        }


def survey(root: str) -> tuple[dict[str, str], list[str]]:
    """The workspace's symbolic links (relative path -> target) and restore temporaries, never following links."""
    links: dict[str, str] = {}
    leftovers: list[str] = []
    stack = [""]
    while stack:
        reldir = stack.pop()
        try:
            with os.scandir(os.path.join(root, reldir) if reldir else root) as it:
                found = list(it)
        except OSError:
            continue  # unreadable: nothing the restore writes goes there either
        for entry in found:
            rel = f"{reldir}/{entry.name}" if reldir else entry.name
            try:
                if entry.is_symlink():
                    links[rel] = os.readlink(entry.path)
                elif entry.is_dir(follow_symlinks=False):
                    stack.append(rel)
                    continue
            except OSError:
                continue
            if temporaries.is_temporary(entry.name):
                leftovers.append(entry.path)
    return links, leftovers


def check_links(root: str, on_disk: dict[str, str], entries: dict[str, dict[str, Any]]) -> None:
    """Refuse (before anything is written) a restore after which some link would lead outside the workspace."""
    linked_folders = sorted({f for p in entries for f in _ancestors(p)} & set(on_disk))
    if linked_folders:
        raise UnsafePathError(f"{os.path.join(root, linked_folders[0])} is a symbolic link: "
                              "refusing to restore files through it")
    before = Links(root, on_disk)
    after = before.after(entries)
    for relpath, entry in sorted(entries.items()):
        if "link" in entry and not after.stays_inside(relpath):
            raise UnsafePathError(f"snapshot link {relpath!r} -> {entry['link']!r} leads outside the workspace "
                                  "through other links: refusing to restore")
    for relpath in sorted(set(on_disk) - set(entries)):
        if before.stays_inside(relpath) and not after.stays_inside(relpath):
            raise UnsafePathError(f"snapshot links would make the workspace's link {relpath!r} -> "
                                  f"{on_disk[relpath]!r} lead outside it: refusing to restore")


def _ancestors(relpath: str) -> list[str]:
    parts = relpath.split("/")[:-1]
    return ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]


class _Restore:
    """One restore in progress: writes entries (from several threads) and counts what it did."""

    def __init__(self, store: Store, root: str, report: FileRestoreReport, progress: Progress | None):
        self.store, self.root, self.report, self.progress = store, root, report, progress
        self.lock = threading.Lock()
        self.done = 0

    def advance(self, n: int, relpath: str) -> None:
        with self.lock:
            self.done += n
            if self.progress is not None:
                self.progress(self.done, self.report.bytes_total, relpath)

    def count(self, **added: int) -> None:
        with self.lock:
            for name, n in added.items():
                setattr(self.report, name, getattr(self.report, name) + n)

    def one(self, item: tuple[str, dict[str, Any]]) -> None:
        """Put one entry in place: a link, a file already there, or a file written anew."""
        relpath, entry = item
        folder = folder_for(self.root, posixpath.dirname(relpath))
        name = posixpath.basename(relpath)
        if "link" in entry:
            write_link(folder, name, entry["link"])
            self.count(links_restored=1)
        elif holds(os.path.join(folder, name), entry):
            self.advance(entry["size"], relpath)
            self.count(files_unchanged=1)
        else:
            write_file(self.store, folder, name, entry, lambda n: self.advance(n, relpath))
            self.count(files_restored=1, bytes_restored=entry["size"])


def _occupied(root: str, relpath: str) -> bool:
    """Whether something on disk holds `relpath`'s place: the path itself (any kind), or a non-folder on its way."""
    path = root
    for part in relpath.split("/"):
        path = os.path.join(path, part)
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            return False
        except OSError:
            return True  # unreadable: the user's, left alone
        if not stat.S_ISDIR(st.st_mode):
            return True
    return True


def restore_files(store: Store, files: dict[str, Any], root: str, progress: Progress | None = None,
                  workers: int | None = None, keep_existing: bool = False) -> FileRestoreReport:
    """Write the snapshot's files into `root` (created if missing); see the module docstring for the rules.

    `keep_existing`: only entries nothing on disk holds the place of are written (a kept home after a loss: its
    files are the newest the user has)."""
    started = time.perf_counter()
    entries = check_files(files)
    root = os.path.realpath(root)
    skipped = sorted(p for p in entries if is_server_state(p))
    entries = {p: e for p, e in entries.items() if not is_server_state(p)}
    kept = 0
    if keep_existing and os.path.isdir(root):
        missing = {p: e for p, e in entries.items() if not _occupied(root, p)}
        kept, entries = len(entries) - len(missing), missing
    on_disk, leftovers = survey(root) if os.path.isdir(root) else ({}, [])
    check_links(root, on_disk, entries)
    os.makedirs(root, exist_ok=True)
    report = FileRestoreReport(unstable=sorted(p for p, e in entries.items() if e.get("unstable")),
                               files_kept=kept, server_state_skipped=skipped)
    report.temporaries_removed = temporaries.sweep(leftovers)[0]
    report.bytes_total = sum(e.get("size", 0) for e in entries.values())
    restore = _Restore(store, root, report, progress)
    items = sorted(entries.items())
    with ThreadPoolExecutor(max_workers=workers or (4 if store.local else 16), thread_name_prefix="spotwarp-files") as pool:
        for _ in pool.map(restore.one, [i for i in items if "link" not in i[1]]):
            pass
    for item in items:  # links after the files, so a link never redirects a file write
        if "link" in item[1]:
            restore.one(item)
    report.duration_s = time.perf_counter() - started
    return report
