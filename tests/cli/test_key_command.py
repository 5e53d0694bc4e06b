"""`spotwarp key`: the project's key on this host, where it is kept, and how to carry it (docs/threat-model.md)."""

from __future__ import annotations

import json
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from lab_server import host_env

pytestmark = pytest.mark.process  # every test here starts a process (a kernel, server or command)


def key(home: Path, store: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "spotwarp_jupyter.cli", "key", "--project-id", "demo", "--storage",
                           str(store), *args], capture_output=True, text=True, env=host_env(home, **env), timeout=120)


def test_key_shows_the_kept_key_and_how_to_carry_it(tmp_path):
    home, store = tmp_path / "home", tmp_path / "store"
    missing = key(home, store)
    assert missing.returncode == 1 and len(missing.stdout.strip().splitlines()) == 1, missing
    assert "project 'demo'" in missing.stdout and "has no key on this host" in missing.stdout

    created = key(home, store, "--create", "--json")
    assert created.returncode == 0, created.stderr
    shown = json.loads(created.stdout)
    kept = Path(shown["kept_in"])
    assert kept.read_text().strip() == shown["key"] and len(shown["key"]) >= 40
    assert stat.S_IMODE(kept.stat().st_mode) == 0o600 and stat.S_IMODE(kept.parent.stat().st_mode) == 0o700
    assert kept.is_relative_to(home / ".spotwarp" / "keys")

    text = key(home, store).stdout
    assert f"signs with key id {shown['key_id']}" in text and f"export SPOTWARP_KEY='{shown['key']}'" in text
    assert key(home, store, "--create", "--json").stdout == created.stdout  # a kept key is never replaced

    # SPOTWARP_KEY set by hand wins, and says the kept one is overridden
    given = key(home, store, SPOTWARP_KEY="given-by-hand")
    assert "key: given-by-hand" in given.stdout and "which SPOTWARP_KEY overrides" in given.stdout
