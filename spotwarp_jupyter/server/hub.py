"""What a JupyterHub deployment needs from the server extension.

- who the hub says this server belongs to (`JUPYTERHUB_USER`, `JUPYTERHUB_SERVER_NAME`);
- a warning when every user would share one storage prefix;
- restore-on-spawn: a fresh server (its workspace empty, as on a new pod after a preemption) gets the
  user's newest workspace snapshot back before it serves anything, as `spotwarp start` does; a kept home
  keeps its files and gets back only missing ones; the kernels resume in both;
- an authorizer for shared servers: people the owner shares the server with may look (files, kernels,
  SpotWarp's snapshots) but not run code, change files, or take or restore snapshots, unless the hub
  granted them that action in custom scopes.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from jupyter_server.auth.authorizer import Authorizer

from ..engine import ConfigError, SnapshotEngine
from ..engine.settings import RESTORE_MODES, is_remote
from ..service import VIA_HUB, Project
from ..service.wire import hub_restore_json

log = logging.getLogger("spotwarp")

# What a fresh home or volume holds before its user writes anything: shell skeleton files, the folders
# Jupyter and IPython create at start, a new volume's lost+found, the default local store.
FRESH_WORKSPACE_NAMES = (
    ".bashrc", ".bash_logout", ".profile", ".cache", ".config", ".local", ".jupyter", ".ipython",
    ".ipynb_checkpoints", ".spotwarp", ".conda", ".npm", ".wget-hsts", "lost+found",
)


@dataclass(frozen=True)
class HubIdentity:
    """The hub user (and named server) a single-user server runs for."""

    user: str
    server_name: str = ""

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "HubIdentity | None":
        """The identity JupyterHub's spawner put in the environment; None outside a hub."""
        env = os.environ if env is None else env
        user = env.get("JUPYTERHUB_USER", "")
        return cls(user, env.get("JUPYTERHUB_SERVER_NAME", "")) if user else None


def shared_prefix_warning(storage: str, identity: HubIdentity | None) -> str | None:
    """A warning when, under a hub, shared storage does not hold the user's name as a path segment."""
    if identity is None or not is_remote(storage):
        return None
    if identity.user in storage.split("://", 1)[1].split("/"):
        return None
    return (f"storage {storage} is not per user: every hub user's snapshots would share it. Put {{username}} "
            f"in SPOTWARP_STORAGE (e.g. s3://bucket/spotwarp/{{username}}/{{server_name}})")


def workspace_is_fresh(workspace: str, ignorable: Iterable[str] = FRESH_WORKSPACE_NAMES) -> bool:
    """Whether `workspace` is missing, or holds nothing but what a fresh home or volume holds."""
    try:
        names = os.listdir(workspace)
    except FileNotFoundError:
        return True
    return set(names) <= set(ignorable)


def restore_mode(value: str) -> str:
    """`auto`, `if-empty` or `never`; anything else is a configuration error."""
    mode = (value or "auto").strip().lower()
    if mode not in RESTORE_MODES:
        raise ConfigError(f"restore_on_start must be one of {', '.join(RESTORE_MODES)}, got {value!r}")
    return mode


def restore_on_start(engine: SnapshotEngine, workspace: str, mode: str, identity: HubIdentity | None,
                     ignorable: Iterable[str] = FRESH_WORKSPACE_NAMES,
                     logger: logging.Logger | None = None, resume_unsigned: bool | None = None) -> dict[str, Any] | None:
    """Restore the newest snapshot holding files at start; what happened, for `GET status` (`line`: one sentence,
    also logged through `logger`, the server's log).

    A fresh workspace gets the snapshot's files. A kept one (a home volume that outlived the server) keeps every
    file it holds as it is, newer than any snapshot, and gets back only what is missing (`kept`); in both, the
    kernels resume from the newest snapshot. `auto` restores only under JupyterHub (a plain server has
    `spotwarp start` for this). A failure is reported, never raised: the server still starts so the user can look
    and retry from the panel. `resume_unsigned`: the server's resolved opt-in (None: from the environment).
    """
    logger = logger or log
    if mode == "never" or (mode == "auto" and identity is None):
        if identity is not None:
            logger.info("SpotWarp start restore: off (restore_on_start = never): the workspace is served as it is")
        return None
    kept = not workspace_is_fresh(workspace, ignorable)
    try:
        result = Project(engine, workspace, resume_unsigned=resume_unsigned).restore(
            "latest", via=VIA_HUB, files_only=True, keep_existing=kept)
    except Exception as exc:  # noqa: BLE001 - the server must come up; status shows the error
        line = f"restoring the workspace at start failed: {type(exc).__name__}: {exc}"
        logger.error("SpotWarp start restore: %s", line)
        return {"restored": False, "kept": kept, "error": f"{type(exc).__name__}: {exc}", "line": line}
    if result is None:
        line = f"project {engine.settings.project!r} has no snapshot with files yet" + (
            ": the workspace's files are served as they are" if kept else ": starting with an empty workspace")
        logger.info("SpotWarp start restore: %s", line)
        return {"restored": False, "kept": kept, "reason": line, "line": line}
    answer = {**hub_restore_json(result), "kept": kept}
    answer["line"] = start_restore_line(answer, workspace)
    logger.info("SpotWarp start restore: %s", answer["line"])
    return answer


