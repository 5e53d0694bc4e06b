"""The SpotWarp snapshot engine: capture, serialize, store and restore, with no Jupyter imports."""

from .capture import CaptureOptions
from .errors import (
    ConfigError,
    DamagedObjectError,
    ManifestError,
    SignatureError,
    SnapshotNotFound,
    SpotWarpError,
    StorageError,
)
from .manifest import Manifest
from .settings import Settings
from .snapshots import DEFAULT_NOTEBOOK, GcReport, SnapshotEngine, VerifyReport

__all__ = [
    "CaptureOptions", "ConfigError", "DamagedObjectError", "DEFAULT_NOTEBOOK", "GcReport", "Manifest",
    "ManifestError", "Settings", "SignatureError", "SnapshotEngine", "SnapshotNotFound", "SpotWarpError",
    "StorageError", "VerifyReport",
]
