"""The engine imports without Jupyter: the kernel, the server and the CLI share it, and so can any tool."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.process  # every test here starts a process (a kernel, server or command)

JUPYTER = ("IPython", "ipykernel", "jupyter_server", "jupyter_client", "tornado", "jupyterlab", "anywidget")


@pytest.mark.parametrize("module", ["spotwarp_jupyter.engine", "spotwarp_jupyter.failover", "spotwarp_jupyter.service",
                                    "spotwarp_jupyter.cli", "spotwarp_jupyter.protocol", "spotwarp"])
def test_importing_loads_no_jupyter_module(module: str):
    code = (f"import sys, {module}\n"
            f"print(sorted({{m.split('.')[0] for m in sys.modules}} & set({JUPYTER!r})))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]", f"importing {module} loaded {out.stdout.strip()}"



@pytest.mark.parametrize("module, never", [("spotwarp_jupyter.widget", "spotwarp_jupyter.kernel"),
                                           ("spotwarp_jupyter.kernel.extension", "spotwarp_jupyter.widget"),
                                           ("spotwarp_jupyter.server.watchers", "spotwarp_jupyter.kernel"),
                                           ("spotwarp_jupyter.server.kernel_link", "spotwarp_jupyter.kernel")])
def test_widget_kernel_and_server_share_only_the_protocol(module: str, never: str):
    """The widget and the kernel do not import each other (the kernel shows the widget by a late import),
    and the server imports no kernel module: they talk through spotwarp_jupyter.protocol."""
    code = f"import sys, {module}\nprint(sorted(m for m in sys.modules if m.startswith({never!r})))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]", f"importing {module} loaded {out.stdout.strip()}"
