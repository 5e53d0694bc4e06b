"""Reusing the previous snapshot's record of a variable group that no executed code could have touched.

A group is reused (its stream and buffers named again, nothing pickled, hashed or written) only when:
the previous snapshot is this kernel's own last committed one and still its notebook's newest; the
capture options are the same; every name of the group is still bound to the very object it was bound
to then (same `id()`, kept from that snapshot); no name of it was touched since (access.py); and no
other variable to be saved now is bound to one of its objects. Anything else is serialized again.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from ..errors import SpotWarpError

EXTRAS_GROUP = "@extras"


class StaleBaseline(SpotWarpError):
    """Groups were taken over from a snapshot that is no longer the notebook's newest and lost objects since."""


@dataclass
class Baseline:
    """This kernel's last committed snapshot, as capture saw it."""

    manifest_id: str
    record: dict[str, Any]
    ids: dict[str, int]  # name -> id() of its value at the snapshot's instant
    options: Any  # the CaptureOptions it was taken with


@dataclass
class ReusePlan:
    """What the next capture may take over from the baseline, given the names touched since."""

    base_id: str
    groups: list[dict[str, Any]]
    ids: dict[str, int]
    touched: frozenset[str]
    changed: dict[str, str] = field(default_factory=dict)

    def split(self, values: Mapping[str, Any]) -> tuple[list[dict[str, Any]], dict[str, str]]:
        """(group records to reuse, `changed` notes carried over for their names); their names leave `values`."""
        candidates = []
        for group in self.groups:
            names = group.get("names") or []
            if EXTRAS_GROUP in names or not names:
                continue
            if all(n in values and n not in self.touched and id(values[n]) == self.ids.get(n) for n in names):
                candidates.append(group)
        kept_ids = {self.ids[n] for g in candidates for n in g["names"]}
        kept_names = {n for g in candidates for n in g["names"]}
        # another variable now bound to one of a reused group's objects must be saved together with it
        joined = {id(v) for n, v in values.items() if n not in kept_names} & kept_ids
        reused = [g for g in candidates if not joined & {self.ids[n] for n in g["names"]}]
        changed = {n: why for n, why in self.changed.items() if any(n in g["names"] for g in reused)}
        return reused, changed


def plan_reuse(baseline: Baseline | None, touched: frozenset[str], full_reason: str | None,
               options: Any) -> tuple[ReusePlan | None, str | None]:
    """The plan for the next snapshot, or (None, why it must be a full one)."""
    if full_reason:
        return None, full_reason
    if baseline is None:
        return None, "no earlier snapshot by this kernel"
    if baseline.options != options:
        return None, "the capture policy changed"
    return ReusePlan(baseline.manifest_id, list(baseline.record.get("groups", [])), baseline.ids, touched,
                     dict(baseline.record.get("changed") or {})), None
