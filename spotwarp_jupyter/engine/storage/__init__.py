"""Storage: one project's area in any fsspec URL, and how bytes get there and back intact.

Content-addressed objects (written once under their blake3 hash, checked on every read), the small records
beside them (manifests, locks, leases, heads, heartbeats, events), local writes made atomic and durable in
batches, retries of transient failures, and the fsspec backend each URL scheme needs. Storage owns the store:
other packages go through `Store`'s public methods and name its areas through `Layout`, never its filesystem.
Knows nothing of snapshots' meaning.

May import: the engine's base modules (errors, hashing, settings, units). Nothing else of the engine.
"""

from .layout import Layout
from .local_files import HOST_TAG, TEMPORARY_GRACE_S, replace_with, write_atomic
from .store import CHUNK_SIZE, MANIFEST_SUFFIX, Store

__all__ = [
    "CHUNK_SIZE", "HOST_TAG", "Layout", "MANIFEST_SUFFIX", "replace_with", "Store", "TEMPORARY_GRACE_S", "write_atomic",
]
