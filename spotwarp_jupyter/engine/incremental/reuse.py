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
from ..records import GroupRecord, readable_groups

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
    # the record's groups, read once (when it becomes the baseline, not in the pause of the next snapshot);
    # a stored group that cannot be read is never taken over: its variables are serialized again
    groups: list[GroupRecord] = field(init=False)

    def __post_init__(self) -> None:
        self.groups = readable_groups(self.record.get("groups") or ())


@dataclass(frozen=True)
class Takeover:
    """What a capture took over from a reuse plan: group records named again as they are (nothing pickled,
    hashed or written), and the `changed` notes carried over for their names."""

    base_id: str
    groups: tuple[GroupRecord, ...] = ()
    changed: Mapping[str, str] = field(default_factory=dict)

    @property
    def names(self) -> set[str]:
        """The variables the taken-over groups hold (no longer serialized)."""
        return {n for g in self.groups for n in g.names}

    def objects(self) -> dict[str, int]:
        """object id -> size of every object the taken-over groups name."""
        return {oid: size for g in self.groups for oid, size in g.objects().items()}


@dataclass
class ReusePlan:
    """What the next capture may take over from the baseline, given the names touched since."""

    base_id: str
    groups: list[GroupRecord]
    ids: dict[str, int]
    touched: frozenset[str]
    changed: dict[str, str] = field(default_factory=dict)

    def split(self, values: Mapping[str, Any]) -> Takeover:
        """The groups of `values` to take over as the baseline stored them (their names are not serialized)."""
        candidates = []
        for group in self.groups:
            names = group.names
            if EXTRAS_GROUP in names or not names:
                continue
            if all(n in values and n not in self.touched and id(values[n]) == self.ids.get(n) for n in names):
                candidates.append(group)
        kept_ids = {self.ids[n] for g in candidates for n in g.names}
        kept_names = {n for g in candidates for n in g.names}
        # another variable now bound to one of a reused group's objects must be saved together with it
        joined = {id(v) for n, v in values.items() if n not in kept_names} & kept_ids
        reused = tuple(g for g in candidates if not joined & {self.ids[n] for n in g.names})
        changed = {n: why for n, why in self.changed.items() if any(n in g.names for g in reused)}
        return Takeover(self.base_id, reused, changed)


def plan_reuse(baseline: Baseline | None, touched: frozenset[str], full_reason: str | None,
               options: Any) -> tuple[ReusePlan | None, str | None]:
    """The plan for the next snapshot, or (None, why it must be a full one)."""
    if full_reason:
        return None, full_reason
    if baseline is None:
        return None, "no earlier snapshot by this kernel"
    if baseline.options != options:
        return None, "the capture policy changed"
    return ReusePlan(baseline.manifest_id, list(baseline.groups), baseline.ids, touched,
                     dict(baseline.record.get("changed") or {})), None
