"""Writing restored files and links into the workspace: folders never entered through a link, every file
written to a temporary and renamed into place, a file already holding the content left alone."""

from __future__ import annotations

import os
import stat
from typing import Any, BinaryIO, Callable

from . import restore_temporaries
from .errors import SpotWarpError
from .hashing import fingerprint
from .local_files import replace_with
from .store import Store
from .workspace_checks import UnsafePathError


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
    tmp, fd = restore_temporaries.create_locked(folder)  # short name: any name the filesystem allows fits

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
    tmp = os.path.join(folder, restore_temporaries.new_name())
    os.symlink(target, tmp)
    try:
        if os.path.isdir(path) and not os.path.islink(path):
            raise SpotWarpError(f"cannot restore link {path}: a folder is in the way")
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
