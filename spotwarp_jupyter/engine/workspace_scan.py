"""Which files a workspace backup sees: a sorted walk that honours the ignore rules and never follows links."""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from typing import Iterator

from .ignore import IgnoreRules
from .restore_temporaries import is_temporary


@dataclass
class Seen:
    """One file or symbolic link the scan found: its workspace path, its path on disk, its stat."""

    relpath: str
    abspath: str
    st: os.stat_result


def scan(root: str, rules: IgnoreRules, skipped: dict[str, str]) -> Iterator[Seen]:
    """Every file and symlink under `root` that the rules keep, sorted, without following links."""
    stack = [""]
    while stack:
        reldir = stack.pop()
        absdir = os.path.join(root, reldir) if reldir else root
        try:
            with os.scandir(absdir) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError as exc:
            skipped[reldir or "."] = f"cannot list: {exc.strerror or exc}"
            continue
        subdirs = []
        for entry in entries:
            rel = f"{reldir}/{entry.name}" if reldir else entry.name
            if is_temporary(entry.name):
                continue  # a restore's half-written file (or a killed one's leftover): never part of a snapshot
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue  # vanished since listing
            if stat.S_ISDIR(st.st_mode):
                if not rules.ignored(rel, True, entry.path):
                    subdirs.append(rel)
            elif stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode):
                if not rules.ignored(rel, False, entry.path):
                    yield Seen(rel, entry.path, st)
            elif not rules.ignored(rel, False, entry.path):
                skipped[rel] = "not a regular file (device, socket or pipe)"
        stack.extend(reversed(subdirs))


def link_target(root: str, seen: Seen) -> str | None:
    """The link's target relative to its folder, or None when it resolves outside the workspace."""
    real_root = os.path.realpath(root)
    resolved = os.path.realpath(seen.abspath)
    if resolved != real_root and not resolved.startswith(real_root + os.sep):
        return None
    return os.path.relpath(resolved, os.path.realpath(os.path.dirname(seen.abspath)))
