"""Parsing and printing of the durations (`30s`, `5m`, `1h`) and sizes (`512MB`, `8GB`) users type."""

from __future__ import annotations

import re

from .errors import ConfigError

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$", re.IGNORECASE)
_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(b|kb|mb|gb|tb|kib|mib|gib|tib)?\s*$", re.IGNORECASE)
_SIZE_UNITS = {
    "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
}


def parse_duration(text: str) -> float:
    """Seconds in a duration such as `30s`, `5m`, `1h` (a bare number is seconds)."""
    m = _DURATION.match(str(text))
    if not m:
        raise ConfigError(f"bad duration {text!r}: write it like 30s, 5m or 1h")
    value = float(m.group(1)) * _DURATION_UNITS[(m.group(2) or "s").lower()]
    if value <= 0:
        raise ConfigError(f"bad duration {text!r}: it must be more than zero")
    return value


def parse_size(text: str) -> int:
    """Bytes in a size such as `512MB` or `8GB` (a bare number is bytes)."""
    m = _SIZE.match(str(text))
    if not m:
        raise ConfigError(f"bad size {text!r}: write it like 512MB or 8GB")
    value = int(float(m.group(1)) * _SIZE_UNITS[(m.group(2) or "b").lower()])
    if value <= 0:
        raise ConfigError(f"bad size {text!r}: it must be more than zero")
    return value


def format_size(n: float) -> str:
    """A byte count for people: `1.2 GB`."""
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


def format_duration(seconds: float) -> str:
    """A duration for people: `850 ms`, `12.3 s`, `5m`, `2h 3m`."""
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(int(round(seconds)), 60)
    if minutes < 60:
        return f"{minutes}m {secs}s" if secs else f"{minutes}m"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h {minutes}m" if minutes else f"{hours}h"
