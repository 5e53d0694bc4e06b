"""Heartbeats: each server writes `{storage}/{project}/hosts/<id>.json` every few seconds; the orchestrator reads them.

A heartbeat says who the host is (candidate id, generation), its role under the lease (standby, serving,
holder, fenced), whether it serves, the restore it did at start and where it listens. No Jupyter imports.
"""

from __future__ import annotations

import json
import logging
import math
import re
import socket
import time
from typing import Any, Callable

from ..errors import ConfigError
from ..signing import RecordRefused, check_record, sign_record, signing_key
from ..storage import Layout, Store
from .fence import ROLES, validate_candidate_id

_NONCE = re.compile(r"^[0-9a-f]{8,32}$")
MAX_HOSTS = 1000  # heartbeats read by one listing at most
MAX_HEARTBEAT_BYTES = 64 * 1024  # a heartbeat is well under 2 KB: a bigger file is skipped, never read whole

log = logging.getLogger("spotwarp")


def host_id(candidate: str | None, port: int | None) -> str:
    """The name a host's heartbeat goes under: its candidate id, else host name and port."""
    if candidate:
        return candidate
    name = "".join(c if c.isalnum() or c in "._-" else "-" for c in socket.gethostname())[:48] or "host"
    return f"{name}-{port or 0}"


def heartbeat_path(store: Store, ident: str) -> str:
    return store.record_path(Layout.HOSTS, f"{validate_candidate_id(ident)}.json")


def write_heartbeat(store: Store, doc: dict[str, Any], key: bytes | None = None) -> None:
    """Write one heartbeat, signed with the key (SPOTWARP_KEY when not given) if there is one (blocking I/O: call
    it from a thread)."""
    store.write_record(heartbeat_path(store, doc["id"]), _signed(store, doc, f"{Layout.HOSTS}/{doc['id']}.json", key))


def _signed(store: Store, doc: dict[str, Any], name: str, key: bytes | None) -> bytes:
    key = key if key is not None else signing_key()
    return json.dumps(sign_record(doc, key, store.project, name), sort_keys=True).encode()


def _trusted(store: Store, raw: bytes, name: str, key: bytes | None) -> Any:
    """The JSON record in `raw` when it may be trusted (signed with the key, when there is one); RecordRefused
    or ValueError otherwise."""
    key = key if key is not None else signing_key()
    return check_record(json.loads(raw), key, store.project, name)


_said: set[str] = set()


def _skipped(what: str, why: str) -> None:
    """Log a skipped record once per process and reason (the watch reads heartbeats twice a second)."""
    if (what + why) not in _said:
        _said.add(what + why)
        log.warning("SpotWarp: %s skipped: %s", what, why)


_FIELDS: dict[str, tuple[type, ...]] = {
    "id": (str,), "candidate": (str, type(None)), "generation": (int,), "state": (str,), "time": (int, float),
    "beat": (int,), "interval": (int, float), "ready": (bool,), "ready_at": (int, float, type(None)),
    "started_at": (int, float, type(None)), "pid": (int,), "port": (int, type(None)), "url": (str, type(None)),
    "host": (str,), "why": (str, type(None)), "restore": (dict, type(None)), "lease_lost": (bool,),
}
_REQUIRED = ("id", "generation", "state", "time")


def valid_heartbeat(doc: Any, ident: str | None = None) -> dict[str, Any] | None:
    """`doc` when it is a well-formed heartbeat (of `ident` when given), else None: bad content is no news."""
    if not isinstance(doc, dict) or any(k not in doc for k in _REQUIRED):
        return None
    for key, types in _FIELDS.items():
        value = doc.get(key)
        if key in doc and (not isinstance(value, types) or (isinstance(value, bool) and bool not in types)):
            return None
        if isinstance(value, float) and not math.isfinite(value):
            return None
    if doc["generation"] < 0 or (ident is not None and doc["id"] != ident):
        return None
    if doc["state"] not in ROLES:
        return None
    return doc


