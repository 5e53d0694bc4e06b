"""Which notebook a kernel belongs to, and how a snapshot's notebooks are named in messages."""

from __future__ import annotations

import os
from typing import Mapping

from ..engine import Manifest


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


def describe_notebooks(manifest: Manifest) -> str:
    """`notebook 'a.ipynb'` or `notebooks 'a.ipynb', 'b.ipynb'`: whose state a snapshot holds."""
    names = sorted(manifest.kernels)
    return ("notebook " + repr(names[0])) if len(names) == 1 else ("notebooks " + ", ".join(map(repr, names)))
