"""Errors the snapshot engine raises; each message is one line that says what to do next."""

from __future__ import annotations

from typing import Any


class SpotWarpError(Exception):
    """Base class: a failure the user should see as one clear line."""


class ConfigError(SpotWarpError):
    """A setting (flag, environment variable, config value) is malformed."""


class StorageError(SpotWarpError):
    """The storage URL cannot be used (missing, unreachable, not writable)."""


class SnapshotNotFound(SpotWarpError):
    """No snapshot matches the id or name asked for."""


class DamagedObjectError(SpotWarpError):
    """A stored object is missing or does not match its content hash."""

    def __init__(self, object_id: str, detail: str):
        self.object_id = object_id
        self.detail = detail
        super().__init__(f"object {object_id} is damaged: {detail}; the snapshot cannot be trusted (run `spotwarp verify`)")

    def __reduce__(self) -> tuple[Any, tuple[str, str]]:
        return type(self), (self.object_id, self.detail)  # raised again in another process (a rank's peers)


class ManifestError(SpotWarpError):
    """A manifest cannot be read, is malformed, or fails its signature check."""


class SignatureError(ManifestError):
    """A manifest is unsigned, signed with another key, or altered."""


class ScopeError(SignatureError):
    """A manifest signed with this key, but for another project, storage location or user."""


class UnreadableManifest(ManifestError):
    """A manifest is not JSON, or not of a known format: with a key set, someone else's, and skipped."""


def one_line(exc: BaseException) -> str:
    """An exception as one short line: its type and its message."""
    text = " ".join(str(exc).split())
    if len(text) > 300:
        text = text[:297] + "..."
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
