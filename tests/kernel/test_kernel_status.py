"""A kernel's status (`%spotwarp status`, the widget's `status`, the server's status request): keys and text.

The status is a typed record (service/records.py: KernelStatus) rendered in one place (service/wire.py);
these keys and lines are what the widget, the server and users read, so they must not drift.
"""

from __future__ import annotations

import re

from kernels import SESSION

KEYS = ["project", "storage", "notebook", "policy", "last_snapshot", "in_flight", "last_pause_s", "skipped",
        "changed", "last_error", "restore", "imports", "resumed", "cadence", "trust"]
LAST_KEYS = ["id", "created", "age_s", "size", "bytes_written", "duration_s", "pause_s"]
RESTORE_KEYS = ["id", "usable_s", "complete_s", "loading", "failed"]


def test_a_fresh_kernels_status(start_kernel, store_url):
    k = start_kernel("host")
    k.run("%load_ext spotwarp\n%spotwarp off\n" + SESSION)
    status = k.value("s.status()")
    assert list(status) == KEYS
    assert status["last_snapshot"] is None and status["restore"] is None and status["last_pause_s"] is None
    assert status["policy"]["enabled"] is False and status["in_flight"] is False
    out = k.run("%spotwarp status").splitlines()
    assert out == ["SpotWarp: project proj · notebook default", f"  storage   {store_url}",
                   f"  policy    {k.value('s.policy.describe()')}", "  last      no snapshot from this kernel yet"]


def test_status_after_a_snapshot_with_a_skipped_variable_and_a_restore(start_kernel, store_url):
    k = start_kernel("host")
    k.run("%load_ext spotwarp\n%spotwarp off\n%spotwarp policy --max-var-size 1KB\n" + SESSION
          + "small = 1\nblob = b'x' * 100_000\n%spotwarp snapshot")
    status = k.value("s.status()")
    last = status["last_snapshot"]
    assert list(status) == KEYS and list(last) == LAST_KEYS
    assert last["id"] == k.value("s.last.id") and last["size"] == k.value("s.last.size")
    assert last["bytes_written"] == k.value("s.last.stats['bytes_written']") and last["pause_s"] is not None
    assert isinstance(last["age_s"], float) and last["created"].endswith("Z")
    assert set(status["skipped"]) == {"blob", "s"} and isinstance(status["last_pause_s"], float)
    out = k.run("%spotwarp status").splitlines()
    assert out[:3] == ["SpotWarp: project proj · notebook default", f"  storage   {store_url}",
                       f"  policy    {k.value('s.policy.describe()')}"]
    assert re.fullmatch(rf"  last      {last['id']} · [^·]+ ago · [^·]+ · wrote [^·]+ in [^·]+ · paused the kernel [^·]+", out[3])
    assert out[4:] == ["  skipped   (not saved)", f"    blob: {status['skipped']['blob']}",
                       f"    s: {status['skipped']['s']}"]

    k.run("%spotwarp restore")
    restore = k.value("s.status()['restore']")
    assert list(restore) == RESTORE_KEYS and restore["id"] == last["id"]
    assert restore["loading"] == [] and restore["failed"] == {}
