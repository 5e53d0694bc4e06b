"""Which workspace paths are left out of a snapshot: built-in defaults plus `.spotwarpignore` (gitignore syntax)."""

from __future__ import annotations

import os
from pathlib import Path

import pathspec

from ..errors import ConfigError

IGNORE_FILE = ".spotwarpignore"

# Credentials and shell histories a home-folder workspace (the JupyterHub layout) holds: a snapshot is
# readable by whoever reads the store, and a restore on another host must not plant one user's keys there.
# `!.env` or `!.ssh/` in .spotwarpignore brings one back (a folder comes back as a whole).
CREDENTIAL_PATTERNS = (
    ".ssh/",
    ".gnupg/",
    "id_rsa", "id_dsa", "id_ecdsa", "id_ed25519", "id_ecdsa_sk", "id_ed25519_sk",
    "**/.aws/credentials",
    "**/.aws/sso/cache/",
    "**/.aws/cli/cache/",
    ".netrc", "_netrc",
    ".git-credentials",
    ".env",
    "!.env/",  # a folder named .env is usually a virtual environment, not secrets
    ".env.*",
    "!.env.example", "!.env.sample", "!.env.template",
    ".pgpass",
    ".pypirc",
    ".npmrc",
    ".databrickscfg",
    ".boto",
    ".s3cfg",
    "**/.docker/config.json",
    "**/.kube/config",
    "**/.config/gcloud/",
    "**/.azure/",
    "**/.config/gh/hosts.yml",
    "**/.config/rclone/rclone.conf",
    "**/.kaggle/kaggle.json",
    "**/.huggingface/token",
    "**/.config/huggingface/token",
    "**/.terraform.d/credentials.tfrc.json",
    ".bash_history", ".zsh_history", ".sh_history", ".history", ".python_history", ".node_repl_history",
    ".psql_history", ".mysql_history", ".sqlite_history", ".rediscli_history", ".lesshst", ".viminfo",
    "**/.local/share/fish/fish_history",
)

# The running server's own state: Jupyter's file-id and notebook-trust databases (SQLite files the server holds
# open, under the data folder: in a home-folder workspace, .local/share/jupyter), its runtime files,
# jupyter-collaboration's document history and session ids, and checkpoints. Never backed up by default, and
# never restored, whatever the snapshot holds: written under a running server, they break its open copies.
SERVER_STATE_PATTERNS = (
    "file_id_manager.db*",
    "nbsignatures.db*",
    ".local/share/jupyter/runtime/",
    ".jupyter_ystore.db*",
    ".jupyter/collaboration_sessions.json",
    ".ipynb_checkpoints/",
)

# Rebuildable or private by nature; a `!pattern` line in .spotwarpignore brings any of them back (a server's own
# state then goes into snapshots, but never comes back over a server's copy).
DEFAULT_PATTERNS = (
    *SERVER_STATE_PATTERNS,
    ".git/",
    ".hg/",
    ".svn/",
    "__pycache__/",
    "*.py[cod]",
    ".pytest_cache/",
    ".mypy_cache/",
    ".ruff_cache/",
    ".cache/",
    "checkpoints/",
    ".Trash-*/",
    ".spotwarp/",
    "*.spotwarp-tmp-*",
    # a JupyterHub workspace is the home folder: its saved layouts and package-manager caches are the host's
    ".jupyter/lab/workspaces/",
    ".npm/",
    ".ipython/profile_*/history.sqlite*",
    *CREDENTIAL_PATTERNS,
)


MEMO_SIZE = 1_000_000  # answers kept per rules object (a path's answer costs a few dozen regex matches)


class IgnoreRules:
    """gitignore-style rules for one workspace, plus absolute paths (such as a local store) never backed up."""

    def __init__(self, lines: list[str] | tuple[str, ...] = (), excluded_paths: list[str] | tuple[str, ...] = ()):
        self.lines = [*DEFAULT_PATTERNS, *lines]
        try:
            self.spec = pathspec.GitIgnoreSpec.from_lines(self.lines)
        except Exception as exc:  # noqa: BLE001 - pathspec raises several types for a bad pattern
            raise ConfigError(f"{IGNORE_FILE}: bad pattern: {exc}") from None
        self.excluded = {os.path.realpath(p) for p in excluded_paths if p}
        self._excluded_ids: set[tuple[int, int]] | None = set()
        for path in self.excluded:
            try:
                st = os.stat(path)
            except OSError:
                self._excluded_ids = None  # not there yet: compared by resolved path
                break
            self._excluded_ids.add((st.st_dev, st.st_ino))
        # the pattern part's answers, for folders and for files (the rules never change)
        self._memos: tuple[dict[str, bool], dict[str, bool]] = ({}, {})

    @classmethod
    def for_workspace(cls, root: str, excluded_paths: list[str] | tuple[str, ...] = ()) -> "IgnoreRules":
        """Defaults plus the workspace's own `.spotwarpignore`, if it has one."""
        path = Path(root) / IGNORE_FILE
        lines: list[str] = []
        if path.is_file() and not path.is_symlink():
            try:
                lines = path.read_text(encoding="utf-8").splitlines()
            except (OSError, UnicodeDecodeError) as exc:
                raise ConfigError(f"cannot read {path}: {exc}") from None
        return cls(lines, excluded_paths)

    def file_answers(self) -> tuple[dict[str, bool], frozenset[int]] | None:
        """The answers `ignored` has given for files, by path, and the inodes of the excluded paths: a file whose
        inode is not among them is left out exactly when its answer says so. A scan looks a file up there before
        calling `ignored`, once per file at a cut's instant. None when excluded paths are found by resolved path."""
        if self._excluded_ids is None:
            return None
        return self._memos[False], frozenset(ino for _dev, ino in self._excluded_ids)

    def ignored(self, relpath: str, is_dir: bool, abspath: str | None = None, st: os.stat_result | None = None) -> bool:
        """True when `relpath` (posix, relative to the workspace) is left out (`st`: its stat, when known, which
        finds an excluded path without resolving every path)."""
        if abspath is not None and self.excluded:
            if st is not None and self._excluded_ids is not None:
                if (st.st_dev, st.st_ino) in self._excluded_ids:
                    return True
            elif os.path.realpath(abspath) in self.excluded:
                return True
        memo = self._memos[is_dir]
        answer = memo.get(relpath)
        if answer is None:
            answer = self.spec.match_file(relpath + "/" if is_dir else relpath)
            if len(memo) >= MEMO_SIZE:
                memo.clear()
            memo[relpath] = answer
        return answer


_SERVER_STATE = pathspec.GitIgnoreSpec.from_lines(SERVER_STATE_PATTERNS)


def is_server_state(relpath: str) -> bool:
    """True when `relpath` (posix, relative to the workspace) is a running Jupyter server's own state: a restore
    never writes it (SERVER_STATE_PATTERNS)."""
    return _SERVER_STATE.match_file(relpath)
