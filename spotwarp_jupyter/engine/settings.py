"""Where settings come from: explicit values, then `SPOTWARP_*` environment variables, then defaults."""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from .errors import ConfigError

DEFAULT_PROJECT = "default"
_PROJECT_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def default_storage() -> str:
    """The local store used when nothing is configured: `~/.spotwarp/store`."""
    return str(Path("~/.spotwarp/store").expanduser())


def validate_project_id(project: str) -> str:
    """Return `project` if it is a safe name (letters, digits, `.`, `_`, `-`), else raise."""
    if not isinstance(project, str) or not _PROJECT_ID.match(project) or ".." in project:
        raise ConfigError(
            f"bad project id {project!r}: use letters, digits, '.', '_' or '-' (at most 128, no '..')"
        )
    return project


def expand_storage_url(url: str, env: Mapping[str, str] | None = None) -> str:
    """Fill `{username}` and `{server_name}` from the JupyterHub environment; expand `~`."""
    env = os.environ if env is None else env
    if not url or not str(url).strip():
        raise ConfigError("storage URL is empty: pass --storage URL or set SPOTWARP_STORAGE")
    url = str(url).strip()
    values = {
        "username": env.get("JUPYTERHUB_USER", "") or env.get("USER", "") or "user",
        "server_name": env.get("JUPYTERHUB_SERVER_NAME", "") or "default",
    }
    for key, value in values.items():
        if f"{{{key}}}" in url:
            if not re.fullmatch(r"[A-Za-z0-9._@+-]+", value) or value in (".", ".."):
                raise ConfigError(f"cannot put {key} {value!r} in a storage URL safely")
            url = url.replace(f"{{{key}}}", value)
    if re.search(r"\{[a-z_]+\}", url):
        raise ConfigError(f"storage URL {url!r} has an unknown placeholder: only {{username}} and {{server_name}} are filled")
    if "://" not in url:
        url = str(Path(url).expanduser().resolve())
    return url


def parse_storage_options(text: str | None) -> dict[str, Any]:
    """The JSON object of `SPOTWARP_STORAGE_OPTIONS`, passed to fsspec."""
    if not text:
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"SPOTWARP_STORAGE_OPTIONS is not valid JSON: {exc.msg} at position {exc.pos}") from None
    if not isinstance(value, dict):
        raise ConfigError("SPOTWARP_STORAGE_OPTIONS must be a JSON object, e.g. {\"anon\": false}")
    return value


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
    ) -> "Settings":
        """Strongest first: explicit arguments, environment, `config` (traitlets values), defaults."""
        env = os.environ if env is None else env
        config = config or {}

        def pick(explicit: Any, env_name: str, config_name: str) -> Any:
            if explicit not in (None, ""):
                return explicit
            if env.get(env_name):
                return env[env_name]
            if config.get(config_name) not in (None, ""):
                return config[config_name]
            return None

        project_value = pick(project, "SPOTWARP_PROJECT", "project") or DEFAULT_PROJECT
        storage_value = pick(storage, "SPOTWARP_STORAGE", "storage") or default_storage()
        if storage_options is None:
            if env.get("SPOTWARP_STORAGE_OPTIONS"):
                storage_options = parse_storage_options(env["SPOTWARP_STORAGE_OPTIONS"])
            else:
                storage_options = dict(config.get("storage_options") or {})
        workspace_value = pick(workspace, "SPOTWARP_WORKSPACE", "workspace")
        return cls(
            project=validate_project_id(project_value),
            storage=expand_storage_url(storage_value, env),
            storage_options=storage_options,
            workspace=str(Path(workspace_value).expanduser().resolve()) if workspace_value else None,
        )
