"""Progressive restore: small variables are bound at once, large ones load behind them in a thread.

The loading thread reads, checks and unpickles the large groups (in dependency order, against a copy
of the namespace as it was once the small groups were bound) but never touches the namespace: the
kernel binds each finished group from its main thread, between cells (`bind_ready`), so a group is
bound only whole and verified, and a running cell never sees the namespace change under it.
A group that fails (a damaged object, an unpickling error), and every group that needs a name it
defines, is left unbound and reported once.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from .. import pickling
from ..errors import SpotWarpError
from ..records import GroupRecord, group_records
from ..storage import Store
from ..timings import phase
from .capture import EXTRAS_NAME
from .load import (
    LoadResult,
    _select_groups,
    change_notes,
    load_group,
    moved_notes,
    read_pool,
    restore_groups,
    start_reads,
)

# A group holding more than this (pickle stream and buffers) loads in the background. Rebuilding costs
# about 1 ms a MiB for arrays (read and hash) and up to 4 ms a MiB for a column of Python strings, so no
# group bound at once holds the kernel back much over 15 ms.
EAGER_BYTES = 4 * 1024 * 1024
# ... and once the groups bound at once hold this much together, the rest load in the background too
# (a notebook of a hundred 3 MiB arrays is usable as soon as a notebook of ten).
EAGER_TOTAL_BYTES = 32 * 1024 * 1024


def split_groups(groups: list[GroupRecord], order: list[int], eager_bytes: int = EAGER_BYTES,
                 eager_total: int = EAGER_TOTAL_BYTES) -> tuple[list[int], list[int]]:
    """(groups bound at once, groups loaded behind them), each in dependency order.

    A group is deferred when it is large, when the groups bound at once would hold more than `eager_total`
    with it, or when it needs a name a deferred group defines. The group holding `EXTRAS_NAME` (RNG states,
    modules, positions) is never deferred for its size.
    """
    eager: list[int] = []
    deferred: list[int] = []
    later: set[str] = set()
    total = 0
    for i in order:
        group = groups[i]
        size = group.nbytes
        extras = EXTRAS_NAME in group.names
        large = not extras and (size > eager_bytes or total + size > eager_total)
        if large or later & set(group.requires):
            deferred.append(i)
            later.update(group.names)
        else:
            eager.append(i)
            total += size
    return eager, deferred


class BackgroundLoad:
    """Large groups being read, checked and rebuilt by a thread; bound by the caller with `bind_ready`."""

    def __init__(self, store: Store, record: dict[str, Any], groups: list[GroupRecord], namespace: dict[str, Any],
                 device_map: dict[str, str] | None, result: LoadResult, started: float):
        """Read and rebuild `groups` (of `record`, in order), from a thread of its own."""
        self.record = record
        self.result = result
        self.started = started
        self._groups = groups
        self._pending = {n for g in self._groups for n in g.names if n != EXTRAS_NAME}
        self._ready: list[list[tuple[str, Any]]] = []
        self._loaded: set[str] = set()
        self._failed: dict[str, str] = {}
        self._moved: set[str] = set()
        self._said: list[str] = []
        self._reported = False
        self._lock = threading.Lock()
        self.done = threading.Event()
        result.loading = sorted(self._pending)
        self._thread = threading.Thread(target=self._run, args=(store, dict(namespace), device_map),
                                        name="spotwarp-restore", daemon=True)
        self._thread.start()

    # -- the loading thread -------------------------------------------------------------------
    def _run(self, store: Store, namespace: dict[str, Any], device_map: dict[str, str] | None) -> None:
        try:
            # the reads are queued from here, not by the caller: queuing a few hundred chunk reads starts the
            # pool's threads, each start waiting until its thread runs (about 3 ms on 2 busy cores), and the
            # caller's kernel is usable as soon as the small groups are bound
            with read_pool(store) as pool:
                reads = start_reads(store, self._groups, pool)
                with pickling.main_namespace(namespace) as main, pickling.device_notes(device_map) as notes:
                    for read in reads:
                        self._rebuild(read, main)
                    self._moved = set(notes.moved)
                    self._said = list(notes.said)
        except BaseException as exc:  # noqa: BLE001 - whatever stops the thread is reported, never lost
            with self._lock:
                for name in self._pending - set(self._failed) - self._loaded:
                    self._failed[name] = f"{type(exc).__name__}: {exc}"
        finally:
            self.result.complete_s = time.perf_counter() - self.started
            self.done.set()

    def _rebuild(self, read: Any, main: pickling.main_namespace) -> None:
        names = [n for n in read.group.names if n != EXTRAS_NAME]
        missing = sorted(set(read.group.requires) & set(self._failed))
        if missing:
            read.cancel()
            self._fail(names, f"it needs {', '.join(missing)}, which could not be restored")
            return
        try:
            with phase("wait for reads"):
                data, buffers, n = read.result()
            values = list(load_group(read.group, data, buffers).items())
        except Exception as exc:  # noqa: BLE001 - one group's failure leaves the others to load
            read.cancel()
            self._fail(names, str(exc) if isinstance(exc, SpotWarpError) else f"{type(exc).__name__}: {exc}")
            return
        for name, value in values:
            main.bind(name, value)
        with self._lock:
            self.result.bytes_read += n
            self._ready.append(values)
            self._loaded.update(name for name, _v in values)

    def _fail(self, names: list[str], why: str) -> None:
        with self._lock:
            for name in names:
                self._failed[name] = why

    # -- the kernel's side ----------------------------------------------------------------------
    def pending(self) -> set[str]:
        """Names not bound yet: still loading, or loaded and waiting for `bind_ready`."""
        with self._lock:
            return set(self._pending)

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until every large group is loaded or failed; False on timeout."""
        return self.done.wait(timeout)

    def bind_ready(self, namespace: dict[str, Any]) -> list[str]:
        """Bind every group loaded so far into `namespace` (call from the thread that runs the user's code)."""
        with self._lock:
            ready, self._ready = self._ready, []
        bound = []
        for values in ready:
            for name, value in values:
                namespace[name] = value
                bound.append(name)
        with self._lock:
            self._pending -= set(bound) | set(self._failed)
            self.result.loading = sorted(self._pending)
            self.result.failed = dict(self._failed)
        self.result.restored.extend(bound)
        self.result.warnings.extend(change_notes(self.record, bound))
        if self.done.is_set() and not self._ready and not self._pending:
            self.result.warnings.extend(moved_notes(self._moved) + self._said)
            self._moved, self._said = set(), []
        return bound

    def finished(self) -> bool:
        """True once every large group is bound or failed."""
        return self.done.is_set() and not self.pending() and not self._ready

    def failure_report(self) -> str | None:
        """One line naming what could not be restored, and why: the first time it is asked once loading ended."""
        if not self.done.is_set() or self._reported or not self._failed:
            return None
        self._reported = True
        reasons: dict[str, list[str]] = {}
        for name, why in sorted(self._failed.items()):
            reasons.setdefault(why, []).append(name)
        parts = [f"{', '.join(names)} ({why})" for why, names in reasons.items()]
        return "SpotWarp restore: could not restore " + "; ".join(parts) + "; every other variable is restored"


def restore_progressive(
    store: Store, record: dict[str, Any], namespace: dict[str, Any], variables: list[str] | None = None,
    device_map: dict[str, str] | None = None, eager_bytes: int = EAGER_BYTES,
) -> tuple[LoadResult, BackgroundLoad | None]:
    """Bind the small groups now (all or nothing, as `load_record`); load the large ones behind them."""
    started = time.perf_counter()
    result = LoadResult(skipped_at_snapshot=dict(record.get("skipped", {})))
    groups = group_records(record)
    eager, deferred = split_groups(groups, _select_groups(groups, variables), eager_bytes)
    restore_groups(store, record, [groups[i] for i in eager], namespace, variables, device_map, result)
    result.usable_s = time.perf_counter() - started
    if not deferred:
        result.complete_s = result.usable_s
        return result, None
    # the large reads start once the small groups are bound: started with them (before their unpickling),
    # they made the kernel usable 0.1-0.2 s later at 1-4 GB (0.4-0.6x a raw read at 1 GB, the goal is 0.3x)
    # on 2 shared cores for 0.05-0.3 s off the whole restore
    return result, BackgroundLoad(store, record, [groups[i] for i in deferred], namespace, device_map, result,
                                  started)
