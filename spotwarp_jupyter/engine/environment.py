"""Environment facts recorded with each snapshot, and the warnings they raise on restore."""

from __future__ import annotations

import os
import platform
import re
import socket
import sys
import threading
from functools import lru_cache
from importlib import metadata
from typing import Any, Mapping

SECRET_MARKERS = ("KEY", "SECRET", "TOKEN", "PASSWORD", "PASSWD", "CREDENTIAL", "AUTH", "PRIVATE", "STORAGE_OPTIONS")
REDACTED = "<redacted>"
_URL_PASSWORD = re.compile(r"(://[^/:@\s]+:)[^@/\s]+@")
_ALWAYS = ("torch", "numpy", "pandas", "dill", "spotwarp", "ipykernel", "jax", "tensorflow", "scikit-learn", "transformers")


def is_secret_name(name: str) -> bool:
    upper = name.upper()
    return any(marker in upper for marker in SECRET_MARKERS)


def redacted_environment(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """Environment variables with secret-looking names (and passwords inside URLs) replaced."""
    env = os.environ if env is None else env
    return {
        name: REDACTED if is_secret_name(name) else _URL_PASSWORD.sub(r"\1" + REDACTED + "@", value)
        for name, value in sorted(env.items())
    }


@lru_cache(maxsize=1)
def _distributions() -> dict[str, list[str]]:
    try:
        return metadata.packages_distributions()
    except Exception:  # noqa: BLE001
        return {}


def package_versions() -> dict[str, str]:
    """Versions of the packages imported in this process (and a few that matter to restores)."""
    with _versions_lock:
        return dict(_package_versions(frozenset(m.partition(".")[0] for m in list(sys.modules))))


_versions_lock = threading.Lock()


def _fresh_lock_in_child() -> None:
    # a forked snapshot writer must not inherit the lock held by the thread that learns versions
    global _versions_lock
    _versions_lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_fresh_lock_in_child)


@lru_cache(maxsize=8)
def _package_versions(top_modules: frozenset[str]) -> dict[str, str]:
    names = set(_ALWAYS)
    dists = _distributions()
    stdlib = getattr(sys, "stdlib_module_names", frozenset())
    for top in top_modules:
        if top and not top.startswith("_") and top not in stdlib:
            names.update(dists.get(top, []))
    versions: dict[str, str] = {}
    for name in sorted(names):
        if name not in _known_versions:
            try:
                _known_versions[name] = metadata.version(name)
            except metadata.PackageNotFoundError:
                _known_versions[name] = None
        if _known_versions[name] is not None:
            versions[name] = _known_versions[name]
    return versions


# one metadata look-up per distribution per process (a forked writer inherits what the kernel learnt)
_known_versions: dict[str, str | None] = {}


def gpu_models() -> list[str]:
    """Names of the CUDA devices, when torch is already imported (never imported just for this)."""
    torch = sys.modules.get("torch")
    try:
        if torch is not None and torch.cuda.is_available():
            return [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    except Exception:  # noqa: BLE001
        pass
    return []


def collect_facts() -> dict[str, Any]:
    """What a snapshot records about the machine and process that made it."""
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "hostname": socket.gethostname(),
        "gpus": gpu_models(),
        "packages": package_versions(),
        "env": redacted_environment(),
    }


def _normalized(name: str) -> str:
    return name.lower().replace("-", "_").replace(".", "_")


def version_warnings(saved: Mapping[str, Any], modules: set[str] | frozenset[str] = frozenset()) -> list[str]:
    """One line per relevant package whose version differs between the snapshot's host and this one.

    Relevant: the packages of `modules` (top-level modules the restored state uses) and a few that
    matter to every restore; looked up one by one, so a restore never scans every installed package.
    """
    lines = []
    if saved.get("python") and saved["python"] != platform.python_version():
        lines.append(f"Python {saved['python']} made this snapshot; this kernel runs {platform.python_version()}")
    wanted = {_normalized(m) for m in modules} | {_normalized(n) for n in _ALWAYS}
    for name, version in sorted((saved.get("packages") or {}).items()):
        if _normalized(name) not in wanted:
            continue
        try:
            current = metadata.version(name)
        except metadata.PackageNotFoundError:
            current = None
        if current is None:
            lines.append(f"{name} {version} was installed where the snapshot was made, but is missing here")
        elif current != version:
            lines.append(f"{name} {version} made this snapshot; {current} is installed here")
    return lines
