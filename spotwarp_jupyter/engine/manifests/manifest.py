"""The manifest: a small JSON record that names every object of one snapshot. Writing it is the commit."""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import threading
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Mapping

from ..errors import ManifestError, SignatureError, SnapshotNotFound, UnreadableManifest
from ..records import stored_objects
from ..signing import key_advice, key_id, signing_key  # noqa: F401 - signing_key re-exported (engine.manifests)
from .files_record import stored_form
from .scope import check_scope

FORMAT = 1  # files inline
FORMAT_FILES_RECORD = 2  # files' entries in an object the manifest names (files_record.py): a reader knowing
# only format 1 refuses it rather than seeing a snapshot without files
FORMATS = (FORMAT, FORMAT_FILES_RECORD)
_ID_ALPHABET = "abcdefghijkmnpqrstuvwxyz23456789"


def new_snapshot_id() -> str:
    """A short random id, easy to type (no 0/o/1/l)."""
    return "".join(secrets.choice(_ID_ALPHABET) for _ in range(8))


_TRUST_WARNING = (
    "restoring a snapshot runs pickle code from storage, and SPOTWARP_KEY is not set, so nothing checks who "
    "wrote it: set SPOTWARP_KEY (the same secret on every host of the project) to sign snapshots and refuse others"
)
_trust_warned = False
_trust_lock = threading.Lock()


def trust_warning(key: bytes | None) -> str | None:
    """The warning to show before the first restore without a key in this process; None after that or with a key."""
    global _trust_warned
    if key:
        return None
    with _trust_lock:
        if _trust_warned:
            return None
        _trust_warned = True
    return _TRUST_WARNING


def _canonical(body: dict[str, Any]) -> bytes:
    # a file name that is not UTF-8 arrives as lone surrogates (os.fsdecode): "surrogatepass" gives them bytes
    # of their own; every other string encodes exactly as plain UTF-8, so existing checksums still hold
    return _canonical_text(body).encode("utf-8", "surrogatepass")


def _canonical_text(body: dict[str, Any]) -> str:
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


INDENTED_BELOW = 256 * 1024  # a larger manifest (a workspace of many files) is stored as its compact canonical
# text: indenting runs json's pure-Python encoder, 30x slower than the compact one on a 10,000-file manifest


