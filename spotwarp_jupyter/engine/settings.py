"""Every SpotWarp setting declared once, the one order they resolve in, and the project an engine works on.

Order: flags, environment, config, defaults.

The CLI passes its flags, the magic its `%spotwarp policy` flags and the server its `--SpotWarp.*` command
line as the strongest layer; `SPOTWARP_*` variables come next; values from Jupyter/IPython config files
(`c.SpotWarp.*`, `c.SpotWarpMagics.*`) after them; the defaults below last.
"""

from __future__ import annotations

import copy
import json
import logging
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from .errors import ConfigError
from .units import parse_duration, parse_size

DEFAULT_PROJECT = "default"
DEFAULT_METADATA_URL = "http://169.254.169.254"
WATCHER_KINDS = ("signals", "aws", "gcp", "azure")
RESTORE_MODES = ("auto", "if-empty", "never")
log = logging.getLogger("spotwarp")
_PROJECT_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def env_int(name: str, default: int, lowest: int) -> int:
    """A whole-number setting from the environment (a malformed one is logged and ignored)."""
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    try:
        return max(lowest, int(text))
    except ValueError:
        log.warning("ignoring %s=%r: not a whole number", name, text)
        return default


def env_float(name: str, default: float) -> float:
    """A non-negative number setting from the environment (a malformed one is logged and ignored)."""
    text = os.environ.get(name, "").strip()
    try:
        return max(0.0, float(text)) if text else default
    except ValueError:
        log.warning("ignoring %s=%r: not a number", name, text)
        return default


def default_storage() -> str:
    """The local store used when nothing is configured: `~/.spotwarp/store`."""
    return os.path.expanduser("~/.spotwarp/store")


def validate_project_id(project: str) -> str:
    """Return `project` if it is a safe name (letters, digits, `.`, `_`, `-`), else raise."""
    if not isinstance(project, str) or not _PROJECT_ID.match(project) or ".." in project:
        raise ConfigError(
            f"bad project id {project!r}: use letters, digits, '.', '_' or '-' (at most 128, no '..')"
        )
    return project


def _text(text: str) -> str:
    return text.strip()


def _seconds(text: str) -> float:
    """A duration, where `0` (turned off) is allowed too."""
    return 0.0 if text.strip() == "0" else parse_duration(text)


AUTO = "auto"  # the adaptive cadence: a value of its own, so `auto` in a stronger layer beats a duration below it


def every(text: str) -> float | str:
    """A fixed interval between automatic snapshots, or `auto`: the adaptive cadence at a loop's steps."""
    return AUTO if text.strip().lower() == AUTO else parse_duration(text)


def _flag(text: str) -> bool:
    word = text.strip().lower()
    if word in ("1", "true", "yes", "on"):
        return True
    if word in ("0", "false", "no", "off"):
        return False
    raise ConfigError(f"expected true or false, got {text!r}")


def _count(text: str) -> int:
    if not text.strip().isdigit():
        raise ConfigError(f"expected a whole number, got {text!r}")
    return int(text)


def _json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"not valid JSON: {exc.msg} at position {exc.pos}") from None
    if not isinstance(value, dict):
        raise ConfigError("must be a JSON object, e.g. {\"anon\": false}")
    return value


def _restore_mode(text: str) -> str:
    mode = text.strip().lower()
    if mode not in RESTORE_MODES:
        raise ConfigError(f"expected one of {', '.join(RESTORE_MODES)}")
    return mode


def _watchers(text: str | list[str]) -> list[str]:
    words = text.replace(" ", "").split(",") if isinstance(text, str) else list(text)
    chosen = [w.strip().lower() for w in words if w.strip()]
    unknown = sorted(set(chosen) - set(WATCHER_KINDS))
    if unknown:
        raise ConfigError(f"unknown watcher(s) {', '.join(unknown)}: choose among {', '.join(WATCHER_KINDS)}")
    return chosen


@dataclass(frozen=True)
class Setting:
    """One setting: its name (trait and flag name), its variable, how text becomes a value, its default."""

    name: str
    env: str
    parse: Callable[[str], Any]
    default: Any
    blank_is_value: bool = False  # `SPOTWARP_WATCHERS=` means no watchers, not "unset"

    def default_value(self) -> Any:
        """The default (a fresh copy of a list or dict; computed when it is a function)."""
        return self.default() if callable(self.default) else copy.copy(self.default)

    def given(self, value: Any) -> bool:
        """Whether a layer sets this setting: None, and blank text unless it means something, do not."""
        if value is None:
            return False
        return self.blank_is_value or not (isinstance(value, str) and not value.strip())


