"""The hub config gives every user their own signing key: one user's key never signs what another accepts."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from spotwarp_jupyter.engine import ManifestError, SnapshotEngine

from engines import engine_settings
from hub_configs import load, spawner_environment

HUB_SECRET = "hub-side-secret-" + "s" * 32


def key_for(env: dict, user: str) -> str:
    """SPOTWARP_KEY as the spawner puts it in `user`'s server (a value, or a callable taking the spawner)."""
    value = env["SPOTWARP_KEY"]
    return value(SimpleNamespace(user=SimpleNamespace(name=user))) if callable(value) else value


@pytest.mark.parametrize("secret_name", ["SPOTWARP_HUB_KEY_SECRET", "SPOTWARP_KEY"])
def test_each_user_gets_their_own_key(monkeypatch, secret_name):
    config = load("jupyterhub_config.py", monkeypatch=monkeypatch, env={secret_name: HUB_SECRET})
    env = spawner_environment(config)
    alice, bob = key_for(env, "alice"), key_for(env, "bob")
    assert alice != bob
    assert HUB_SECRET not in (alice, bob)  # the hub's secret never reaches a user
    assert key_for(env, "alice") == alice and len(alice) >= 32  # the same on every spawn


def test_passing_spotwarp_key_on_as_it_is_is_not_possible(monkeypatch):
    config = load("jupyterhub_config.py", monkeypatch=monkeypatch,
                  env={"SPOTWARP_HUB_PASS_ENV": "SPOTWARP_KEY SPOTWARP_STORAGE_OPTIONS", "SPOTWARP_KEY": HUB_SECRET})
    env = spawner_environment(config)
    assert key_for(env, "alice") != HUB_SECRET


def test_a_snapshot_signed_with_bobs_key_is_refused_by_alice(monkeypatch, tmp_path: Path):
    """Even in one shared prefix (the risky layout) and with the binding aside, the keys differ."""
    monkeypatch.delenv("JUPYTERHUB_USER", raising=False)
    config = load("jupyterhub_config.py", monkeypatch=monkeypatch, env={"SPOTWARP_HUB_KEY_SECRET": HUB_SECRET})
    env = spawner_environment(config)
    settings = engine_settings(tmp_path / "store", "p")
    made = SnapshotEngine(settings, key=key_for(env, "bob").encode()).snapshot_kernel({"x": np.arange(3)})
    with pytest.raises(ManifestError, match="signed with another key"):
        SnapshotEngine(settings, key=key_for(env, "alice").encode()).restore_kernel(made.id, {})


def test_under_a_hub_the_refusal_speaks_of_the_users_own_key(monkeypatch, tmp_path: Path):
    """On a hub there is no one key to copy to every host: the refusal says whose key loads here."""
    config = load("jupyterhub_config.py", monkeypatch=monkeypatch, env={"SPOTWARP_HUB_KEY_SECRET": HUB_SECRET})
    env = spawner_environment(config)
    monkeypatch.setenv("JUPYTERHUB_USER", "alice")
    settings = engine_settings(tmp_path / "store", "p")
    made = SnapshotEngine(settings, key=key_for(env, "bob").encode()).snapshot_kernel({"x": np.arange(3)})
    with pytest.raises(ManifestError) as refused:
        SnapshotEngine(settings, key=key_for(env, "alice").encode()).restore_kernel(made.id, {})
    assert "only alice's own snapshots load here" in str(refused.value)
    assert "same SPOTWARP_KEY on every host" not in str(refused.value)
