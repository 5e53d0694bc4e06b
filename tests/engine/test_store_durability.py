"""A local snapshot's objects are durable under their names before the manifest naming them commits.

The local store writes a snapshot's objects as one batch: temporaries first, then one pass syncs their data,
renames them into place and syncs their folders. These tests watch the real system calls (os.fsync,
os.fdatasync, os.replace, resolved to paths through /proc/self/fd) of real snapshots on a real folder.
"""

from __future__ import annotations

import errno
import os
import sys
from pathlib import Path

import numpy as np
import pytest

from spotwarp_jupyter.engine import StorageError
from spotwarp_jupyter.engine.hashing import object_id
from spotwarp_jupyter.engine.storage.local_files import TMP_MARK

from engines import UNSIGNED, make_engine

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/fd")


def _namespace(seed: int) -> dict:
    rng = np.random.default_rng(seed)
    # several arrays, one object each (and one for each group's stream): a batch over several fan-out folders
    return {**{f"a{i}": rng.random(200_000) for i in range(6)}, "n": seed, "s": "x" * 1000}


class SyscallLog:
    """Every sync and rename this process makes, in order, with paths."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, fail_sync_under: str | None = None):
        self.events: list[tuple[str, ...]] = []
        self.fail_sync_under = fail_sync_under
        for name in ("fsync", "fdatasync"):
            real = getattr(os, name, None)
            if real is not None:
                monkeypatch.setattr(os, name, self._sync(real))
        real_replace = os.replace

        def replace(src, dst, *args, **kwargs):
            real_replace(src, dst, *args, **kwargs)
            self.events.append(("rename", os.fspath(src), os.fspath(dst)))

        monkeypatch.setattr(os, "replace", replace)

    def _sync(self, real):
        def sync(fd):
            path = os.readlink(f"/proc/self/fd/{fd}")
            if self.fail_sync_under and path.startswith(self.fail_sync_under) and TMP_MARK in path:
                raise OSError(errno.EIO, "Input/output error")
            real(fd)
            self.events.append(("sync", path))
        return sync

    def index(self, *event: str) -> int:
        return self.events.index(event)

    def synced_between(self, path: str, after: int, before: int) -> bool:
        return any(e == ("sync", path) for e in self.events[after + 1:before])


def test_every_object_is_durable_under_its_name_before_the_manifest_commits(store_url, monkeypatch):
    engine = make_engine(store_url, "durable", key=UNSIGNED)
    for seed in (1, 2):  # a first snapshot (new folders) and one that changes part of the state
        calls = SyscallLog(monkeypatch)
        manifest = engine.snapshot_kernel(_namespace(seed), "nb.ipynb")
        store = engine.store
        manifest_path = os.path.join(store.snapshots_dir, manifest.name)
        commit = next(i for i, e in enumerate(calls.events) if e[0] == "rename" and e[2] == manifest_path)
        written = [e for e in calls.events[:commit] if e[0] == "rename" and e[2].startswith(store.objects_dir)]
        assert len(written) >= 5, calls.events  # the test must see a batch, not one object
        assert {e[2] for e in written} <= {store.object_path(oid) for oid in manifest.objects}
        for _, tmp, path in written:
            renamed = calls.index("rename", tmp, path)
            assert calls.synced_between(tmp, -1, renamed), f"{path} renamed into place before its data was synced"
            assert calls.synced_between(os.path.dirname(path), renamed, commit), \
                f"{path}'s folder not synced between its rename and the commit"
        if seed == 1:  # fan-out folders created by this snapshot: their entries in objects/ synced too
            last_rename = max(calls.index(*e) for e in written)
            assert calls.synced_between(store.objects_dir, last_rename, commit)
        # and every object the manifest names is there, whole
        for oid, size in manifest.objects.items():
            assert os.path.getsize(store.object_path(oid)) == size
        monkeypatch.undo()


def test_a_failed_sync_commits_nothing_and_names_no_object(store_url, monkeypatch):
    engine = make_engine(store_url, "durable", key=UNSIGNED)
    first = engine.snapshot_kernel(_namespace(1), "nb.ipynb")
    before = sorted(p.name for p in Path(engine.store.objects_dir).rglob("*") if p.is_file())
    SyscallLog(monkeypatch, fail_sync_under=engine.store.objects_dir)
    with pytest.raises(StorageError) as failure:
        engine.snapshot_kernel(_namespace(2), "nb.ipynb")
    monkeypatch.undo()
    message = str(failure.value)
    assert "\n" not in message and "syncing objects" in message and "Input/output error" in message
    assert [m.id for m in engine.manifests()] == [first.id]  # the previous snapshot is still the newest
    after = sorted(p.name for p in Path(engine.store.objects_dir).rglob("*") if p.is_file())
    assert after == before  # no object of the failed snapshot under its name, no temporary left behind
    # and the next snapshot writes its objects again
    again = engine.snapshot_kernel(_namespace(2), "nb.ipynb")
    assert engine.verify(again.id).ok


def test_a_batch_of_workspace_objects_is_durable_before_put_objects_returns(store_url, monkeypatch):
    store = make_engine(store_url, "durable", key=UNSIGNED).store
    calls = SyscallLog(monkeypatch)
    blobs = [os.urandom(100_000) for _ in range(6)]
    results = store.put_objects(blobs)
    monkeypatch.undo()
    for oid, _size in results:
        path = store.object_path(oid)
        rename = next(e for e in calls.events if e[0] == "rename" and e[2] == path)
        at = calls.index(*rename)
        assert calls.synced_between(rename[1], -1, at)
        assert calls.synced_between(os.path.dirname(path), at, len(calls.events))
        assert Path(path).read_bytes() in blobs


def _object_sizes() -> list[int]:
    from spotwarp_jupyter.engine.storage.pending_writes import DIRECT_MIN, DIRECT_PIECE
    # below and at the direct threshold, unaligned tails, exact multiples of the staging buffer
    return [DIRECT_MIN - 1, DIRECT_MIN, DIRECT_MIN + 1, 2 * DIRECT_PIECE + 4095, 3 * DIRECT_PIECE]


def _unaligned_buffers() -> list[memoryview]:
    raw = np.frombuffer(os.urandom(sum(_object_sizes()) + 7), dtype=np.uint8)
    views, at = [], 3  # odd offsets: no view starts on a block boundary
    for size in _object_sizes():
        views.append(memoryview(raw[at:at + size]))
        at += size + 1
    return views


def _opened_direct(monkeypatch: pytest.MonkeyPatch, refuse: str | None = None) -> list[str]:
    """Paths opened with O_DIRECT; `refuse` ('open' or 'write') makes the OS refuse it there with EINVAL."""
    import fcntl
    opened: list[str] = []
    real_open, real_write = os.open, os.write

    def open_(path, flags, *args, **kwargs):
        if flags & os.O_DIRECT:
            opened.append(os.fspath(path))
            if refuse == "open":
                real_open(path, flags & ~os.O_DIRECT, *args, **kwargs)  # as some kernels do: created, then refused
                raise OSError(errno.EINVAL, "Invalid argument")
        return real_open(path, flags, *args, **kwargs)

    def write(fd, data):
        if refuse == "write" and fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_write(fd, data)

    monkeypatch.setattr(os, "open", open_)
    monkeypatch.setattr(os, "write", write)
    return opened


@pytest.mark.parametrize("refuse", [None, "open", "write"])
def test_large_objects_bypass_the_page_cache_and_keep_every_byte(store_url, monkeypatch, refuse):
    store = make_engine(store_url, "durable", key=UNSIGNED).store
    buffers = _unaligned_buffers()
    opened = _opened_direct(monkeypatch, refuse)
    calls = SyscallLog(monkeypatch)
    results = store.put_objects(buffers)
    monkeypatch.undo()
    assert opened, "no object was written past the page cache"
    for (oid, size), data in zip(results, buffers):
        path = store.object_path(oid)
        assert Path(path).read_bytes() == bytes(data) and size == data.nbytes
        assert oid == object_id(bytes(data))  # named by its content, however it was written
        rename = next(e for e in calls.events if e[0] == "rename" and e[2] == path)
        assert calls.synced_between(rename[1], -1, calls.index(*rename))  # still synced before its rename
    leftovers = [p for p in Path(store.objects_dir).rglob("*") if TMP_MARK in p.name]
    assert not leftovers
