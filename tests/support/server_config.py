"""The jupyter_server configuration of the in-process (jp_fetch) SpotWarp server tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

EXPORTED = ("SPOTWARP_PROJECT", "SPOTWARP_STORAGE", "SPOTWARP_WORKSPACE", "SPOTWARP_STORAGE_OPTIONS")


def spotwarp_server_config(store_dir: Path, monkeypatch: pytest.MonkeyPatch, key: str | None = None) -> dict[str, Any]:
    """Project `api` in `store_dir`, no automatic backups; signing with `key`, or none (SPOTWARP_KEY unset)."""
    # the extension exports these to its kernels; monkeypatch puts the test process's values back afterwards
    for name in (*EXPORTED, "SPOTWARP_KEY"):
        monkeypatch.setenv(name, "unset")
        monkeypatch.delenv(name)
    if key is not None:
        monkeypatch.setenv("SPOTWARP_KEY", key)  # the server's engine signs with it
    return {
        "ServerApp": {"jpserver_extensions": {"spotwarp_jupyter.server": True}, "allow_root": True},
        "SpotWarp": {"project": "api", "storage": str(store_dir), "backup_interval": 0, "kernel_timeout": 30},
    }
