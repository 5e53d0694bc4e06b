"""The fsspec backend each storage URL scheme needs, the extra that installs it, and the oldest that works."""

from __future__ import annotations

import importlib
import re

from ..errors import StorageError

# scheme -> (module, pip extra, oldest version: older ones predate aiobotocore/aiohttp and misbehave)
BACKENDS: dict[str, tuple[str, str, tuple[int, ...]]] = {
    "gs": ("gcsfs", "gcs", (2024, 2)),
    "gcs": ("gcsfs", "gcs", (2024, 2)),
    "s3": ("s3fs", "s3", (2024, 2)),
    "s3a": ("s3fs", "s3", (2024, 2)),
}


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", text)[:3])


def check_backend(scheme: str) -> None:
    """Raise StorageError, in one line naming the extra to install, if `scheme`'s backend is missing or too old."""
    entry = BACKENDS.get(scheme.lower())
    if entry is None:
        return
    module_name, extra, oldest = entry
    wanted = ".".join(map(str, oldest))
    try:
        module = importlib.import_module(module_name)
    except ImportError:
        raise StorageError(
            f"{scheme}:// storage needs {module_name}, which is not installed: pip install \"spotwarp-jupyter[{extra}]\""
        ) from None
    found = str(getattr(module, "__version__", "0"))
    if _version(found) < oldest:
        raise StorageError(
            f"{scheme}:// storage needs {module_name} >= {wanted}, found {found}: pip install -U \"spotwarp-jupyter[{extra}]\""
        )
