"""The project, storage and workspace an engine works on, resolved through `resolver`, and the checks on them."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from .errors import ConfigError
from .resolver import DEFAULT_PROJECT, LOCATION, default_storage, resolve_setting, resolve_settings  # noqa: F401
from .resolver import validate_project_id  # noqa: F401 - its home was here


def hub_environment(env: Mapping[str, str] | None = None) -> Mapping[str, str]:
    """Where the JupyterHub identity comes from: `env` when it names a hub user, else this process's environment.

    The spawner sets `JUPYTERHUB_USER` for the server and so for its kernels and terminals; a caller
    passing its own `env` (the magic does) must not turn `{username}` into someone else's name.
    """
    return env if env is not None and env.get("JUPYTERHUB_USER") else os.environ


def is_remote(url: str) -> bool:
    """Whether a storage URL names shared storage (any fsspec protocol but a local path or file://)."""
    return "://" in url and not url.startswith("file://")


def expand_storage_url(url: str, env: Mapping[str, str] | None = None) -> str:
    """Fill `{username}` and `{server_name}` from the JupyterHub environment; expand `~`; refuse `..`."""
    env = os.environ if env is None else env
    identity = hub_environment(env)
    if not url or not str(url).strip():
        raise ConfigError("storage URL is empty: pass --storage URL or set SPOTWARP_STORAGE")
    url = str(url).strip()
    values = {
        "username": identity.get("JUPYTERHUB_USER", "") or env.get("USER", "") or "user",
        "server_name": identity.get("JUPYTERHUB_SERVER_NAME", "") or "default",
    }
    for key, value in values.items():
        if f"{{{key}}}" in url:
            if not re.fullmatch(r"[A-Za-z0-9._@+-]+", value) or value in (".", ".."):
                raise ConfigError(f"cannot put {key} {value!r} in a storage URL safely")
            url = url.replace(f"{{{key}}}", value)
    if re.search(r"\{[a-z_]+\}", url):
        raise ConfigError(f"storage URL {url!r} has an unknown placeholder: only {{username}} and {{server_name}} are filled")
    if "://" not in url:
        try:
            url = str(Path(url).expanduser().resolve())
        except RuntimeError:  # ~user of no such user
            raise ConfigError(f"storage URL {url!r} starts with the home folder of an unknown user") from None
    elif url.split("://", 1)[0].lower() in ("file", "local") and not url.split("://", 1)[1].startswith("/"):
        # fsspec resolves `file://` and `file://x` against the current folder: refuse rather than write there
        raise ConfigError(f"storage URL {url!r} names no absolute folder: use file:///absolute/path or a plain path")
    elif any(part in (".", "..") for part in url.split("://", 1)[1].split("/")):
        raise ConfigError(f"storage URL {url!r} has a '.' or '..' segment: name the prefix itself")
    return url


def confine_to_user_prefix(url: str, env: Mapping[str, str] | None = None) -> str:
    """Under JupyterHub, refuse a shared-storage URL outside the prefix the deployment gave this user.

    The assigned prefix is `SPOTWARP_STORAGE` (expanded) of the hub-spawned server, which its kernels
    and terminals inherit. Local paths are left to file permissions.
    """
    identity = hub_environment(env)
    if not identity.get("JUPYTERHUB_USER") or not is_remote(url):
        return url
    assigned = identity.get("SPOTWARP_STORAGE") or default_storage()
    root = expand_storage_url(assigned, identity).rstrip("/")
    if not is_remote(root):
        return url
    if url.rstrip("/") != root and not url.startswith(root + "/"):
        raise ConfigError(f"storage {url} is outside your prefix {root}: on JupyterHub, "
                          f"SpotWarp stores {identity['JUPYTERHUB_USER']}'s snapshots only under it")
    return url


def parse_storage_options(text: str | None) -> dict[str, Any]:
    """The JSON object of `SPOTWARP_STORAGE_OPTIONS`, passed to fsspec."""
    return resolve_setting("storage_options", env={"SPOTWARP_STORAGE_OPTIONS": text or ""})


@dataclass
class Settings:
    """The project, storage and workspace one engine works on."""

    project: str = DEFAULT_PROJECT
    storage: str = field(default_factory=default_storage)
    storage_options: dict[str, Any] = field(default_factory=dict)
    workspace: str | None = None

    @classmethod
    def resolve(
        cls,
        project: str | None = None,
        storage: str | None = None,
        storage_options: dict[str, Any] | None = None,
        workspace: str | None = None,
        config: Mapping[str, Any] | None = None,
        env: Mapping[str, str] | None = None,
        defaults: Mapping[str, Any] | None = None,
    ) -> "Settings":
        """Strongest first: explicit arguments (flags), environment, `config` (config files), `defaults`, built-ins."""
        env = os.environ if env is None else env
        flags = {"project": project, "storage": storage, "storage_options": storage_options, "workspace": workspace}
        values = resolve_settings(LOCATION, flags=flags, env=env, config=config, defaults=defaults)
        storage_url = expand_storage_url(values["storage"], env)
        if storage not in (None, ""):  # a flag or the magic: under JupyterHub it may not leave the user's prefix
            storage_url = confine_to_user_prefix(storage_url, env)
        workspace_value = values["workspace"]
        return cls(
            project=values["project"],
            storage=storage_url,
            storage_options=values["storage_options"],
            workspace=str(Path(workspace_value).expanduser().resolve()) if workspace_value else None,
        )
