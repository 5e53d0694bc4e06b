"""Reaching SkyPilot: the lazy import and its version check, its errors as one line, valid cluster names.

`sky` is imported only when the provider is used, so the failover package works without it.
"""

from __future__ import annotations

import hashlib
import re
from importlib import metadata
from typing import Any

from ...engine.errors import SpotWarpError

OLDEST_SKYPILOT = (0, 14, 1)
INSTALL_HINT = 'pip install "spotwarp-jupyter[failover]"'
# SkyPilot's CLUSTER_NAME_VALID_REGEX; 35 characters fit every cloud's own name limit (GCP's is the smallest).
_CLUSTER_NAME_MAX = 35


class SkyPilotUnavailable(SpotWarpError):
    """SkyPilot is not installed, too old, or cannot answer; the message is one line."""


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", text)[:3])


def load_sky() -> Any:
    """Import SkyPilot, or raise SkyPilotUnavailable in one line naming the extra to install."""
    wanted = ".".join(map(str, OLDEST_SKYPILOT))
    try:
        import sky  # lazy: the failover package must import without skypilot
    except ImportError:
        raise SkyPilotUnavailable(
            f"the SkyPilot provider needs skypilot >= {wanted}, which is not installed: {INSTALL_HINT}"
        ) from None
    try:
        found = metadata.version("skypilot")
    except metadata.PackageNotFoundError:
        found = str(getattr(sky, "__version__", "0"))
    if _version(found) < OLDEST_SKYPILOT:
        raise SkyPilotUnavailable(
            f"the SkyPilot provider needs skypilot >= {wanted}, found {found}: pip install -U \"spotwarp-jupyter[failover]\""
        )
    return sky


def one_line(exc: BaseException) -> str:
    """A SkyPilot exception as one line: its type and the first non-empty line of its message."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(exc))  # SkyPilot colours its messages
    first = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


def cluster_name(project_id: str, candidate_id: str) -> str:
    """`sw-<project>-<candidate>` made valid for SkyPilot (letters, digits, - _ .; short enough for every cloud)."""
    raw = f"sw-{project_id}-{candidate_id}".lower()
    name = re.sub(r"[^a-z0-9_.-]+", "-", raw)
    name = re.sub(r"-{2,}", "-", name).strip("-_.")
    if len(name) > _CLUSTER_NAME_MAX:
        digest = hashlib.sha1(raw.encode()).hexdigest()[:6]
        name = name[: _CLUSTER_NAME_MAX - 7].rstrip("-_.") + "-" + digest
    return name
