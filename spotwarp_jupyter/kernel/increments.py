"""Incremental snapshots of one kernel: what the next snapshot may reuse of this kernel's last one.

The names each cell can touch come from the AccessTracker (engine/incremental/access.py); which groups are reused
is engine/incremental/reuse.py's rule. This module keeps the kernel's side: the baseline (its last committed
snapshot), and the count that makes one snapshot in `SPOTWARP_FULL_EVERY` a full pass.
"""

from __future__ import annotations

import os
import warnings
from typing import Any, Mapping

from ..engine import CaptureOptions, Manifest
from ..engine.incremental import AccessTracker, Baseline, Mark, ReusePlan, notebook_code_names, plan_reuse
from ..engine.variables import cheap_size, select_variables

DEFAULT_FULL_EVERY = 20
QUICK_INBAND = 1 << 20  # in-band bytes a staged snapshot may pickle at a loop's step (~10 ms)
_SCALARS = (int, float, complex, bool, type(None))


def full_every(env: Mapping[str, str] | None = None) -> int:
    """Every how many snapshots one is a full pass regardless of tracking (`SPOTWARP_FULL_EVERY`; 0: never)."""
    text = ((os.environ if env is None else env).get("SPOTWARP_FULL_EVERY") or "").strip()
    if not text:
        return DEFAULT_FULL_EVERY
    try:
        return max(0, int(text))
    except ValueError:  # a bad setting must not stop the extension from loading: say so, keep the default
        warnings.warn(f"SPOTWARP_FULL_EVERY={text!r} is not a whole number of snapshots (0: never); "
                      f"using {DEFAULT_FULL_EVERY}", stacklevel=3)
        return DEFAULT_FULL_EVERY


def _small_scalar(value: Any) -> bool:
    """A value pickled in microseconds, whatever it is bound to (numbers, short strings)."""
    return type(value) in _SCALARS or (type(value) in (str, bytes) and len(value) <= 65536)


class Increments:
    """The baseline of a kernel's next snapshot and the names touched since it (not thread-safe: the session locks)."""

    def __init__(self) -> None:
        self.access = AccessTracker()  # fed each cell's code by the extension (kernel/extension.py)
        self.full_every = full_every()
        self.baseline: Baseline | None = None  # our last committed snapshot, for groups no code touched since
        self.since_full = 0
        self.planned: tuple[Mark, dict[str, int], CaptureOptions, bool] | None = None

    def plan(self, namespace: Mapping[str, Any], options: CaptureOptions,
             full: bool) -> tuple[ReusePlan | None, dict[str, Any]]:
        """What the next snapshot may reuse (engine/incremental/reuse.py), and the stats saying why it is full if so."""
        mark, touched, why = self.access.begin()
        used, dynamic = notebook_code_names(namespace if isinstance(namespace, dict) else dict(namespace))
        touched, why = touched | used, why or dynamic
        if full:
            why = why or "a full snapshot was asked for"
        elif self.full_every and self.since_full + 1 >= self.full_every:
            why = why or f"one snapshot in {self.full_every} is a full pass (SPOTWARP_FULL_EVERY)"
        plan, why = plan_reuse(self.baseline, touched, why, options)
        ids = {name: id(value) for name, value in namespace.items()}
        self.planned = (mark, ids, options, plan is None)
        return plan, ({"full_reason": why} if why else {})

    def remember(self, manifest: Manifest, notebook: str) -> None:
        """A snapshot this kernel planned is committed: it is the baseline of the next one."""
        planned, self.planned = self.planned, None
        record = manifest.kernels.get(notebook)
        if planned is None or record is None:
            self.baseline = None
            return
        mark, ids, options, full = planned
        self.baseline = Baseline(manifest.id, record, ids, options)
        self.access.committed(mark)
        self.since_full = 0 if full else self.since_full + 1

    def restart(self) -> None:
        """After a restore: its values are new objects, so the next snapshot is full."""
        self.baseline = self.planned = None

    @staticmethod
    def left_to_serialize(namespace: Mapping[str, Any], hidden: Mapping[str, Any], plan: ReusePlan | None,
                          options: CaptureOptions) -> dict[str, Any]:
        """The variables the next snapshot will serialize: every saveable one but those of groups the plan reuses."""
        values, _imports, _skipped = select_variables(namespace, hidden, options)
        taken = plan.split(values).names if plan is not None else set()
        return {n: v for n, v in values.items() if n not in taken}

    @staticmethod
    def little_left(left: Mapping[str, Any], plan: ReusePlan | None) -> bool:
        """Whether the plan leaves only small scalars to serialize (then no fork: a writer thread is cheaper)."""
        return plan is not None and all(_small_scalar(v) for v in left.values())

    def quick_to_serialize(self, left: Mapping[str, Any]) -> bool:
        """Whether the variables `left` to serialize are known, from the baseline, to pickle in a few milliseconds:
        at most QUICK_INBAND bytes in band (arrays' and tensors' bytes go out of band and are copied, not pickled)."""
        if self.baseline is None:
            return False
        groups = self.baseline.groups
        index = {n: i for i, g in enumerate(groups) for n in g.names}
        skipped = self.baseline.record.get("skipped") or {}  # not picklable then: refused again, quickly
        inband, counted = 0, set()
        for name, value in left.items():
            if name in skipped or _small_scalar(value) or _out_of_band(value):
                continue
            if name not in index:
                return False  # never pickled by this kernel: its size is unknown
            if index[name] not in counted:
                counted.add(index[name])
                inband += groups[index[name]].pickle.size
        return inband <= QUICK_INBAND


def _out_of_band(value: Any) -> bool:
    """An array or tensor of plain numbers: a few hundred bytes in band, whatever its size (object arrays pickle in band)."""
    if getattr(getattr(value, "dtype", None), "hasobject", False):
        return False
    return cheap_size(value) is not None and type(value).__module__.split(".")[0] in ("numpy", "torch")
