"""Where symbolic links lead once a restore is done: every link, followed through every other, stays in the workspace.

Checking each link's target on its own is not enough: with `z/.../l2 -> ../../..` (the workspace root) a
link `l1 -> z/.../l2/../../etc` reads as `etc` inside the workspace, yet the kernel follows l2 first and
climbs out. So a link is followed component by component, as the kernel does, through the links the
workspace will hold after the restore: those already on disk (planted by an earlier restore, or made by
the user) and those this restore plants, whatever order they are planted in. A folder component missing
today counts as a plain folder (one may be created later); a chain longer than the kernel would follow
reaches nothing.
"""

from __future__ import annotations

import os
import posixpath
from typing import Any, Mapping

HOPS = 256  # more than the kernel's 40: a chain this long resolves to nothing, so reaches nothing outside


class Links:
    """The symbolic links of a workspace (relative path -> target) and where each leads."""

    def __init__(self, root: str, links: Mapping[str, str]):
        self.root = root
        self.links = dict(links)

    def after(self, entries: Mapping[str, Mapping[str, Any]]) -> "Links":
        """These links as a restore of `entries` leaves them: the snapshot's replace what it names."""
        links = dict(self.links)
        for relpath, entry in entries.items():
            if "link" in entry:
                links[relpath] = entry["link"]
            else:
                links.pop(relpath, None)
        return Links(self.root, links)

    def stays_inside(self, relpath: str) -> bool:
        """True when the link at `relpath` cannot lead outside the workspace."""
        target = self.links[relpath]
        start = [p for p in posixpath.dirname(relpath).split("/") if p]
        return self._follow(start, target)

    def _follow(self, current: list[str], target: str) -> bool:
        pending: list[str] = []  # components still to walk, the next one last
        if not self._push(pending, target):
            return False
        if target.startswith("/"):
            current = []
        hops = 0
        while pending:
            part = pending.pop()
            if part in ("", "."):
                continue
            if part == "..":
                if not current:
                    return False  # above the workspace root
                current.pop()
                continue
            current.append(part)
            link = self.links.get("/".join(current))
            if link is None:
                continue
            hops += 1
            if hops > HOPS:
                return True
            current.pop()  # the link's target is walked from the link's folder
            if not self._push(pending, link):
                return False
            if link.startswith("/"):
                current = []
        return True

    def _push(self, pending: list[str], target: str) -> bool:
        """Queue `target`'s components (an absolute one relative to the root); False when it is outside."""
        if target.startswith("/"):
            inner = self._inside(target)
            if inner is None:
                return False
            target = inner
        pending.extend(reversed(target.split("/")))
        return True

    def _inside(self, absolute: str) -> str | None:
        """`absolute` relative to the root, or None when it names a place outside it."""
        for candidate in (absolute, os.path.realpath(absolute)):
            if candidate == self.root or candidate.rstrip("/") == self.root:
                return ""
            if candidate.startswith(self.root + "/"):
                return candidate[len(self.root) + 1:]
        return None
