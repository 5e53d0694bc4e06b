"""Signed snapshots: with SPOTWARP_KEY set, a host refuses what it cannot trust, and says why."""

from __future__ import annotations

import hashlib
import json
import posixpath
import subprocess
import sys

import numpy as np
import pytest

from spotwarp_jupyter.engine import DamagedObjectError, ManifestError, SnapshotEngine
from spotwarp_jupyter.engine.manifests.manifest import Manifest, _canonical, key_id

from engines import UNSIGNED, make_engine
from storage_servers import StorageTarget

KEY_A, KEY_B = b"team-secret-a", b"another-teams-secret"


def manifest_path(engine: SnapshotEngine, manifest: Manifest) -> str:
    return posixpath.join(engine.store.snapshots_dir, manifest.name)


def rewrite(engine: SnapshotEngine, manifest: Manifest, change, fix_checksum: bool = True) -> None:
    """Edit a stored manifest as an attacker with write access to the bucket (but not the key) would."""
    path = manifest_path(engine, manifest)
    doc = json.loads(engine.store.fs.cat_file(path))
    change(doc)
    if fix_checksum:
        body = {k: v for k, v in doc.items() if k not in ("checksum", "signature", "key_id")}
        doc["checksum"] = hashlib.sha256(_canonical(body)).hexdigest()
    engine.store.fs.pipe_file(path, json.dumps(doc).encode())


def first_snapshot(target: StorageTarget, key: bytes) -> Manifest:
    return make_engine(target, key=key).snapshot_kernel({"weights": np.arange(10.0), "note": "mine"}, message="ok")


def test_a_host_with_the_key_restores_a_signed_snapshot(storage: StorageTarget):
    made = first_snapshot(storage, KEY_A)
    reader = make_engine(storage, key=KEY_A)
    assert reader.get("latest").signed
    ns: dict = {}
    reader.restore_kernel(made.id, ns)
    assert ns["note"] == "mine" and ns["weights"].tolist() == list(np.arange(10.0))


def test_a_valid_snapshot_signed_with_another_key_is_refused(storage: StorageTarget):
    made = first_snapshot(storage, KEY_B)  # intact, correctly signed, by a host with a different key
    reader = make_engine(storage, key=KEY_A)
    assert reader.manifests() == []
    with pytest.raises(ManifestError, match="signed with another key") as refused:
        reader.restore_kernel(made.id, {})
    assert key_id(KEY_B) in str(refused.value) and key_id(KEY_A) in str(refused.value)
    assert "\n" not in str(refused.value)


def test_an_unsigned_snapshot_is_refused_when_a_key_is_set(storage: StorageTarget):
    made = first_snapshot(storage, UNSIGNED)
    assert not make_engine(storage, key=UNSIGNED).get(made.id).signed
    reader = make_engine(storage, key=KEY_A)
    assert reader.manifests() == []
    with pytest.raises(ManifestError, match="unsigned, but SPOTWARP_KEY is set"):
        reader.restore_kernel(made.id, {})


@pytest.mark.parametrize("fix_checksum", [True, False], ids=["checksum-recomputed", "checksum-left"])
def test_an_altered_manifest_is_refused(storage: StorageTarget, fix_checksum: bool):
    made = first_snapshot(storage, KEY_A)
    writer = make_engine(storage, key=KEY_A)

    def alter(doc: dict) -> None:  # claim the snapshot is something else
        doc["message"] = "a trusted snapshot, honest"
        doc["kernels"]["default"]["variables"]["note"]["type"] = "builtins.int"

    rewrite(writer, made, alter, fix_checksum)
    reader = make_engine(storage, key=KEY_A)
    assert reader.manifests() == []
    with pytest.raises(ManifestError, match="altered after it was signed"):
        reader.restore_kernel(made.id, {})
    assert any("altered" in reason for reason in reader.rejected.values())


def test_stripping_the_signature_does_not_help(storage: StorageTarget):
    made = first_snapshot(storage, KEY_A)
    rewrite(make_engine(storage, key=KEY_A), made, lambda doc: (doc.pop("signature"), doc.pop("key_id")))
    with pytest.raises(ManifestError, match="unsigned"):
        make_engine(storage, key=KEY_A).restore_kernel(made.id, {})


def test_a_swapped_object_is_caught_by_its_hash(storage: StorageTarget):
    # the manifest is signed and names objects by blake3: replacing an object's bytes cannot go unseen
    made = make_engine(storage, key=KEY_A).snapshot_kernel({"weights": np.arange(1000.0), "note": "mine"})
    evil = make_engine(storage, key=KEY_A).snapshot_kernel({"weights": np.zeros(1000), "note": "theirs"})
    writer = make_engine(storage, key=KEY_A)
    record = made.kernels["default"]
    evil_record = evil.kernels["default"]
    victim = next(c["id"] for g in record["groups"] for b in g["buffers"] for c in b["chunks"])
    planted = next(c["id"] for g in evil_record["groups"] for b in g["buffers"] for c in b["chunks"])
    assert victim != planted
    # the attacker puts the other snapshot's weights (same size, valid data) where the victim's were
    bytes_in = writer.store.read_object(planted)
    writer.store.fs.pipe_file(writer.store.object_path(victim), bytes_in)
    ns = {"note": "untouched"}
    with pytest.raises(DamagedObjectError, match="does not match its hash") as caught:
        make_engine(storage, key=KEY_A).restore_kernel(made.id, ns)
    assert victim in str(caught.value)
    assert ns == {"note": "untouched"}  # nothing was loaded
    report = make_engine(storage, key=KEY_A).verify(made.id)
    assert not report.ok and any(victim in p for p in report.problems)


