"""Restore workspace files from a snapshot, never writing outside the workspace whatever the manifest says.

Every path and entry is checked before anything is written: an absolute path, a `..` component,
a malformed chunk list, mode or time, or a link leading out of the workspace (followed through every
other link, those on disk and those the restore plants: link_safety) refuses the whole restore. Folders
on the way are created one by one and never entered through a symbolic link. Each file is written
to a short temporary name and renamed into place, so a failed restore leaves no half-written file,
and the temporaries a killed restore left are removed by the next one (restore_temporaries).
Files already holding the snapshot's content are left alone; files the snapshot does not name are
never deleted.
"""

from __future__ import annotations

import os
import posixpath
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable

from . import restore_temporaries
from .link_safety import Links
from .store import Store
from .workspace_checks import (
    UnsafePathError,
    check_files,
    check_relpath,
    is_valid_entry,
)
from .workspace_write import folder_for, holds, write_file, write_link

Progress = Callable[[int, int, str], None]
TMP_MARK = restore_temporaries.MARK

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

    def as_dict(self) -> dict[str, Any]:
        return {
            "files_restored": self.files_restored, "files_unchanged": self.files_unchanged,
            "links_restored": self.links_restored, "bytes_restored": self.bytes_restored,
            "bytes_total": self.bytes_total, "duration_s": round(self.duration_s, 3), "unstable": self.unstable,
            "temporaries_removed": self.temporaries_removed,
        }


def survey(root: str) -> tuple[dict[str, str], list[str]]:
    """The workspace's symbolic links (relative path -> target) and restore temporaries, never following links."""
    links: dict[str, str] = {}
    temporaries: list[str] = []
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
            if restore_temporaries.is_temporary(entry.name):
                temporaries.append(entry.path)
    return links, temporaries


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


def restore_files(store: Store, files: dict[str, Any], root: str, progress: Progress | None = None,
                  workers: int | None = None) -> FileRestoreReport:
    """Write the snapshot's files into `root` (created if missing); see the module docstring for the rules."""
    started = time.perf_counter()
    entries = check_files(files)
    root = os.path.realpath(root)
    on_disk, temporaries = survey(root) if os.path.isdir(root) else ({}, [])
    check_links(root, on_disk, entries)
    os.makedirs(root, exist_ok=True)
    report = FileRestoreReport(unstable=sorted(p for p, e in entries.items() if e.get("unstable")))
    report.temporaries_removed = restore_temporaries.sweep(temporaries)[0]
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
