"""Group records read from a manifest give back exactly what was stored, and name every object gc and verify count.

The kernel-save pipeline runs its stages in order: the values a writer is handed before grouping are those left
once the reuse plan's groups are taken over, and no group is serialized before it sees them.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from spotwarp_jupyter.engine import CaptureOptions, Settings, SnapshotEngine
from spotwarp_jupyter.engine.incremental import Baseline, plan_reuse
from spotwarp_jupyter.engine.manifests import record_objects
from spotwarp_jupyter.engine.prune import named_objects
from spotwarp_jupyter.engine.records import GroupRecord, MalformedRecord
from spotwarp_jupyter.engine.variables import capture_namespace

GOLDEN = Path(__file__).parents[1] / "golden" / "store_v1" / "golden" / "snapshots"


def _golden_manifests() -> list[dict]:
    return [json.loads(path.read_text()) for path in sorted(GOLDEN.glob("*.json"))]


def _canonical(doc: object) -> bytes:
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


def test_every_golden_group_record_round_trips_byte_for_byte():
    groups = [g for doc in _golden_manifests() for record in doc["kernels"].values() for g in record["groups"]]
    assert groups and any(g["buffers"] for g in groups)
    for stored in groups:
        assert _canonical(GroupRecord.from_dict(stored).to_dict()) == _canonical(stored)


def test_a_record_keeps_the_keys_it_lacks_and_those_it_does_not_know():
    stored = {"names": ["x"], "codec": "pickle", "pickle": {"id": "a" * 64, "size": 3, "later": 1}, "note": "kept"}
    record = GroupRecord.from_dict(stored)
    assert record.to_dict() == stored and record.requires == () and record.buffers == ()


@pytest.mark.parametrize("stored", [{"names": ["x"], "codec": "pickle"}, {"names": "x", "codec": "pickle",
                                    "pickle": {"id": "a" * 64, "size": 1}}, ["not", "a", "group"]])
def test_a_malformed_record_is_refused_by_name(stored):
    with pytest.raises(MalformedRecord):
        GroupRecord.from_dict(stored)


def test_refs_are_the_objects_gc_keeps_and_verify_reads():
    for doc in _golden_manifests():
        for record in doc["kernels"].values():
            named = set()
            for stored in record["groups"]:
                refs = {ref.id for ref in GroupRecord.from_dict(stored).refs()}
                assert refs == named_objects(stored)  # what prune walks the manifest for
                named |= refs
            assert named == set(record_objects(record))
            assert named <= set(doc["objects"])  # what verify re-reads
            if doc["kind"] == "kernel":
                assert named == set(doc["objects"])


def test_the_writer_sees_the_values_left_after_the_takeover_before_any_group_is_serialized(tmp_path):
    engine = SnapshotEngine(Settings(project="records", storage=str(tmp_path / "store")), key=b"")
    ns = {"kept": list(range(1000)), "fresh": {"v": 1}}
    options = CaptureOptions()
    first = engine.snapshot_kernel(ns, options=options)
    baseline = Baseline(first.id, first.kernels["default"], {n: id(v) for n, v in ns.items()}, options)
    plan, why = plan_reuse(baseline, frozenset({"fresh"}), None, options)
    assert plan is not None and why is None
    image = capture_namespace(ns, options=options, lazy=True, reuse=plan)
    seen: list[tuple[set[str], int]] = []
    groups = list(image.iter_groups(on_values=lambda values: seen.append((set(values), len(image.groups)))))
    assert seen == [({"fresh"}, 0)]
    assert [g.names for g in groups] == [["fresh"]]
    assert image.takeover is not None and image.takeover.names == {"kept"}
    with pytest.raises(RuntimeError):
        image.drop_reuse()  # the plan is taken over: the engine checks its objects instead
    committed = engine.commit_image(image)
    assert committed.stats["groups_reused"] == 1 and committed.stats["groups_written"] == 1
    restored: dict = {}
    engine.restore_kernel("latest", restored)
    assert restored == ns


def test_a_group_a_restore_refuses_still_has_its_objects_named():
    # no codec: GroupRecord.from_dict refuses it, but the manifest carrying it still names its objects
    stored = {"names": ["x"], "pickle": {"id": "a" * 64, "size": 3},
              "buffers": [{"size": 5, "chunks": [{"id": "b" * 64, "size": 5}]}]}
    with pytest.raises(MalformedRecord):
        GroupRecord.from_dict(stored)
    assert record_objects({"groups": [stored]}) == {"a" * 64: 3, "b" * 64: 5}
