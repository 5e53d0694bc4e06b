"""A storage URL whose fsspec backend is missing or too old: one line naming the extra to install."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.process  # every test here starts a process (a kernel, server or command)


def cli_with(shadow: Path, *args: str) -> subprocess.CompletedProcess:
    """The CLI in a process where the packages under `shadow` stand in front of the installed ones."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(shadow), os.environ.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, "-m", "spotwarp_jupyter.cli", *args], capture_output=True, text=True,
                          env=env, timeout=120)


@pytest.mark.parametrize("url, module, extra", [("gs://bucket/sw", "gcsfs", "gcs"), ("s3://bucket/sw", "s3fs", "s3")])
def test_missing_backend_names_the_extra(tmp_path: Path, url: str, module: str, extra: str):
    (tmp_path / module).mkdir()
    (tmp_path / module / "__init__.py").write_text(f"raise ModuleNotFoundError(\"No module named '{module}'\")\n")
    out = cli_with(tmp_path, "list", "--project-id", "proj", "--storage", url)
    assert out.returncode == 1, out
    assert out.stderr.strip().splitlines() == [
        f"spotwarp list: {url.split(':')[0]}:// storage needs {module}, which is not installed: "
        f"pip install \"spotwarp-jupyter[{extra}]\""
    ], out.stderr


def test_backend_from_before_aiobotocore_is_refused(tmp_path: Path):
    (tmp_path / "s3fs").mkdir()
    (tmp_path / "s3fs" / "__init__.py").write_text("__version__ = '0.4.2'\n")  # what a bad resolve once installed
    out = cli_with(tmp_path, "list", "--project-id", "proj", "--storage", "s3://bucket/sw")
    assert out.returncode == 1, out
    assert out.stderr.strip().splitlines() == [
        "spotwarp list: s3:// storage needs s3fs >= 2024.2, found 0.4.2: pip install -U \"spotwarp-jupyter[s3]\""
    ], out.stderr
