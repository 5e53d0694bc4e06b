"""Build hook: say in one line what is missing before the panel build starts, instead of a stack of tool errors.

The JupyterLab panel (labextension/) is compiled with Node.js >= 20 through `jlpm` (from the
jupyter-builder build requirement) when building from source; a wheel ships it prebuilt.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

PREBUILT = Path("spotwarp_jupyter/labextension/static/style.js")
MIN_NODE = 20


def node_problem() -> str | None:
    """Why the panel cannot be built here, or None."""
    node = shutil.which("node")
    if node is None:
        return "Node.js is not on PATH"
    try:
        out = subprocess.run([node, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        return f"`node --version` failed ({exc})"
    match = re.match(r"v(\d+)", out.strip())
    if not match or int(match.group(1)) < MIN_NODE:
        return f"Node.js {out.strip() or '(unknown version)'} is too old"
    if shutil.which("jlpm") is None:
        return "jlpm is not on PATH (it comes with the jupyter-builder build requirement; with --no-build-isolation install jupyter-builder first)"
    return None


class PanelPrerequisites(BuildHookInterface):
    """Fails the build at once, in one line, when the panel must be compiled and cannot be."""

    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict) -> None:
        if self.target_name not in ("wheel", "sdist") or os.getenv("SKIP_JUPYTER_BUILDER"):
            return
        if version == "standard" and (Path(self.root) / PREBUILT).exists():
            return  # prebuilt (an sdist, or built before): nothing to compile
        problem = node_problem()
        if problem:  # printed alone, no traceback: the build tool shows this one line
            print(
                f"SpotWarp's JupyterLab panel is built from source with Node.js >= {MIN_NODE}, and {problem}: "
                f"install Node.js >= {MIN_NODE} (e.g. `apt-get install nodejs npm`) and retry, "
                "or install the prebuilt wheel, which needs no Node.js",
                file=sys.stderr,
            )
            raise SystemExit(1)
