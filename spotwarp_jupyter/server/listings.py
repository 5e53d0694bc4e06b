"""A folder listed while a file in it is renamed or replaced is listed, not answered with a 404.

jupyter_server lists a folder by stat-ing each entry and then building its model; an entry renamed or replaced
in between (JupyterLab's first save renaming Untitled.ipynb, an atomic replacement such as SpotWarp's own
rewrite of a restored notebook) raises a 404 for that entry, which becomes the folder's answer: JupyterLab's
file browser then shows a blocking "Directory not found". The server's `contents_manager.get` is wrapped so a
folder that still exists is listed again (docs/upstream/jupyter-server-listing-race.md is the report for
jupyter_server itself).
"""

from __future__ import annotations

import inspect
from typing import Any

from jupyter_core.utils import ensure_async
from tornado import web

LISTING_TRIES = 8  # each try lists the folder afresh; one rename spoils one listing at most


def list_through_renames(contents_manager: Any) -> None:
    """Wrap `contents_manager.get` (async or not, as the manager is) so a folder's listing outlives a rename."""
    original = contents_manager.get
    if getattr(original, "spotwarp_lists_through_renames", False):
        return

    def vanished_entry(exc: web.HTTPError, path: str, content: bool, kind: str | None) -> bool:
        return exc.status_code == 404 and content and kind in (None, "directory")

    if inspect.iscoroutinefunction(original):
        async def get(path: str, content: bool = True, type: str | None = None, format: str | None = None,
                      **kwargs: Any) -> Any:
            for attempt in range(LISTING_TRIES):
                try:
                    return await original(path, content=content, type=type, format=format, **kwargs)
                except web.HTTPError as exc:
                    if attempt == LISTING_TRIES - 1 or not vanished_entry(exc, path, content, type) \
                            or not await ensure_async(contents_manager.dir_exists(path)):
                        raise
            raise AssertionError("unreachable")
    else:
        def get(path: str, content: bool = True, type: str | None = None, format: str | None = None,  # type: ignore[misc]
                **kwargs: Any) -> Any:
            for attempt in range(LISTING_TRIES):
                try:
                    return original(path, content=content, type=type, format=format, **kwargs)
                except web.HTTPError as exc:
                    if attempt == LISTING_TRIES - 1 or not vanished_entry(exc, path, content, type) \
                            or not contents_manager.dir_exists(path):
                        raise
            raise AssertionError("unreachable")

    get.spotwarp_lists_through_renames = True  # type: ignore[attr-defined]
    contents_manager.get = get
