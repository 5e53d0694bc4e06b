"""The deployment config files in deploy/, loaded as JupyterHub and Jupyter load them (traitlets)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from traitlets.config import Config
from traitlets.config.loader import PyFileConfigLoader

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


def load(name: str, env: dict[str, str] | None = None, monkeypatch: pytest.MonkeyPatch | None = None) -> Config:
    """A config file as Jupyter applications load it (traitlets' Python config loader)."""
    if monkeypatch is not None:
        for key in ("SPOTWARP_HUB_STORAGE", "SPOTWARP_HUB_PASS_ENV", "SPOTWARP_STORAGE_OPTIONS", "SPOTWARP_KEY",
                    "SPOTWARP_HUB_KEY_SECRET"):
            monkeypatch.delenv(key, raising=False)
        for key, value in (env or {}).items():
            monkeypatch.setenv(key, value)
    return PyFileConfigLoader(name, path=str(DEPLOY)).load_config()


def spawner_environment(config: Config) -> dict[str, Any]:
    """`Spawner.environment` as a spawner gets it (the file extends the default with `.update()`)."""
    from jupyterhub.spawner import Spawner

    value = config.Spawner.environment
    default = Spawner.class_traits()["environment"].default()
    return value.get_value(default) if hasattr(value, "get_value") else value
