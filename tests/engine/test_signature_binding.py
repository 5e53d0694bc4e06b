"""A signature is valid only where it was made: same project, same storage prefix, same hub user.

A signed manifest and its objects copied (by someone with write access to the bucket, not the key) from
another prefix, project or hub user are refused, in one line naming both places; the same store read
from another host (another folder, another home) is accepted.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import posixpath
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from spotwarp_jupyter.engine import ManifestError, SnapshotEngine
from spotwarp_jupyter.engine.manifests.manifest import _canonical

from engines import make_engine
from storage_servers import StorageTarget

KEY = b"one-key-for-the-whole-team"


def elsewhere(target: StorageTarget, suffix: str) -> StorageTarget:
    """Another prefix in the same bucket (or another folder), reached the same way."""
    return replace(target, url=target.url + suffix)


def copy_project(source: SnapshotEngine, dest: SnapshotEngine) -> int:
    """Copy every manifest and object of `source`'s project into `dest`'s, byte for byte."""
    fs = source.store.fs
    files = fs.find(source.store.root)
    for path in files:
        relative = posixpath.relpath(path, source.store.root)
        target = posixpath.join(dest.store.root, relative)
        dest.store.fs.makedirs(posixpath.dirname(target), exist_ok=True)
        dest.store.fs.pipe_file(target, fs.cat_file(path))
    return len(files)


def planted(target: StorageTarget, to: StorageTarget, project: str = "proj", to_project: str = "proj"):
    """A signed snapshot made at `target`, copied to `to`; the engine reading it there."""
    made = make_engine(target, project, key=KEY).snapshot_kernel({"payload": np.arange(5.0), "who": "theirs"})
    reader = make_engine(to, to_project, key=KEY)
    assert copy_project(make_engine(target, project, key=KEY), reader) >= 2
    assert reader.store.manifest_names(), "the copy is there to be read"
    return made, reader


def test_a_signed_snapshot_copied_to_another_prefix_is_refused(storage: StorageTarget):
    other = elsewhere(storage, "-victim")
    made, reader = planted(storage, other)
    assert reader.manifests() == []
    ns = {"mine": 1}
    with pytest.raises(ManifestError) as refused:
        reader.restore_kernel(made.id, ns)
    message = str(refused.value)
    assert "\n" not in message and made.id in message
    assert storage.url.split("://")[-1] in message and other.url.split("://")[-1] in message, message
    assert ns == {"mine": 1}  # nothing was loaded
    with pytest.raises(ManifestError):
        reader.restore_kernel("latest", ns)
    assert make_engine(storage, key=KEY).get(made.id).signed  # where it was made, it is fine


def test_a_signed_snapshot_copied_to_another_project_is_refused(storage: StorageTarget):
    made, reader = planted(storage, storage, project="theirs", to_project="proj")
    with pytest.raises(ManifestError, match="theirs"):
        reader.restore_kernel(made.id, {})


def test_a_signed_snapshot_of_another_hub_user_is_refused(tmp_path: Path, monkeypatch):
    shared = StorageTarget("local", str(tmp_path / "shared-store"))  # one prefix for everyone: the risky layout
    monkeypatch.setenv("JUPYTERHUB_USER", "bob")
    made = make_engine(shared, key=KEY).snapshot_kernel({"who": "bob"})
    monkeypatch.setenv("JUPYTERHUB_USER", "alice")
    reader = make_engine(shared, key=KEY)
    with pytest.raises(ManifestError) as refused:
        reader.restore_kernel(made.id, {})
    assert "bob" in str(refused.value) and "alice" in str(refused.value) and "\n" not in str(refused.value)
    monkeypatch.setenv("JUPYTERHUB_USER", "bob")
    ns: dict = {}
    make_engine(shared, key=KEY).restore_kernel(made.id, ns)
    assert ns == {"who": "bob"}


def test_the_same_store_from_another_host_is_accepted(tmp_path: Path, monkeypatch):
    """The default store under the home folder, copied to a new host whose home is elsewhere."""
    monkeypatch.delenv("JUPYTERHUB_USER", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "laptop-home"))
    laptop = StorageTarget("local", str(tmp_path / "laptop-home" / ".spotwarp" / "store"))
    made = make_engine(laptop, key=KEY).snapshot_kernel({"weights": np.arange(4.0)})
    monkeypatch.setenv("HOME", str(tmp_path / "vm-home"))
    vm = StorageTarget("local", str(tmp_path / "vm-home" / ".spotwarp" / "store"))
    copy_project(make_engine(laptop, key=KEY), make_engine(vm, key=KEY))
    ns: dict = {}
    make_engine(vm, key=KEY).restore_kernel("latest", ns)
    assert ns["weights"].tolist() == [0.0, 1.0, 2.0, 3.0] and made.id == make_engine(vm, key=KEY).get("latest").id


def test_the_same_folder_read_with_another_home_is_accepted(tmp_path: Path, monkeypatch):
    """`~/.spotwarp/store` of alice, read at the same path by a process whose HOME differs (sudo, a service)."""
    monkeypatch.delenv("JUPYTERHUB_USER", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "alice"))
    store = StorageTarget("local", str(tmp_path / "alice" / ".spotwarp" / "store"))
    made = make_engine(store, key=KEY).snapshot_kernel({"x": 7})
    monkeypatch.setenv("HOME", str(tmp_path / "root"))
    ns: dict = {}
    make_engine(store, key=KEY).restore_kernel(made.id, ns)
    assert ns == {"x": 7}


def test_kernels_on_two_hosts_share_one_signed_store(start_kernel):
    a = start_kernel("hostA", SPOTWARP_KEY=KEY.decode())
    a.run("%load_ext spotwarp\nresult = {'epoch': 3}\n%spotwarp snapshot")
    a.kill()
    b = start_kernel("hostB", SPOTWARP_KEY=KEY.decode())
    b.run("%load_ext spotwarp\n%spotwarp restore latest")
    assert b.value("result") == {"epoch": 3}


def test_a_signed_manifest_without_a_binding_is_refused(storage: StorageTarget):
    """What an older SpotWarp signed (no storage binding) cannot be told apart from a copy: re-make it."""
    engine = make_engine(storage, key=KEY)
    made = engine.snapshot_kernel({"x": 1})
    path = posixpath.join(engine.store.snapshots_dir, made.name)
    doc = json.loads(engine.store.fs.cat_file(path))
    for name in ("checksum", "signature", "key_id", "scope"):
        doc.pop(name, None)
    payload = _canonical(doc)
    doc["checksum"] = hashlib.sha256(payload).hexdigest()
    doc["signature"] = hmac.new(KEY, payload, hashlib.sha256).hexdigest()  # signed as before, with the key
    engine.store.fs.pipe_file(path, json.dumps(doc).encode())
    with pytest.raises(ManifestError, match="storage location") as refused:
        make_engine(storage, key=KEY).restore_kernel(made.id, {})
    assert "\n" not in str(refused.value) and made.id in str(refused.value)