def start_restore_line(restored: Mapping[str, Any], workspace: str) -> str:
    """One sentence for a start's restore (`hub_restore_json` with `kept`): what came back, what stayed."""
    where = f"snapshot {restored.get('id')} ({restored.get('host')}, {restored.get('created')})"
    if restored.get("kept"):
        text = (f"the workspace {workspace} already holds files: kept as they are ({restored.get('files_kept', 0)} "
                f"on disk), {restored.get('files_restored', 0)} missing restored from {where}")
    else:
        text = (f"restored {restored.get('files_restored', 0)} files ({restored.get('bytes_restored', 0)} bytes) into "
                f"{workspace} from {where}")
    skipped = restored.get("server_state_skipped") or []
    if skipped:
        text += f"; {len(skipped)} files of Jupyter's own state left as this server has them ({skipped[0]}...)"
    return text + ("; kernels resume from the newest snapshot" if restored.get("notebooks") else "")


# the preStop hook: a kernel in a training cell answers at its next step; SIGTERM and the final snapshot follow
PRESTOP_TIMEOUT_S = 5.0

GRANT_SCOPE = "custom:jupyter_server:{action}:{resource}"


def _granted_scopes(user: Any) -> set[str]:
    """The JupyterHub scopes a request's user holds (the hub's identity provider puts them on the user)."""
    hub_user = getattr(user, "hub_user", None)
    scopes = hub_user.get("scopes") if isinstance(hub_user, dict) else None
    return set(scopes) if isinstance(scopes, (list, tuple, set, frozenset)) else set()


# starting, interrupting or restarting kernels and terminals is `write` in jupyter_server, and is part
# of running code: a grant to execute on these covers writing them (not files, not snapshots)
RUN_CODE_RESOURCES = ("kernels", "sessions", "terminals")


def share_grants(scopes: set[str], action: str, resource: str, owner: str, server_name: str) -> bool:
    """Whether `scopes` hold `custom:jupyter_server:<action>:<resource>` (or `...:<action>:*`) for this server."""
    wanted = {GRANT_SCOPE.format(action=action, resource=r) for r in (resource, "*")}
    if action == "write" and resource in RUN_CODE_RESOURCES:
        wanted |= {GRANT_SCOPE.format(action="execute", resource=r) for r in (resource, "*")}
    server = f"server={owner}/{server_name}"
    for scope in scopes:
        base, _, where = scope.partition("!")
        if base in wanted and where in ("", server, f"user={owner}"):
            return True
    return False


class SpotWarpHubAuthorizer(Authorizer):
    """On a shared hub server, people other than its owner may read, and nothing else unless granted.

    JupyterHub admits everyone holding `access:servers` for this server (the owner, people it is shared
    with, admins with access); its own authorizer then allows every action, so a shared user could run
    code in the owner's kernels and terminals, with the owner's credentials. Here the owner keeps every
    right; anyone else gets `read` on every resource, and `write` or `execute` on a resource only when
    the hub granted them `custom:jupyter_server:<action>:<resource>` or `custom:jupyter_server:<action>:*`
    for this server (`execute` on kernels, sessions, terminals also covers starting and interrupting them) (e.g. in the share: `POST /hub/api/shares/alice/ {"user": "bob", "scopes":
    ["custom:jupyter_server:execute:*"]}`). Outside a hub only SpotWarp's own writes are refused.
    Set it with `c.ServerApp.authorizer_class = "spotwarp_jupyter.server.hub.SpotWarpHubAuthorizer"`.
    """

    def is_authorized(self, handler: Any, user: Any, action: str, resource: str) -> bool:
        owner = os.environ.get("JUPYTERHUB_USER")
        if not owner:
            return resource != "spotwarp" or action == "read"
        if getattr(user, "username", None) == owner:
            return True
        if action == "read":
            return True
        allowed = share_grants(_granted_scopes(user), action, resource, owner,
                               os.environ.get("JUPYTERHUB_SERVER_NAME", ""))
        if not allowed:
            self.log.info("SpotWarp: %s may not %s %s on %s's server (no scope %s granted)",
                          getattr(user, "username", "?"), action, resource, owner,
                          GRANT_SCOPE.format(action=action, resource="*"))
        return allowed


