"""Providers by name, one module each: `local` (processes on this machine) and `skypilot` (imported only when
asked for)."""

from __future__ import annotations

import importlib
from typing import Any

from ...engine.errors import ConfigError
from ..provider import Provider

PROVIDERS = {
    "local": ("spotwarp_jupyter.failover.providers.local", "LocalProvider"),
    "skypilot": ("spotwarp_jupyter.failover.providers.skypilot", "SkyPilotProvider"),
}


def make_provider(name: str, options: dict[str, Any] | None = None) -> Provider:
    """The provider called `name`, built with `options`; ConfigError (one line) when it is unknown or missing."""
    if name not in PROVIDERS:
        raise ConfigError(f"unknown provider {name!r}: choose among {', '.join(PROVIDERS)}")
    module_name, class_name = PROVIDERS[name]
    try:
        module = importlib.import_module(module_name)
        cls = getattr(module, class_name)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"provider {name!r} is not available here ({type(exc).__name__}: {exc})") from None
    return cls(dict(options or {}))
