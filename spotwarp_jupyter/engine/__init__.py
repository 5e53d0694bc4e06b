"""The SpotWarp snapshot engine: capture, serialize, store and restore, with no Jupyter imports.

The kernel extension, the server and the CLI all drive this one engine (`SnapshotEngine`, snapshots.py).
Its parts, top to bottom (each imports only the ones below it; pyproject.toml's import-linter contract):

  snapshots   SnapshotEngine: the one commit path, restore, verify and gc entry points
  writers     who stores a captured image while the kernel runs on: forked, thread, staged
  prune       gc: old snapshots, then unnamed objects;   verify: re-read and re-hash
  variables   capture, grouping, save, load, progressive restore of kernel variables
  files       workspace backup and restore, ignore rules, link safety
  journal     events across hosts, and the report read from them
  pickling    the stream format of one variable group (its rebuilders' names are part of the format)
  incremental which names code could have touched; reuse of untouched groups
  coordination write locks, the failover lease and fence, heartbeats
  manifests   the manifest, its signature and scope, environment facts, the catalog of snapshots
  storage     the fsspec store: content-addressed objects, records, durable local writes, retries
  settings, pages, hashing, records, units, errors   the base every part may use (records: typed group records)

docs/architecture.md walks a snapshot through them; docs/design.md specifies the store's formats.
"""

from .coordination.head import RolledBack
from .errors import (
    ConfigError,
    DamagedObjectError,
    ManifestError,
    SignatureError,
    SnapshotNotFound,
    SpotWarpError,
    StorageError,
)
from .manifests import Manifest
from .settings import Settings
from .snapshots import DEFAULT_NOTEBOOK, GcReport, SnapshotEngine, VerifyReport
from .variables import CaptureOptions

__all__ = [
    "CaptureOptions", "ConfigError", "DamagedObjectError", "DEFAULT_NOTEBOOK", "GcReport", "Manifest",
    "ManifestError", "RolledBack", "Settings", "SignatureError", "SnapshotEngine", "SnapshotNotFound", "SpotWarpError",
    "StorageError", "VerifyReport",
]
