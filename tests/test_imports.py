"""The engine imports without Jupyter: the kernel, the server and the CLI share it, and so can any tool."""

from __future__ import annotations

import subprocess
import sys

import pytest

JUPYTER = ("IPython", "ipykernel", "jupyter_server", "jupyter_client", "tornado", "jupyterlab", "anywidget")


@pytest.mark.parametrize("module", ["spotwarp_jupyter.engine", "spotwarp_jupyter.failover",
                                    "spotwarp_jupyter.project", "spotwarp_jupyter.cli", "spotwarp"])
def test_importing_loads_no_jupyter_module(module: str):
    code = (f"import sys, {module}\n"
            f"print(sorted({{m.split('.')[0] for m in sys.modules}} & set({JUPYTER!r})))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]", f"importing {module} loaded {out.stdout.strip()}"
