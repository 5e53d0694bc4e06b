"""The SpotWarp jupyter_server extension (enabled as `spotwarp_jupyter.server`)."""

from __future__ import annotations

from typing import Any

from .._version import __version__  # what `jupyter server extension list` shows

__all__ = ["__version__"]


def _jupyter_server_extension_points() -> list[dict[str, Any]]:
    from .app import SpotWarpApp

    return [{"module": "spotwarp_jupyter.server", "app": SpotWarpApp}]
