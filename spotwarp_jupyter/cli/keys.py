"""`spotwarp key`: the project's signing key on this host, and how to give it to another host (docs/threat-model.md)."""

from __future__ import annotations

import argparse
import os

from ..engine import Settings
from ..engine.keys import KEY_ENV, create_key, key_path, project_key, read_key_file
from ..engine.signing import key_id
from .common import EXIT_FAILURE, EXIT_OK, _print, command


@command("key")
def cmd_key(args: argparse.Namespace) -> int:
    """Show the key: a new host resumes kernels only from snapshots signed with it, so it must be carried there
    (an environment variable, a secret store), never through the store."""
    settings = Settings.resolve(project=getattr(args, "project", None), storage=args.storage)
    project, storage = settings.project, settings.storage
    path = key_path(project, storage)
    if getattr(args, "create", False) and project_key(project, storage) is None:
        create_key(project, storage)
    key = project_key(project, storage)
    if key is None:
        text = (f"project {project!r} in {storage} has no key on this host (SPOTWARP_KEY is not set, and {path} does not exist): "
                "its first `spotwarp start` on a new project creates one; for a project whose snapshots were "
                "signed elsewhere, run `spotwarp key` on that host; `spotwarp key --create` makes one here")
        _print(args, {"project": project, "key": None, "key_id": None, "kept_in": None}, text)
        return EXIT_FAILURE
    source = "the environment (SPOTWARP_KEY)" if os.environ.get(KEY_ENV) else \
        f"{path} (mode {oct(path.stat().st_mode & 0o777)[2:]}, readable by you only)"
    if os.environ.get(KEY_ENV) and read_key_file(project, storage) not in (None, key):
        source += f"; {path} holds another key, which SPOTWARP_KEY overrides"
    secret = key.decode()
    text = "\n".join([
        f"project {project!r} in {storage} signs with key id {key_id(key)}, from {source}",
        f"key: {secret}",
        "a host resumes kernels only from snapshots signed with this key: give it to every host of the project, "
        "never through the store:",
        f"  export SPOTWARP_KEY='{secret}'   (in the host's environment, e.g. from a secret store: AWS Secrets "
        "Manager, GCP Secret Manager, a Kubernetes Secret)",
        "  `spotwarp launch` carries it to its candidates itself; on JupyterHub each user gets a key of their own "
        "(deploy/jupyterhub_config.py)",
    ])
    _print(args, {"project": project, "key": secret, "key_id": key_id(key),
                  "kept_in": None if os.environ.get(KEY_ENV) else str(path)}, text)
    return EXIT_OK
