"""One operation lists the snapshots folder once: each LIST is a network round trip on S3 or GCS.

The store is a local folder seen through a test-only fsspec protocol (`counted://`) that counts the
listings of `snapshots/`; everything else is the real local filesystem.
"""

from __future__ import annotations

import numpy as np
from fsspec.implementations.local import LocalFileSystem
from fsspec.registry import register_implementation

from spotwarp_jupyter.engine import Settings, SnapshotEngine
from spotwarp_jupyter.kernel.policy import Policy
from spotwarp_jupyter.kernel.session import KernelSession

from engines import UNSIGNED, engine_settings


class CountedFileSystem(LocalFileSystem):
    """The local disk; `listings` counts each listing of a `snapshots` folder."""

    protocol = "counted"
    root_marker = "/"
    listings = 0

    @classmethod
    def _strip_protocol(cls, path):
        return super()._strip_protocol(path.removeprefix("counted://"))

    def ls(self, path, detail=False, **kwargs):
        if path.rstrip("/").endswith("/snapshots"):
            type(self).listings += 1
        return super().ls(path, detail=detail, **kwargs)


register_implementation("counted", CountedFileSystem, clobber=True)


def _store(tmp_path) -> Settings:
    settings = engine_settings("counted://" + str(tmp_path / "store"), resolved=False)
    engine = SnapshotEngine(settings, key=UNSIGNED)
    engine.snapshot_kernel({"x": np.arange(4)}, notebook="a.ipynb")
    engine.snapshot_kernel({"x": np.arange(5)}, notebook="a.ipynb")
    engine.snapshot_kernel({"y": 1}, notebook="b.ipynb")
    return settings


def _listings(run) -> int:
    CountedFileSystem.listings = 0
    run()
    return CountedFileSystem.listings


def test_an_engine_restore_lists_the_store_once(tmp_path):
    settings = _store(tmp_path)
    engine = SnapshotEngine(settings, key=UNSIGNED)  # a new host: nothing cached
    ns: dict = {}
    assert _listings(lambda: engine.restore_kernel("latest", ns, notebook="a.ipynb")) == 1
    assert ns["x"].tolist() == [0, 1, 2, 3, 4]
    first = engine.manifests("a.ipynb")[-1].id
    assert _listings(lambda: engine.restore_kernel(first[:5], ns, notebook="a.ipynb")) == 1
    assert ns["x"].tolist() == [0, 1, 2, 3]


def test_a_kernel_restore_lists_the_store_once(tmp_path):
    settings = _store(tmp_path)
    ns: dict = {}
    session = KernelSession(ns, {}, settings, Policy(enabled=False), notebook="a.ipynb")
    assert _listings(lambda: session.restore("latest", wait=True)) == 1
    assert ns["x"].tolist() == [0, 1, 2, 3, 4]
