"""Which notebook a kernel belongs to, and how a snapshot's notebooks are named in messages."""

from __future__ import annotations

import json
import os
from typing import Mapping

from ..engine import Manifest
from ..protocol import notebook_record_path, read_notebook_record


def notebook_name(env: Mapping[str, str] | None = None) -> str:
    """Which notebook this kernel belongs to: `JPY_SESSION_NAME` (set by jupyter_server), else `default`."""
    env = os.environ if env is None else env
    name = (env.get("JPY_SESSION_NAME") or "").strip()
    workspace = (env.get("SPOTWARP_WORKSPACE") or "").strip()
    if name and workspace and os.path.isabs(name):
        # the server passes an absolute path; key notebooks by their place in the workspace, same on every host
        relative = os.path.relpath(os.path.realpath(name), os.path.realpath(workspace))
        if relative != ".." and not relative.startswith(".." + os.sep):
            name = relative.replace(os.sep, "/")
    return name.lstrip("/") if name else "default"


def notebook_from_server() -> str | None:
    """This kernel's notebook as its server last recorded it (server/renames.py), or None: no rename recorded,
    not a kernel of a server running SpotWarp, or not a kernel at all. One small local read, never a wait.

    `JPY_SESSION_NAME` is the notebook's path when the kernel was first started (a restart keeps it); a notebook
    renamed since (JupyterLab asks for a name at the first save, usually before `%load_ext spotwarp`) has
    another one, and the server writes it beside the kernel's connection file.
    """
    try:
        from ipykernel.connect import get_connection_file

        with open(notebook_record_path(get_connection_file()), encoding="utf-8") as f:
            return read_notebook_record(json.load(f))
    except (ImportError, RuntimeError, OSError, ValueError):  # no kernel app, no record, a torn or odd file
        return None


def describe_notebooks(manifest: Manifest) -> str:
    """`notebook 'a.ipynb'` or `notebooks 'a.ipynb', 'b.ipynb'`: whose state a snapshot holds."""
    names = sorted(manifest.kernels)
    return ("notebook " + repr(names[0])) if len(names) == 1 else ("notebooks " + ", ".join(map(repr, names)))
