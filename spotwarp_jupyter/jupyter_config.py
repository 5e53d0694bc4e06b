"""The config-file layer of the command line: `c.SpotWarp.*` from the Jupyter config files the server reads."""

from __future__ import annotations

import logging
from typing import Any

from .engine.errors import ConfigError
from .engine.settings import SETTINGS

# the files a `jupyter lab` / `jupyter server` started by `spotwarp start` reads `c.SpotWarp.*` from
CONFIG_FILES = ("jupyter_config", "jupyter_server_config", "jupyter_spotwarp_config")


def server_config_layer() -> dict[str, Any]:
    """The `c.SpotWarp.*` values set in jupyter_server_config.py/.json (and friends) on the Jupyter config path."""
    from jupyter_core.paths import jupyter_config_dir, jupyter_config_path
    from traitlets.config.application import Application

    paths = jupyter_config_path()
    if jupyter_config_dir() not in paths:
        paths.insert(0, jupyter_config_dir())  # as every Jupyter application does
    app = Application(log=logging.getLogger("spotwarp.config"), raise_config_file_errors=True)
    for name in CONFIG_FILES:
        try:
            app.load_config_file(name, path=paths)
        except Exception as exc:  # noqa: BLE001 - a config file is user code: say which, in one line
            raise ConfigError(f"cannot read the Jupyter config {name}: {type(exc).__name__}: {exc}") from None
    section = app.config.get("SpotWarp", {})
    return {name: value for name, value in section.items() if name in SETTINGS}
