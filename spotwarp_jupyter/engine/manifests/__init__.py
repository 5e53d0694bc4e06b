"""Manifests: the record that names every object of one snapshot, and reading them back trusted.

The manifest format and its signature (manifest), where a signature is valid (scope), the environment facts
recorded with each snapshot (environment), and the catalog of a project's committed snapshots as a reader
sees them: checked, cached, newest first (catalog); a manifest's workspace files as one object it names
(files_record).

May import: storage and the engine's base modules.
"""

from .catalog import ManifestCatalog
from .environment import collect_facts, package_versions, version_warnings
from .files_record import RECORD, record_chunks, with_record
from .manifest import (
    Manifest,
    committed_kernel_record,
    new_snapshot_id,
    newer_state,
    newest_kernel_records,
    record_objects,
    signing_key,
    trust_warning,
)
from .scope import signing_scope

__all__ = [
    "collect_facts", "committed_kernel_record", "RECORD", "record_chunks", "with_record", "Manifest", "ManifestCatalog", "new_snapshot_id",
    "newer_state", "newest_kernel_records", "package_versions", "record_objects", "signing_key", "signing_scope", "trust_warning",
    "version_warnings",
]