def read_heartbeat(store: Store, ident: str, key: bytes | None = None) -> dict[str, Any] | None:
    """The newest heartbeat of host `ident`, None when it never wrote one, or it is damaged, torn or too big, or
    (with a key: SPOTWARP_KEY when not given) not signed with it: someone else's is no news."""
    try:
        raw = store.read_record(heartbeat_path(store, ident), limit=MAX_HEARTBEAT_BYTES)
        if raw is None:
            return None
        doc = valid_heartbeat(_trusted(store, raw, f"{Layout.HOSTS}/{ident}.json", key), ident)
    except RecordRefused as exc:
        _skipped(f"heartbeat of {ident}", str(exc))
        return None
    except (ValueError, UnicodeDecodeError, RecursionError):
        doc = None
    if doc is None:
        _skipped(f"heartbeat of {ident}", "damaged")
    return doc


def heartbeat_ids(store: Store) -> list[str]:
    """The ids of every heartbeat file in `hosts/` (stray files, bad names and temporaries left out)."""
    return record_ids(store, Layout.HOSTS, "listing hosts", _is_candidate_id)


def record_ids(store: Store, area: str, what: str, accept: Callable[[str], bool]) -> list[str]:
    """The sorted ids of the `<id>.json` records in an area of the project (a `Layout` name) that `accept`
    takes; temporaries and stray files are left out (never a reason to refuse the list), a missing area holds none."""
    names = store.record_names(store.record_path(area), what)
    ids = (name[:-5] for name in names if name.endswith(".json"))
    return sorted(ident for ident in ids if ".tmp-" not in ident and accept(ident))


def _is_candidate_id(ident: str) -> bool:
    try:
        validate_candidate_id(ident)
    except ConfigError:
        return False
    return True


def request_path(store: Store, ident: str) -> str:
    return store.record_path(Layout.REQUESTS, f"{validate_candidate_id(ident)}.json")


def write_request(store: Store, ident: str, doc: dict[str, Any]) -> None:
    """Ask host `ident` for something on its next beat (`spotwarp launch --replace`: a final snapshot); signed."""
    store.write_record(request_path(store, ident), _signed(store, doc, f"{Layout.REQUESTS}/{ident}.json", None))


def read_request(store: Store, ident: str) -> dict[str, Any] | None:
    """The request waiting for host `ident`, None when there is none, it is unreadable or (with a key) unsigned."""
    try:
        raw = store.read_record(request_path(store, ident), limit=4096)
        doc = _trusted(store, raw, f"{Layout.REQUESTS}/{ident}.json", None) if raw is not None else None
    except RecordRefused as exc:
        _skipped(f"request for {ident}", str(exc))
        return None
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None
    ok = isinstance(doc, dict) and isinstance(doc.get("request"), str) and _NONCE.match(doc["request"]) \
        and isinstance(doc.get("generation"), int)
    return doc if ok else None


def delete_request(store: Store, ident: str) -> None:
    store.delete_record(request_path(store, ident), "removing a request")


def stale_after(doc: dict[str, Any]) -> float:
    """Seconds after which `spotwarp hosts` shows a heartbeat as stale: three beats, at least 30 s."""
    return max(30.0, 3 * float(doc.get("interval") or 5.0))


def delete_heartbeat(store: Store, ident: str) -> None:
    """Remove one host's heartbeat file (gone already is fine)."""
    store.delete_record(heartbeat_path(store, ident), "removing a heartbeat")


def heartbeat_modified(store: Store, ident: str) -> float | None:
    """When the store says the heartbeat file was last written (epoch seconds), None if unknown."""
    return store.record_modified(heartbeat_path(store, ident), "checking a heartbeat")


def read_heartbeats(store: Store, limit: int = MAX_HOSTS) -> list[dict[str, Any]]:
    """Every host's newest well-formed heartbeat (at most `limit`), the most recent first."""
    out = []
    for ident in heartbeat_ids(store)[:limit]:
        doc = read_heartbeat(store, ident)
        if doc is not None:
            out.append(doc)
    return sorted(out, key=lambda d: -float(d["time"]))


def age(doc: dict[str, Any] | None, now: float | None = None) -> float | None:
    """Seconds since the heartbeat was written."""
    if doc is None:
        return None
    return max(0.0, (time.time() if now is None else now) - float(doc.get("time") or 0))
