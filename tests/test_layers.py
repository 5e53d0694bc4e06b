"""The import layers of pyproject.toml's [tool.importlinter] hold, and a module breaking them is caught.

`lint-imports` also runs in the test command itself (scripts/test.sh); these tests prove the contract can fail:
a copy of the package with one upward import (under TYPE_CHECKING, the kind that crept in before) is refused.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.process  # every test here starts a process (a kernel, server or command)

ROOT = Path(__file__).resolve().parent.parent
LINT = str(Path(sys.executable).with_name("lint-imports"))


def _lint(cwd: Path) -> tuple[int, str]:
    """lint-imports' exit status and its report, whitespace made single (it wraps long contract names)."""
    env = {**os.environ, "PYTHONPATH": str(cwd)}
    done = subprocess.run([LINT, "--config", str(cwd / "pyproject.toml"), "--no-cache"], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)
    return done.returncode, " ".join((done.stdout + done.stderr).split())


def _copy(tmp_path: Path) -> Path:
    shutil.copytree(ROOT / "spotwarp_jupyter", tmp_path / "spotwarp_jupyter",
                    ignore=shutil.ignore_patterns("labextension", "__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path


def test_the_package_keeps_every_contract(tmp_path):
    status, report = _lint(_copy(tmp_path))
    assert status == 0, report
    assert "3 kept, 0 broken" in report


def test_an_upward_import_even_for_a_type_hint_breaks_the_engine_layers(tmp_path):
    root = _copy(tmp_path)
    (root / "spotwarp_jupyter/engine/storage/upward.py").write_text(
        "from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n    from ..snapshots import SnapshotEngine  # noqa: F401\n")
    status, report = _lint(root)
    assert status != 0
    assert "Inside the engine: one package per concept, imports only downward BROKEN" in report
    assert "spotwarp_jupyter.engine.storage.upward -> spotwarp_jupyter.engine.snapshots" in report


def test_a_jupyter_import_in_the_engine_is_forbidden(tmp_path):
    root = _copy(tmp_path)
    (root / "spotwarp_jupyter/engine/files/served.py").write_text("import tornado.web  # noqa: F401\n")
    status, report = _lint(root)
    assert status != 0
    assert "import no Jupyter, IPython, Tornado or failover code BROKEN" in report
    assert "spotwarp_jupyter.engine.files.served -> tornado" in report
