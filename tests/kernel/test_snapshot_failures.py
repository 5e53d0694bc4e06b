"""A snapshot that fails for a reason nobody planned for is one line that says what to do, never a traceback."""

from __future__ import annotations

import re
from pathlib import Path

from engines import make_engine

ROOT = Path(__file__).resolve().parents[2]


def test_numpy_is_a_dependency_of_the_package():
    """torch 2.13 does not require numpy, and a tensor's bytes go through `.numpy()`: the install must bring it."""
    block = re.search(r"^dependencies = \[(.*?)^\]", (ROOT / "pyproject.toml").read_text(), re.S | re.M).group(1)
    names = {re.split(r"[<>=\[;!~ ]", d)[0].lower() for d in re.findall(r'"([^"]+)"', block)}
    assert "numpy" in names


def test_an_unexpected_error_inside_a_snapshot_is_one_line_naming_what_to_do(start_kernel, store_url):
    k = start_kernel("host-a", JPY_SESSION_NAME="train.ipynb")
    # torch without numpy (what `pip install torch` alone gives): `.numpy()` raises RuntimeError
    k.run("import sys; sys.modules['numpy'] = None\nimport torch\nt = torch.ones(3)\n"
          "%load_ext spotwarp\n%spotwarp off")
    ename, evalue, output = k.run_error("%spotwarp snapshot")
    assert ename == "UsageError", (ename, evalue, output)
    assert "\n" not in evalue.strip()
    assert "Traceback" not in output and "File " not in output, output
    assert "Numpy is not available" in evalue and "pip install numpy" in evalue, evalue
    assert "nothing was saved" in evalue
    assert make_engine(store_url).manifests() == []
    # the kernel keeps working; its status names the failure
    assert "Numpy is not available" in k.run("%spotwarp status")