def _plain_utf8(text: str) -> bool:
    """No lone surrogates (a file name that is not UTF-8), which the stored document writes as \\u escapes."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _document(doc: dict[str, Any]) -> bytes:
    """The stored JSON: readable UTF-8, or \\u escapes throughout when a string is not valid text."""
    text = json.dumps(doc, sort_keys=True, indent=1, ensure_ascii=False)
    try:
        return text.encode()
    except UnicodeEncodeError:
        return json.dumps(doc, sort_keys=True, indent=1).encode()


@dataclass
class Manifest:
    """One committed snapshot: who, when, what it holds, and the objects it names."""

    id: str
    project: str
    created: float
    host: str
    kind: str = "kernel"
    message: str | None = None
    parent: str | None = None
    kernels: dict[str, Any] = field(default_factory=dict)
    files: dict[str, Any] = field(default_factory=dict)
    env: dict[str, Any] = field(default_factory=dict)
    stats: dict[str, Any] = field(default_factory=dict)
    objects: dict[str, int] = field(default_factory=dict)
    signed: bool = False
    # where a signature is valid (project, storage location, hub user): inside what is signed
    scope: dict[str, Any] | None = None
    generation: int = 0  # the writer's lease generation (0: no failover); `latest` never goes to a lower one
    holder: str | None = None  # the writer's candidate id under failover
    requests: list[str] = field(default_factory=list)  # ids of the requests this snapshot answers (protocol.py)
    # a collective snapshot of a `resumable` loop over torch.distributed ranks: its DCP files and each rank's
    # position, as objects (kind "collective"; docs/distributed.md)
    collective: dict[str, Any] = field(default_factory=dict)

    @property
    def order(self) -> tuple[int, float, str]:
        """Sort key of `latest`: generation first, so a fenced-off writer's late snapshot never wins."""
        return (self.generation, self.created, self.id)

    @property
    def name(self) -> str:
        """The stored file name; sorting names sorts snapshots by creation time."""
        stamp = datetime.fromtimestamp(self.created, timezone.utc).strftime("%Y%m%dT%H%M%S")
        millis = int(self.created * 1000) % 1000
        return f"{stamp}{millis:03d}Z-{self.id}.json"

    @property
    def created_iso(self) -> str:
        return datetime.fromtimestamp(self.created, timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")

    @property
    def size(self) -> int:
        """Bytes of all objects this snapshot names (its restorable size)."""
        return sum(self.objects.values())

    def body(self) -> dict[str, Any]:
        files, objects = stored_form(self.files, self.objects)
        body = {
            "format": FORMAT_FILES_RECORD if files is not self.files else FORMAT,
            "id": self.id,
            "project": self.project,
            "created": self.created_iso,
            "created_ts": self.created,
            "host": self.host,
            "kind": self.kind,
            "message": self.message,
            "parent": self.parent,
            "kernels": self.kernels,
            "files": files,
            "env": self.env,
            "stats": self.stats,
            "objects": objects,
            **({"generation": self.generation} if self.generation else {}),
            **({"holder": self.holder} if self.holder else {}),
            **({"requests": list(self.requests)} if self.requests else {}),
            **({"collective": self.collective} if self.collective else {}),
        }
        if self.scope is not None:
            body["scope"] = self.scope
        return body

    def to_bytes(self, key: bytes | None = None) -> bytes:
        """Serialized manifest with a checksum (catches truncation) and, with a key, an HMAC."""
        body = self.body()
        text = _canonical_text(body)
        payload = text.encode("utf-8", "surrogatepass")
        seals = {"checksum": hashlib.sha256(payload).hexdigest()}
        if key:
            seals["signature"] = hmac.new(key, payload, hashlib.sha256).hexdigest()
            seals["key_id"] = key_id(key)
        if len(text) >= INDENTED_BELOW and _plain_utf8(text):
            # large (a workspace of many files): the canonical text itself, the seals put in front, one encoding
            return json.dumps(seals, sort_keys=True)[:-1].encode() + b"," + payload[1:]
        return _document({**body, **seals})

    @classmethod
    def from_bytes(cls, data: bytes, name: str = "?", key: bytes | None = None, require_signature: bool = False,
                   scope: dict[str, Any] | None = None) -> "Manifest":
        """Parse and check a stored manifest; raise ManifestError/SignatureError when it cannot be trusted.

        With a key and `scope`, a signed manifest must have been signed for that scope (see engine.scope).
        """
        doc = _parse(data, name)
        checksum = doc.pop("checksum", None)
        signature = doc.pop("signature", None)
        signer = doc.pop("key_id", None)
        payload = _canonical(doc)
        if key:
            # the signature is checked before the checksum: a forger can recompute a checksum, not an HMAC
            _check_signature(doc.get("id", name), payload, signature, signer, key, require_signature)
            if signature is not None and scope is not None:
                check_scope(doc.get("id", name), doc.get("scope"), scope)
        if checksum != hashlib.sha256(payload).hexdigest():
            raise ManifestError(f"snapshot manifest {name} fails its checksum (damaged or altered)")
        for record in ("kernels", "files", "env", "stats", "objects", "collective"):
            if not isinstance(doc.get(record) or {}, dict):
                raise ManifestError(f"snapshot manifest {name}: its {record!r} record is malformed")
        requests = doc.get("requests") or []
        if not isinstance(requests, list) or not all(isinstance(r, str) for r in requests):
            raise ManifestError(f"snapshot manifest {name}: its 'requests' record is malformed")
        try:
            return cls._from_document(doc, signed=signature is not None, requests=list(requests))
        except (KeyError, TypeError, ValueError) as exc:
            raise ManifestError(f"snapshot manifest {name} is missing field {exc}") from None

    @classmethod
    def _from_document(cls, doc: dict[str, Any], signed: bool, requests: list[str]) -> "Manifest":
        return cls(
            id=doc["id"],
            project=doc["project"],
            created=float(doc["created_ts"]),
            host=doc.get("host", "?"),
            kind=doc.get("kind", "kernel"),
            message=doc.get("message"),
            parent=doc.get("parent"),
            kernels=doc.get("kernels") or {},
            files=doc.get("files") or {},
            env=doc.get("env") or {},
            stats=doc.get("stats") or {},
            objects={str(k): int(v) for k, v in (doc.get("objects") or {}).items()},
            signed=signed,
            scope=doc.get("scope"),
            generation=int(doc.get("generation") or 0),
            holder=doc.get("holder"),
            requests=requests,
            collective=doc.get("collective") or {},
        )


def _parse(data: bytes, name: str) -> dict[str, Any]:
    """The JSON document of a stored manifest of this format, or ManifestError."""
    try:
        doc = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        raise UnreadableManifest(f"snapshot manifest {name} is not valid JSON (damaged or half-written)") from None
    if not isinstance(doc, dict) or doc.get("format") not in FORMATS:
        raise UnreadableManifest(f"snapshot manifest {name} has an unknown format")
    return doc


def _check_signature(ident: str, payload: bytes, signature: Any, signer: Any, key: bytes,
                     require_signature: bool) -> None:
    """Refuse an unsigned manifest where one is required, one signed with another key, or one altered."""
    if signature is None:
        if require_signature:
            raise SignatureError(
                f"snapshot {ident} is unsigned, but SPOTWARP_KEY is set here: refusing to load it "
                "(it was written by a host without the key, or by someone else)"
            )
        return
    if isinstance(signature, str) and hmac.compare_digest(signature, hmac.new(key, payload, hashlib.sha256).hexdigest()):
        return
    if signer is not None and signer != key_id(key):
        raise SignatureError(
            f"snapshot {ident} is signed with another key (key id {signer}, this host's is {key_id(key)}): "
            f"refusing to load it; {key_advice()}"
        )
    raise SignatureError(f"snapshot {ident} was altered after it was signed: refusing to load it")


def record_objects(record: Mapping[str, Any]) -> dict[str, int]:
    """Every object a kernel record's groups name, with its size (a group otherwise unreadable included)."""
    out: dict[str, int] = {}
    for group in record.get("groups") or ():
        out.update(stored_objects(group))
    return out


def committed_kernel_record(listing: list[Manifest], snapshot_id: str, notebook: str) -> dict[str, Any]:
    """The kernel record of `notebook` in snapshot `snapshot_id` of `listing` (what a kernel just committed)."""
    manifest = next((m for m in listing if m.id == snapshot_id), None)
    if manifest is None:
        raise SnapshotNotFound(f"no snapshot {snapshot_id!r} holding {notebook!r}: it was removed before the commit")
    if notebook not in manifest.kernels:
        raise SnapshotNotFound(f"snapshot {manifest.id} holds no kernel state of {notebook!r}")
    return manifest.kernels[notebook]


def newest_kernel_records(listing: list[Manifest]) -> dict[str, dict[str, Any]]:
    """Every notebook's newest kernel state in `listing` (newest first, as `engine.manifests()`).

    Among the records of one kernel run, newest by the instant of the state (`state_at`): a snapshot may
    commit after a later one (a writer that took longer), and a project snapshot naming it would move training
    back. Across runs (another host, a restarted kernel) the commit order stands: clocks may differ."""
    out: dict[str, dict[str, Any]] = {}
    for manifest in listing:
        for notebook, record in manifest.kernels.items():
            if notebook not in out or newer_state(record, out[notebook]):
                out[notebook] = record
    return out


def newer_state(record: dict[str, Any], than: dict[str, Any]) -> bool:
    """Whether kernel `record` holds state its kernel run took after `than`'s (False when another run took
    `than`, or either does not say when)."""
    a, b = record.get("state_at"), than.get("state_at")
    run = record.get("kernel_run")
    return (isinstance(run, str) and run == than.get("kernel_run") and isinstance(a, (int, float))
            and isinstance(b, (int, float)) and a > b)
