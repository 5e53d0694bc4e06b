"""Typed group records: how a kernel record names one variable group's objects (docs/design.md).

A group record is stored as JSON inside the manifest's kernel record:
`{"names", "types", "codec", "requires", "pickle": ref, "buffers": [{"size", "chunks": [ref, ...]}]}`,
each ref `{"id", "size"}` (records written with an xxh3 digest also hold `"fp"`). `from_dict` reads that
shape and `to_dict` gives it back unchanged, keys it does not know included: a record taken over as it is
(a reused group, a carried damaged one) reaches the next manifest exactly as it was stored.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Iterable, Mapping

from .errors import ManifestError

_NONE: Mapping[str, Any] = MappingProxyType({})


class MalformedRecord(ManifestError):
    """A stored group record lacks a field it needs, or holds one of the wrong kind."""


def _extra(doc: Mapping[str, Any], known: frozenset[str]) -> Mapping[str, Any]:
    """The keys of `doc` a record does not know, kept to be written back as they are (usually none)."""
    return _NONE if doc.keys() <= known else {k: v for k, v in doc.items() if k not in known}


_REF_KEYS = frozenset(("id", "size", "fp"))
_BUFFER_KEYS = frozenset(("size", "chunks"))
_GROUP_KEYS = frozenset(("names", "types", "codec", "requires", "pickle", "buffers"))
_OPTIONAL = ("types", "requires", "buffers")  # read as empty when a stored record lacks them


@dataclass(frozen=True)
class ObjectRef:
    """One stored object a record names: its id (blake3 of its bytes) and size."""

    id: str
    size: int
    fp: str | None = None  # the xxh3 digest older records carry; content is never known again by it
    extra: Mapping[str, Any] = field(default_factory=lambda: _NONE)

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> "ObjectRef":
        """The ref stored as `doc`."""
        oid = doc["id"]
        if not isinstance(oid, str):
            raise TypeError(f"object id {oid!r} is not a string")
        return cls(oid, int(doc["size"]), doc.get("fp"), _extra(doc, _REF_KEYS))

    def to_dict(self) -> dict[str, Any]:
        """The stored form."""
        out: dict[str, Any] = {"size": self.size, "id": self.id}
        if self.fp is not None:
            out["fp"] = self.fp
        out.update(self.extra)
        return out


@dataclass(frozen=True)
class BufferRecord:
    """One out-of-band buffer of a group: its size and the chunks it is stored as, in order."""

    size: int
    chunks: tuple[ObjectRef, ...]
    extra: Mapping[str, Any] = field(default_factory=lambda: _NONE)

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> "BufferRecord":
        """The buffer stored as `doc`."""
        return cls(int(doc["size"]), tuple(ObjectRef.from_dict(c) for c in doc["chunks"]),
                   _extra(doc, _BUFFER_KEYS))

    def to_dict(self) -> dict[str, Any]:
        """The stored form."""
        return {"size": self.size, "chunks": [c.to_dict() for c in self.chunks], **self.extra}


@dataclass(frozen=True)
class GroupRecord:
    """Variables stored together: one pickle stream plus the buffers it hands over out of band.

    `requires`: names of notebook definitions the stream refers to by name (restored first).
    """

    names: tuple[str, ...]
    types: Mapping[str, str]
    codec: str
    requires: tuple[str, ...]
    pickle: ObjectRef
    buffers: tuple[BufferRecord, ...] = ()
    extra: Mapping[str, Any] = field(default_factory=lambda: _NONE)
    absent: tuple[str, ...] = ()  # of `_OPTIONAL`, the keys its stored form lacks (read as empty)

    @classmethod
    def from_dict(cls, doc: Any) -> "GroupRecord":
        """The group stored as `doc`; MalformedRecord when it is not one."""
        try:
            names = doc["names"]
            if isinstance(names, str) or not all(isinstance(n, str) for n in names):
                raise TypeError("its names are not a list of strings")
            return cls(tuple(names), dict(doc.get("types") or {}), str(doc["codec"]),
                       tuple(doc.get("requires") or ()), ObjectRef.from_dict(doc["pickle"]),
                       tuple(BufferRecord.from_dict(b) for b in doc.get("buffers") or ()),
                       _extra(doc, _GROUP_KEYS), tuple(k for k in _OPTIONAL if k not in doc))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise MalformedRecord(f"a variable group record is malformed ({type(exc).__name__}: {exc})") from None

    def to_dict(self) -> dict[str, Any]:
        """The stored form, as `from_dict` read it."""
        out = {
            "names": list(self.names),
            "types": dict(self.types),
            "codec": self.codec,
            "requires": list(self.requires),
            "pickle": self.pickle.to_dict(),
            "buffers": [b.to_dict() for b in self.buffers],
            **self.extra,
        }
        for key in self.absent:
            out.pop(key, None)
        return out

    def refs(self) -> list[ObjectRef]:
        """Every object the group names: its stream, then each buffer's chunks (an object may recur)."""
        return [self.pickle, *(c for b in self.buffers for c in b.chunks)]

    def objects(self) -> dict[str, int]:
        """object id -> size of every object the group names."""
        return {ref.id: ref.size for ref in self.refs()}

    @property
    def nbytes(self) -> int:
        """Bytes its objects hold: its pickle stream and its buffers."""
        return self.pickle.size + sum(b.size for b in self.buffers)


def group_records(record: Mapping[str, Any]) -> list[GroupRecord]:
    """The groups of a stored kernel record, in order; MalformedRecord when one is not a group record."""
    return [GroupRecord.from_dict(g) for g in record.get("groups") or ()]


def readable_groups(groups: Iterable[Any]) -> list[GroupRecord]:
    """The group records among stored `groups` that can be read, in order (for what only counts or reuses
    them: a group that cannot be read is serialized again, or restored by nobody)."""
    out = []
    for doc in groups:
        try:
            out.append(GroupRecord.from_dict(doc))
        except MalformedRecord:
            continue
    return out


def stored_objects(doc: Mapping[str, Any]) -> dict[str, int]:
    """object id -> size of every object a stored group names, read from its refs alone: a group whose other
    fields cannot be read (a restore refuses it) still has its objects named in the manifests that carry it,
    so their presence checks and verify still cover them."""
    refs = [doc.get("pickle") or {}, *(c for b in doc.get("buffers") or () for c in b.get("chunks") or ())]
    return {ref["id"]: int(ref["size"]) for ref in refs if ref.get("id")}
