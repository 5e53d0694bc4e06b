"""Environment facts recorded with each snapshot, and the warnings they raise on restore."""

from __future__ import annotations

import math
import os
import platform
import re
import socket
import sys
import threading
from functools import lru_cache
from importlib import metadata
from typing import Any, Mapping

# a name holding one of these (anywhere) is a secret's name: its value is never stored
SECRET_MARKERS = ("KEY", "SECRET", "TOKEN", "PASSWORD", "PASSWD", "PASS", "CREDENTIAL", "AUTH", "PRIVATE",
                  "SIGNATURE", "WEBHOOK", "DSN", "COOKIE", "CONNECTION_STRING", "CONNSTR", "STORAGE_OPTIONS")
# ... or one of these as a whole word between underscores (PAT, not PATH)
SECRET_WORDS = frozenset({"PAT", "PWD", "PW", "SAS", "SIG", "CRED", "CREDS", "OTP", "PIN", "SALT", "HMAC"})
# known-harmless variables: kept as they are (no value-shape guessing, which paths and hashes could trip)
HARMLESS_NAMES = frozenset({
    "PATH", "HOME", "LANG", "LANGUAGE", "SHELL", "USER", "LOGNAME", "PWD", "OLDPWD", "TERM", "TZ", "HOSTNAME",
    "SHLVL", "TMPDIR", "PYTHONPATH", "PYTHONHASHSEED", "PYTHONUNBUFFERED", "VIRTUAL_ENV", "CONDA_PREFIX",
    "CONDA_DEFAULT_ENV", "LD_LIBRARY_PATH", "CUDA_HOME", "CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS",
    "MKL_NUM_THREADS", "JUPYTERHUB_USER", "JUPYTERHUB_SERVER_NAME", "JPY_SESSION_NAME", "SPOTWARP_PROJECT",
})
HARMLESS_PREFIXES = ("LC_", "XDG_")
REDACTED = "<redacted>"
# user[:password]@ in any URL; the password may hold '/' (the userinfo ends at the last '@' before the host)
_URL_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?P<userinfo>[^\s@]*)@(?=[^\s@/]*(?:[/:?#\s]|$))")
# Key=..., Password=..., SharedAccessSignature=... inside connection strings
_CONNECTION_SECRET = re.compile(
    r"(?:^|[;&?\s])[A-Za-z ]*(?:key|password|pwd|secret|token|signature|sig|sas)[A-Za-z ]*=", re.IGNORECASE)
_WEBHOOK = re.compile(r"://[^\s]*(?:webhook|hooks\.|/hooks/|/services/T[A-Z0-9]+/)", re.IGNORECASE)
# prefixes of well-known tokens (GitHub, GitLab, Slack, OpenAI, Hugging Face, AWS, Google, Stripe, npm, PyPI)
_TOKEN_PREFIX = re.compile(r"(?:ghp_|gho_|ghu_|ghs_|ghr_|github_pat_|glpat-|xox[abposr]-|sk-|hf_|AKIA|ASIA|AIza"
                           r"|sk_live_|rk_live_|npm_|pypi-)[A-Za-z0-9_\-]{8,}")
_TOKEN_PIECE = re.compile(r"[A-Za-z0-9+/=_~-]+")
_ALWAYS = ("torch", "numpy", "pandas", "dill", "spotwarp-jupyter", "ipykernel", "jax", "tensorflow", "scikit-learn", "transformers")


def is_secret_name(name: str) -> bool:
    """Whether a variable's name says it holds a secret (KEY, TOKEN, ..._PAT, ...); harmless names never do."""
    upper = name.upper()
    if is_harmless_name(upper):
        return False
    return any(marker in upper for marker in SECRET_MARKERS) or bool(SECRET_WORDS & set(re.split(r"[^A-Z0-9]+", upper)))


def is_harmless_name(name: str) -> bool:
    """Whether a variable is on the allow-list of names known to hold nothing secret."""
    upper = name.upper()
    return upper in HARMLESS_NAMES or upper.startswith(HARMLESS_PREFIXES)


def _looks_random(piece: str) -> bool:
    """A long run of letters and digits with the spread of characters a generated key has."""
    if len(piece) < 20 or not any(c.isdigit() for c in piece) or not any(c.isalpha() for c in piece):
        return False
    counts = {c: piece.count(c) for c in set(piece)}
    entropy = -sum(n / len(piece) * math.log2(n / len(piece)) for n in counts.values())
    return entropy >= 3.0


def _without_credentials(match: re.Match) -> str:
    """`scheme://user:<redacted>@` for a user and password; `scheme://<redacted>@` for a token alone."""
    user, colon, _password = match["userinfo"].partition(":")
    return match["scheme"] + (f"{user}:{REDACTED}" if colon and user else REDACTED) + "@"


def redacted_value(value: str, guess: bool = True) -> str:
    """`value` with credentials removed: whole when it carries a secret, the userinfo of URLs otherwise.

    `guess` also redacts values holding a long random-looking piece (a key under an innocent name).
    """
    if _CONNECTION_SECRET.search(value) or _WEBHOOK.search(value) or _TOKEN_PREFIX.search(value):
        return REDACTED
    without_userinfo = _URL_USERINFO.sub(_without_credentials, value)
    if guess:
        rest = without_userinfo.replace(REDACTED, " ")
        if any(_looks_random(piece) for piece in _TOKEN_PIECE.findall(rest)):
            return REDACTED
    return without_userinfo


def redacted_environment(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """Environment variables with secrets replaced: by name (KEY, TOKEN, PAT, ...) and by the value's shape
    (connection strings, credentials in URLs, webhooks, known token formats, long random-looking values)."""
    env = os.environ if env is None else env
    out = {}
    for name, value in sorted(env.items()):
        if is_secret_name(name):
            out[name] = REDACTED
        elif is_harmless_name(name):
            out[name] = value
        else:
            out[name] = redacted_value(value)
    return out


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
            _known_versions[name] = installed_version(name)
        if _known_versions[name] is not None:
            versions[name] = _known_versions[name]
    return versions


def installed_version(name: str) -> str | None:
    """The installed version of distribution `name`, or None: `importlib.metadata.version` without parsing
    the whole METADATA file as an e-mail (about 0.5 ms a package, on a restore's way to usable)."""
    try:
        dist = metadata.distribution(name)
    except metadata.PackageNotFoundError:
        return None
    text = dist.read_text("METADATA") or dist.read_text("PKG-INFO") or ""
    for line in text.splitlines():
        if not line:  # the headers end at the first empty line
            break
        key, _, value = line.partition(":")
        if key.strip().lower() == "version":
            return value.strip()
    return dist.version


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
        current = installed_version(name)
        if current is None:
            lines.append(f"{name} {version} was installed where the snapshot was made, but is missing here")
        elif current != version:
            lines.append(f"{name} {version} made this snapshot; {current} is installed here")
    return lines