def _own_server_url(env: Mapping[str, str]) -> str:
    """This server's URL as seen from inside its pod (the bind address may be 0.0.0.0)."""
    from urllib.parse import urlsplit, urlunsplit

    url = urlsplit(env["JUPYTERHUB_SERVICE_URL"])
    host = url.hostname or ""
    if host in ("", "0.0.0.0", "::"):
        host = "127.0.0.1"
    netloc = f"[{host}]" if ":" in host else host
    if url.port:
        netloc += f":{url.port}"
    return urlunsplit((url.scheme, netloc, url.path.rstrip("/") + "/", "", ""))


def prestop_snapshot(env: Mapping[str, str] | None = None, timeout: float = PRESTOP_TIMEOUT_S,
                     message: str = "preStop: the pod is stopping") -> dict[str, Any]:
    """Ask this pod's own server for a snapshot of files and every live kernel, with the server's hub token."""
    import json
    import threading
    import urllib.request

    env = os.environ if env is None else env
    missing = [n for n in ("JUPYTERHUB_SERVICE_URL", "JUPYTERHUB_API_TOKEN") if not env.get(n)]
    if missing:
        raise ConfigError(f"not in a JupyterHub single-user server: {', '.join(missing)} not set")
    request = urllib.request.Request(  # noqa: S310 - this pod's own server
        _own_server_url(env) + "spotwarp/api/snapshots", data=json.dumps({"message": message}).encode(),
        method="POST", headers={"Authorization": f"token {env['JUPYTERHUB_API_TOKEN']}",
                                "Content-Type": "application/json"})
    # the whole call within `timeout`, not each socket operation: a server that trickles never holds the hook past it
    answer: dict[str, Any] = {}

    def call() -> None:
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310 - this pod's own server
                answer["body"] = json.loads(response.read())
        except BaseException as exc:  # noqa: BLE001 - raised in the caller's thread
            answer["error"] = exc

    worker = threading.Thread(target=call, name="spotwarp-prestop", daemon=True)
    worker.start()
    worker.join(timeout)
    if "error" in answer:
        raise answer["error"]
    if "body" not in answer:
        raise TimeoutError(f"the server did not answer within {timeout:g} s")
    return answer["body"]


def main(argv: list[str] | None = None) -> int:
    """`python -m spotwarp_jupyter.server.hub prestop [--timeout S]`: a Kubernetes preStop hook."""
    import argparse
    import sys
    import urllib.error

    parser = argparse.ArgumentParser(prog="python -m spotwarp_jupyter.server.hub",
                                     description="SpotWarp helpers for JupyterHub pods.")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("prestop", help="a snapshot through this pod's server before Kubernetes stops it")
    p.add_argument("--timeout", type=float, default=PRESTOP_TIMEOUT_S,
                   help="seconds to wait; with the server's shutdown_grace, keep within the pod's grace period")
    args = parser.parse_args(argv)
    try:
        answer = prestop_snapshot(timeout=args.timeout)
    except urllib.error.HTTPError as exc:
        print(f"spotwarp prestop: the server refused: {exc.code} {exc.reason}", file=sys.stderr)
        return 1
    except (OSError, ConfigError) as exc:
        print(f"spotwarp prestop: {exc}", file=sys.stderr)
        return 1
    print(f"spotwarp prestop: snapshot {answer.get('id')} committed ({answer.get('files')} files, "
          f"notebooks: {', '.join(answer.get('notebooks') or []) or 'none'})")
    return 0


if __name__ == "__main__":  # pragma: no cover - run as a module
    raise SystemExit(main())
