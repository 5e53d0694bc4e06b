"""Where a signature is valid: the project, its storage location, and the hub user it was made for.

A signed manifest records this scope inside what it signs; a host refuses a signed manifest whose
scope is not its own, so a signed snapshot copied to another prefix, project or user is not run.
The scope is what every host of the same project names the same way: a remote URL as written, a local
folder relative to the home folder when it lies under it (hosts have different home folders); a local
folder also matches by its absolute path (the same folder read with another HOME, e.g. by sudo).
"""

from __future__ import annotations

import os
from typing import Any, Mapping

from ..errors import ScopeError
from ..settings import Settings, hub_environment, is_remote

_PROTOCOL_ALIASES = {"gcs": "gs", "s3a": "s3", "local": "file"}


def storage_location(url: str) -> str:
    """The storage URL as every host of the project names it (`s3://bucket/prefix`, `~/.spotwarp/store`)."""
    if is_remote(url):
        protocol, rest = url.split("://", 1)
        protocol = protocol.lower()
        return f"{_PROTOCOL_ALIASES.get(protocol, protocol)}://{rest.strip('/')}"
    path = url.split("://", 1)[1] if url.startswith("file://") else url
    path = os.path.realpath(os.path.expanduser(path))
    home = os.path.realpath(os.path.expanduser("~"))
    relative = os.path.relpath(path, home)
    if relative == ".":
        return "~"
    if relative != ".." and not relative.startswith(".." + os.sep) and not os.path.isabs(relative):
        return "~/" + relative.replace(os.sep, "/")
    return path


def signing_scope(settings: Settings, env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """What a signature made with these settings binds: project, storage location, hub user (or None)."""
    user = hub_environment(env).get("JUPYTERHUB_USER") or None
    scope = {"project": settings.project, "location": storage_location(settings.storage), "user": user}
    if not is_remote(settings.storage):
        scope["path"] = os.path.realpath(os.path.expanduser(settings.storage.removeprefix("file://")))
    return scope


def same_scope(stored: Mapping[str, Any], expected: Mapping[str, Any]) -> bool:
    """Same project and user, and the same store: the same location, or for a local folder the same path."""
    if stored.get("project") != expected.get("project") or stored.get("user") != expected.get("user"):
        return False
    if stored.get("location") == expected.get("location"):
        return True
    return expected.get("path") is not None and stored.get("path") == expected.get("path")


def describe(scope: Mapping[str, Any]) -> str:
    user = scope.get("user")
    return (f"project {scope.get('project')!r} at {scope.get('location')}"
            + (f" for hub user {user!r}" if user else " outside a hub"))


def check_scope(ident: str, stored: Any, expected: Mapping[str, Any]) -> None:
    """Raise SignatureError unless a verified signature's scope is this host's."""
    if stored is None:
        raise ScopeError(
            f"snapshot {ident} is signed but not bound to a storage location (made by an earlier SpotWarp): "
            "refusing it, as it could have been copied from another prefix; restore it with the SpotWarp "
            "that made it, then snapshot again"
        )
    if not isinstance(stored, dict) or not same_scope(stored, expected):
        theirs = describe(stored) if isinstance(stored, dict) else repr(stored)
        raise ScopeError(
            f"snapshot {ident} was signed for {theirs}, but this is {describe(expected)}: refusing it "
            "(a signed snapshot is valid only where it was made; was it copied here?)"
        )
