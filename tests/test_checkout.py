"""The repository builds from a clean checkout: no tracked file is a link into one machine's folders.

A committed link (a shared `node_modules` pointing at a developer's checkout) builds wherever that
folder exists and fails everywhere else, in CI first.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.process  # every test here starts a process (a kernel, server or command)

ROOT = Path(__file__).resolve().parent.parent
UNTRACKED = {".git", ".venv"}


def _tracked_links() -> list[str]:
    listed = subprocess.run(
        ["git", "ls-files", "-s"], cwd=ROOT, capture_output=True, text=True, check=False
    )
    if listed.returncode == 0:
        return [line.split("\t", 1)[1] for line in listed.stdout.splitlines() if line.startswith("120000 ")]
    links = []  # not a git checkout (an unpacked source archive): every link in the tree counts
    for folder, dirs, files in os.walk(ROOT):
        dirs[:] = [name for name in dirs if name not in UNTRACKED]
        for name in dirs + files:
            path = Path(folder, name)
            if path.is_symlink():
                links.append(path.relative_to(ROOT).as_posix())
    return links


def test_no_tracked_file_is_a_link():
    assert _tracked_links() == []