_ALL = (
    # where a project lives (CLI, server, kernel)
    Setting("project", "SPOTWARP_PROJECT", validate_project_id, DEFAULT_PROJECT),
    Setting("storage", "SPOTWARP_STORAGE", _text, default_storage),
    Setting("storage_options", "SPOTWARP_STORAGE_OPTIONS", _json_object, dict),
    Setting("workspace", "SPOTWARP_WORKSPACE", _text, None),
    # the server (`c.SpotWarp.*`)
    Setting("backup_interval", "SPOTWARP_BACKUP_INTERVAL", _seconds, 300.0),
    Setting("kernel_timeout", "SPOTWARP_KERNEL_TIMEOUT", _seconds, 60.0),
    Setting("heartbeat_interval", "SPOTWARP_HEARTBEAT_INTERVAL", _seconds, 5.0),
    Setting("restore_on_start", "SPOTWARP_RESTORE_ON_START", _restore_mode, "auto"),
    Setting("watchers", "SPOTWARP_WATCHERS", _watchers, list(WATCHER_KINDS), blank_is_value=True),
    Setting("aws_metadata_url", "SPOTWARP_AWS_METADATA_URL", _text, DEFAULT_METADATA_URL),
    Setting("gcp_metadata_url", "SPOTWARP_GCP_METADATA_URL", _text, DEFAULT_METADATA_URL),
    Setting("azure_metadata_url", "SPOTWARP_AZURE_METADATA_URL", _text, DEFAULT_METADATA_URL),
    Setting("metadata_poll_interval", "SPOTWARP_METADATA_POLL_INTERVAL", _seconds, 1.0),
    Setting("watcher_max_backoff", "SPOTWARP_WATCHER_MAX_BACKOFF", _seconds, 300.0),
    Setting("shutdown_grace", "SPOTWARP_SHUTDOWN_GRACE", _seconds, 20.0),
    Setting("notice_window", "SPOTWARP_NOTICE_WINDOW", _seconds, 25.0),
    Setting("resume_kernels", "SPOTWARP_RESUME_KERNELS", _flag, True),
    Setting("resume_unsigned", "SPOTWARP_RESUME_UNSIGNED", _flag, False),
    # a kernel's automatic-snapshot policy (`c.SpotWarpMagics.*`, `%spotwarp policy`)
    Setting("every", "SPOTWARP_EVERY", every, AUTO),  # adaptive at steps, 5 minutes between cells
    Setting("max_redo", "SPOTWARP_MAX_REDO", parse_duration, 60.0),
    Setting("after_cell", "SPOTWARP_AFTER_CELL", _flag, True),
    Setting("autosnapshot", "SPOTWARP_AUTOSNAPSHOT", _flag, True),
    Setting("max_var_size", "SPOTWARP_MAX_VAR_SIZE", parse_size, 8 * 10**9),
    Setting("keep", "SPOTWARP_KEEP", _count, 0),
)
SETTINGS: dict[str, Setting] = {s.name: s for s in _ALL}
LOCATION = ("project", "storage", "storage_options", "workspace")
SERVER = ("backup_interval", "kernel_timeout", "heartbeat_interval", "restore_on_start", "watchers",
          "aws_metadata_url", "gcp_metadata_url", "azure_metadata_url", "metadata_poll_interval",
          "watcher_max_backoff", "shutdown_grace", "notice_window", "resume_kernels", "resume_unsigned")
POLICY = ("every", "max_redo", "after_cell", "autosnapshot", "max_var_size", "keep")


def _parsed(setting: Setting, value: Any, where: str | None) -> Any:
    """A layer's value as the setting's type: text is parsed (config files may say `"5m"`), the rest kept.

    A bad variable or config value is named in the error; a bad flag's error is left to its caller's wording.
    """
    if not isinstance(value, str) and setting.parse not in (_watchers, validate_project_id):
        return copy.copy(value)  # a dict or list of the caller's is not shared with the settings
    try:
        return setting.parse(value)
    except ConfigError as exc:
        if where is None:
            raise
        raise ConfigError(f"{where}={value!r} cannot be used: {exc}") from None


def resolve_setting(name: str, flags: Mapping[str, Any] | None = None, env: Mapping[str, str] | None = None,
                    config: Mapping[str, Any] | None = None, default: Any = None) -> Any:
    """One setting's value, strongest first: `flags`, `env`, `config`, then `default` or the declared default."""
    setting = SETTINGS[name]
    env = os.environ if env is None else env
    layers = ((flags, name, None), (env, setting.env, setting.env),
              (config, name, f"config {name}"))
    for layer, key, where in layers:
        if layer is not None and setting.given(layer.get(key)):
            return _parsed(setting, layer[key], where)
    return setting.default_value() if default is None else default


def resolve_settings(names: Iterable[str], flags: Mapping[str, Any] | None = None,
                     env: Mapping[str, str] | None = None, config: Mapping[str, Any] | None = None,
                     defaults: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The values of `names`, each resolved by `resolve_setting`; the first bad value raises a one-line ConfigError."""
    defaults = defaults or {}
    return {name: resolve_setting(name, flags, env, config, defaults.get(name)) for name in names}


def configured(holder: Any, names: Iterable[str]) -> dict[str, Any]:
    """The config layer of a traitlets object whose settings default to None: the values a config file set."""
    return {name: getattr(holder, name) for name in names if getattr(holder, name, None) is not None}


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
