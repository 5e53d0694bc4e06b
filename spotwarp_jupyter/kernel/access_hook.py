"""Feeds every cell's code to the session's AccessTracker (engine/incremental/access.py) through IPython's AST hook."""

from __future__ import annotations

import ast
from typing import Any

from ..engine.incremental import AccessTracker


class NoteCellAccess(ast.NodeTransformer):
    """An `ast_transformers` entry that reads each cell's tree before it runs and changes nothing."""

    def __init__(self, tracker: AccessTracker):
        self.tracker = tracker

    def visit(self, node: ast.AST) -> ast.AST:
        if isinstance(node, ast.Module):
            self.tracker.note(node)
        else:  # not a cell's tree: count it as touching everything rather than guess
            self.tracker.note("exec")
        return node


def install(ipython: Any, tracker: AccessTracker) -> None:
    """Start noting cells; tracking counts from the next cell on (`cell_finished`), not the one running now."""
    uninstall(ipython)
    ipython.ast_transformers.append(NoteCellAccess(tracker))
    tracker.hooked = tracker.untracked_cell = True


def cell_finished(tracker: AccessTracker, at_safe_point: Any) -> None:
    """At a cell's end: its names stop being carried, the end-of-cell safe point runs, and once a whole cell
    has passed through the hook every later one will too (tracking is complete from here)."""
    tracker.finished()
    at_safe_point()
    tracker.attached = tracker.hooked


def uninstall(ipython: Any) -> None:
    """Stop noting cells (the trackers left behind see nothing more, so count everything as touched)."""
    for hook in [t for t in ipython.ast_transformers if isinstance(t, NoteCellAccess)]:
        hook.tracker.hooked = hook.tracker.attached = False
        ipython.ast_transformers.remove(hook)
