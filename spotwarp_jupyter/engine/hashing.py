"""Content hashes: blake3 names stored objects (tamper-evident); xxh3 spots changes cheaply."""

from __future__ import annotations

import re

import blake3
import xxhash

Buffer = bytes | bytearray | memoryview


def object_id(data: Buffer) -> str:
    """The content address of `data`: its blake3 digest in hex."""
    # blake3 releases the GIL on large inputs, so writer threads hash in parallel.
    return blake3.blake3(data).hexdigest()


def object_hasher() -> "blake3.blake3":
    """An incremental hasher whose hexdigest() is the object id of everything fed to update()."""
    return blake3.blake3()


def fingerprint(data: Buffer) -> str:
    """A fast change-detection digest (xxh3-128); not a security boundary."""
    return xxhash.xxh3_128_hexdigest(data)


_OBJECT_ID = re.compile("[0-9a-f]{64}")


def is_object_id(text: str) -> bool:
    """True when `text` has the shape of an object id (64 lowercase hex digits)."""
    return len(text) == 64 and _OBJECT_ID.fullmatch(text) is not None