def test_a_garbled_manifest_is_refused_as_damaged(storage: StorageTarget):
    made = first_snapshot(storage, KEY_A)
    engine = make_engine(storage, key=KEY_A)
    engine.store.fs.pipe_file(manifest_path(engine, made), b'{"format": 1, "id": "x", "half')
    reader = make_engine(storage, key=KEY_A)
    assert reader.manifests() == []
    with pytest.raises(ManifestError, match="not valid JSON"):
        reader.get(made.id)


# -- in real kernels: the way a user meets it --------------------------------------------------------
def test_kernels_with_and_without_the_right_key(tmp_path, start_kernel):
    a = start_kernel("hostA", SPOTWARP_KEY=KEY_A.decode())
    a.run("%load_ext spotwarp\nsecret_weights = [1, 2, 3]\n%spotwarp snapshot")
    snap = a.value("__import__('spotwarp_jupyter.kernel.session', fromlist=['x']).current().last.id")
    a.kill()

    same = start_kernel("hostB", SPOTWARP_KEY=KEY_A.decode())
    same.run("%load_ext spotwarp\n%spotwarp restore latest")
    assert same.value("secret_weights") == [1, 2, 3]

    other = start_kernel("hostC", SPOTWARP_KEY=KEY_B.decode())
    other.run("%load_ext spotwarp")
    ename, evalue, _out = other.run_error(f"%spotwarp restore {snap}")
    assert ename == "UsageError" and "signed with another key" in evalue and "\n" not in evalue
    assert other.value("'secret_weights' in dir()") is False


@pytest.mark.process
def test_unsigned_restore_warning_is_given_once_per_process():
    code = (
        "from spotwarp_jupyter.engine.manifests import trust_warning\n"
        "print(repr(trust_warning(b'key'))); print(repr(trust_warning(None))); print(repr(trust_warning(None)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.splitlines()
    assert out[0] == "None" and "pickle code" in out[1] and "SPOTWARP_KEY" in out[1] and out[2] == "None"


def test_a_deleted_or_replaced_newest_manifest_is_a_rollback_on_every_backend(storage: StorageTarget):
    """The signed head names the newest commit: deleting it, or putting an older signed manifest back in its place,
    is refused for `latest` in one line naming it; an explicit id still restores; a newer commit settles it."""
    from spotwarp_jupyter.engine import RolledBack

    writer = make_engine(storage, key=KEY_A)
    older = writer.snapshot_kernel({"step": 1}, message="older")
    newest = writer.snapshot_kernel({"step": 2}, message="newest")
    writer.store.fs.rm_file(manifest_path(writer, newest))  # the store's writer, without the key, rolls it back
    reader = make_engine(storage, key=KEY_A)
    with pytest.raises(RolledBack) as refused:
        reader.check_head()
    assert newest.id in str(refused.value) and "\n" not in str(refused.value)
    ns: dict = {}
    reader.restore_kernel(older.id, ns)  # by explicit id: the older state, accepted knowingly
    assert ns["step"] == 1
    later = make_engine(storage, key=KEY_A).snapshot_kernel({"step": 3}, message="after")
    make_engine(storage, key=KEY_A).check_head()  # a newer signed commit: the head is passed, nothing refused
    assert make_engine(storage, key=KEY_A).get("latest").id == later.id


@pytest.mark.parametrize("planted", [(10**12 - 1,), (500,), tuple(range(2, 22))],
                         ids=["top-of-the-range", "above-the-head", "the-next-names"])
def test_head_entries_planted_without_the_key_neither_hide_nor_freeze_the_signed_head(storage: StorageTarget,
                                                                                      planted: tuple[int, ...]):
    """A writer without the key takes head names above the newest commit's (the top of the range, or every name
    the next commits would count up to): the commits after it still record themselves in the head, so deleting
    the newest manifest is still a rollback."""
    from spotwarp_jupyter.engine import RolledBack
    from spotwarp_jupyter.engine.coordination.head import head_path

    writer = make_engine(storage, key=KEY_A)
    writer.snapshot_kernel({"step": 1}, message="first")
    for counter in planted:
        writer.store.fs.pipe_file(head_path(writer.store, counter), b'{"counter": 1, "snapshot": "x", "name": "x"}')
    writer.snapshot_kernel({"step": 2}, message="older")
    newest = writer.snapshot_kernel({"step": 3}, message="newest")
    writer.store.fs.rm_file(manifest_path(writer, newest))
    with pytest.raises(RolledBack) as refused:
        make_engine(storage, key=KEY_A).check_head()
    assert newest.id in str(refused.value)
