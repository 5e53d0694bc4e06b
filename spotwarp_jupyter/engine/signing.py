"""The key and signed records: what drives failover (lease entries, heartbeats, events, requests) is signed with
`SPOTWARP_KEY` as manifests are, so a store writer without the key cannot move the lease, fake a host's life
or force a failover (docs/failover.md#what-is-signed).

A record is a small JSON object; signed, it carries `signature` (HMAC-SHA256 over the record without it, bound
to the project and the record's name in the store, so it cannot be copied to another name or project) and
`key_id`. With a key, a record that is unsigned, altered, signed with another key or for another name is
refused (`RecordRefused`); without one, records are written and read unsigned as before.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
from typing import Any, Mapping

from .errors import SpotWarpError

SIGNATURE, KEY_ID = "signature", "key_id"


class RecordRefused(SpotWarpError):
    """A record that must be signed (SPOTWARP_KEY is set) is unsigned, altered or signed with another key."""


def signing_key(env: Mapping[str, str] | None = None) -> bytes | None:
    """The HMAC key from `SPOTWARP_KEY`, if set."""
    value = (env if env is not None else os.environ).get("SPOTWARP_KEY")
    return value.encode() if value else None


def key_id(key: bytes) -> str:
    """A short public name for a signing key, so a refusal can say "another key" rather than "altered"."""
    return hmac.new(key, b"spotwarp key id", hashlib.sha256).hexdigest()[:12]


def _payload(body: Mapping[str, Any], project: str, name: str) -> bytes:
    return json.dumps({"project": project, "name": name, "record": body}, sort_keys=True, separators=(",", ":"),
                      ensure_ascii=True, allow_nan=False).encode()


def sign_record(doc: Mapping[str, Any], key: bytes | None, project: str, name: str) -> dict[str, Any]:
    """`doc` signed for the record `name` of `project` (its path under the project: `lease/....json`); unchanged
    (without signature fields) when there is no key."""
    body = {k: v for k, v in doc.items() if k not in (SIGNATURE, KEY_ID)}
    if not key:
        return body
    return {**body, SIGNATURE: hmac.new(key, _payload(body, project, name), hashlib.sha256).hexdigest(),
            KEY_ID: key_id(key)}


def check_record(doc: Any, key: bytes | None, project: str, name: str) -> dict[str, Any]:
    """The record without its signature fields, when it may be trusted: any record without a key; with one, only
    a record signed with it for `name` of `project`. RecordRefused (one line, why) otherwise."""
    if not isinstance(doc, dict):
        raise RecordRefused(f"{name} is not a JSON object")
    body = {k: v for k, v in doc.items() if k not in (SIGNATURE, KEY_ID)}
    if not key:
        return body
    signature, signer = doc.get(SIGNATURE), doc.get(KEY_ID)
    if signature is None:
        raise RecordRefused(f"{name} is unsigned, but SPOTWARP_KEY is set here: refusing it (written by a host "
                            "without the key, or by someone else)")
    try:
        expected = hmac.new(key, _payload(body, project, name), hashlib.sha256).hexdigest()
    except ValueError:  # not JSON a signer could have written (NaN)
        expected = ""
    if isinstance(signature, str) and hmac.compare_digest(signature, expected):
        return body
    if signer is not None and signer != key_id(key):
        raise RecordRefused(f"{name} is signed with another key (key id {signer}, this host's is {key_id(key)}): "
                            f"refusing it; {key_advice()}")
    raise RecordRefused(f"{name} was altered after it was signed, or signed for another name: refusing it")


def key_advice() -> str:
    """What to do about a record signed with another key: one key per project, or, under JupyterHub (where the
    hub derives each user's key), that only the user's own servers' records load."""
    user = os.environ.get("JUPYTERHUB_USER")
    if user:
        return (f"under JupyterHub each user's servers sign with that user's own key, so only {user}'s own "
                "snapshots load here")
    return "use the same SPOTWARP_KEY on every host of the project"
