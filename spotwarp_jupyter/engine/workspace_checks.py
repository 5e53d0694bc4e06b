"""The checks on a snapshot's `files` record that come before a restore writes anything: paths, entries, shapes."""

from __future__ import annotations

import posixpath
from typing import Any

from .errors import ManifestError
from .hashing import is_object_id

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
