"""The project's signing key, kept on the host and never in the store, and what it vouches for.

A store writer can edit a kernel record, recompute its checksum, and have the next host unpickle it and run its
recorded cell with nobody at the keyboard. Only an HMAC with a key the store does not hold tells the project's
own writes from such edits (docs/threat-model.md). So every project signs by default: `SPOTWARP_KEY` when set,
else the key kept in SpotWarp's config folder (`~/.spotwarp/keys/<project>@<store>.key`, or under
`SPOTWARP_CONFIG_DIR`; one per project and store, since a key is made for a store that holds none of the
project's snapshots), created at the project's first `spotwarp start` or `%load_ext spotwarp`. A store that holds snapshots already never gets a key made up over it: a new
host must be given the project's key (`spotwarp key` on a host that has it shows how).
"""

from __future__ import annotations

import hashlib
import os
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping

from .errors import ConfigError
from .signing import key_id

KEY_ENV = "SPOTWARP_KEY"
CONFIG_DIR_ENV = "SPOTWARP_CONFIG_DIR"


def config_dir(env: Mapping[str, str] | None = None) -> Path:
    """SpotWarp's per-user folder: `SPOTWARP_CONFIG_DIR`, else `~/.spotwarp`."""
    value = (env if env is not None else os.environ).get(CONFIG_DIR_ENV)
    return Path(value).expanduser() if value else Path("~/.spotwarp").expanduser()


def key_path(project: str, storage: str, env: Mapping[str, str] | None = None) -> Path:
    """Where the key of `project` in `storage` is kept on this host (a file readable by the user only)."""
    where = hashlib.sha256(storage.encode("utf-8", "surrogatepass")).hexdigest()[:12]
    return config_dir(env) / "keys" / f"{project}@{where}.key"


def read_key_file(project: str, storage: str, env: Mapping[str, str] | None = None) -> bytes | None:
    """The key kept for `project` in `storage` on this host, if any."""
    path = key_path(project, storage, env)
    try:
        text = path.read_text(encoding="ascii").strip()
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"the key of project {project!r} in {path} cannot be read: {exc}") from None
    return text.encode() if text else None


def project_key(project: str, storage: str, env: Mapping[str, str] | None = None) -> bytes | None:
    """The key that signs `project` here: `SPOTWARP_KEY` when set (it always wins), else the kept one."""
    value = (env if env is not None else os.environ).get(KEY_ENV)
    return value.encode() if value else read_key_file(project, storage, env)


def create_key(project: str, storage: str, env: Mapping[str, str] | None = None) -> bytes:
    """A new random key for `project`, kept with mode 0600 in a 0700 folder; a key another process created
    first is the one answered (create-only: two first starts never end with two keys)."""
    path = key_path(project, storage, env)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    for folder in (path.parent, path.parent.parent):
        if folder.stat().st_mode & 0o077:
            os.chmod(folder, 0o700)
    key = secrets.token_urlsafe(32)
    temporary = path.with_name(f".{path.name}.{secrets.token_hex(4)}")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="ascii") as f:
            f.write(key + "\n")
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(temporary, path)  # fails when a key is there: never replaced
        except FileExistsError:
            pass
    finally:
        os.unlink(temporary)
    kept = read_key_file(project, storage, env)
    assert kept is not None
    return kept


def use_key(key: bytes) -> None:
    """Make `key` this process's signing key, and its children's (the server's kernels): through the
    environment, never a command line."""
    os.environ[KEY_ENV] = key.decode()


@dataclass
class KeyState:
    """How this host signs the project: `key` (None: it does not) and, where that needs saying, one line."""

    key: bytes | None
    source: str  # "environment", "file", "created" or "none"
    line: str | None = None


def settle_key(project: str, storage: str, stored: Iterable[Any] | None,
               env: Mapping[str, str] | None = None) -> KeyState:
    """This host's key for `project`, created when the store holds none of its snapshots (`stored` is the
    project's readable manifests; None when unknown, e.g. the store unreadable: nothing is created then)."""
    env = env if env is not None else os.environ
    if env.get(KEY_ENV):
        return KeyState(env[KEY_ENV].encode(), "environment")
    kept = read_key_file(project, storage, env)
    if kept is not None:
        return KeyState(kept, "file")
    if stored is None:
        return KeyState(None, "none")
    snapshots = list(stored)
    if not snapshots:
        key = create_key(project, storage, env)
        return KeyState(key, "created", f"created a signing key for project {project!r} (key id {key_id(key)}) in "
                        f"{key_path(project, storage, env)}: `spotwarp key` shows how to carry it to another host")
    opted_in = env.get("SPOTWARP_RESUME_UNSIGNED", "").strip().lower() in ("1", "true", "yes", "on")
    return KeyState(None, "none", no_key_line(project, any(getattr(m, "signed", False) for m in snapshots), opted_in))


def no_key_line(project: str, signed: bool, opted_in: bool = False) -> str:
    """Why a host without the project's key resumes no kernel, and what to do; or, opted in to resuming what no
    key vouches for (`resume_unsigned`), that it does so."""
    what = "is signed" if signed else "has unsigned snapshots (written by a host without its key, or by someone else)"
    if opted_in:
        return (f"project {project!r} {what}, and this host has no key for it: WARNING: kernels resume all the same "
                "(resume_unsigned), running code no key vouches for; set SPOTWARP_KEY to the project's key")
    return (f"project {project!r} {what}, and this host has no key for it: files are restored, no kernel is "
            "resumed; set SPOTWARP_KEY to the project's key (`spotwarp key` on a host that has it), or accept the "
            "risk with `spotwarp start --resume-unsigned`")


def vouched(manifest: Any, key: bytes | None) -> bool:
    """Whether a key vouches for `manifest`: read with a key (the catalog refuses what it did not sign) and signed."""
    return bool(key) and bool(getattr(manifest, "signed", False))


@dataclass
class Trust:
    """Whether the code a resume would run (unpickling, a recorded cell) is vouched for; `line` says why not,
    or, opted in, the warning shown wherever the resume is reported."""

    vouched: bool
    allowed: bool  # vouched, or opted in (resume_unsigned)
    line: str | None = None
    key_id: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"vouched": self.vouched, "allowed": self.allowed, "line": self.line, "key_id": self.key_id}


def resume_trust(project: str, manifests: Iterable[Any], key: bytes | None, opted_in: bool) -> Trust:
    """The trust of a resume from `manifests` (those its kernel records and recorded cells come from)."""
    manifests = list(manifests)
    ident = key_id(key) if key else None
    outside = [m for m in manifests if not vouched(m, key)]
    if not outside:
        return Trust(True, True, None, ident)
    names = ", ".join(sorted({m.id for m in outside}))
    if opted_in:
        return Trust(False, True, f"resuming kernels from snapshot {names}, which no key vouches for "
                     "(--resume-unsigned): anyone who can write the store can run code on this host", ident)
    if key is None:
        line = no_key_line(project, any(getattr(m, "signed", False) for m in outside))
    else:
        line = (f"snapshot {names} is not signed with this host's key: files are restored, no kernel is resumed; "
                "`spotwarp start --resume-unsigned` accepts the risk")
    return Trust(False, False, line, ident)

