"""What drives failover is signed with SPOTWARP_KEY (engine.signing): lease entries, heartbeats, events, requests.

With the key set, a record that is unsigned, altered, signed with another key, or copied to another name or
project is refused and changes nothing; without it, records are read as before. On a local store and moto S3.
"""

from __future__ import annotations

import json
import time

import pytest

from spotwarp_jupyter.engine.coordination.fence import (
    DamagedLease,
    Lease,
    lease_entry_times,
    read_lease,
    write_lease,
)
from spotwarp_jupyter.engine.coordination.heartbeats import read_heartbeat, read_request, write_heartbeat, write_request
from spotwarp_jupyter.engine.journal.events import NOTICE_SEEN, Event, Journal
from spotwarp_jupyter.engine.signing import RecordRefused, check_record, sign_record
from spotwarp_jupyter.engine.storage import Store
from spotwarp_jupyter.failover.lease import LeaseConflict, UnsignedEntry, move_lease, next_generation
from spotwarp_jupyter.failover.liveness import BeatClock

KEY = "record-signing-test-key"


@pytest.fixture(params=["local", "s3"])
def store(request, tmp_path, monkeypatch) -> Store:
    monkeypatch.setenv("SPOTWARP_KEY", KEY)
    if request.param == "local":
        return Store(str(tmp_path / "store"), "p")
    target = request.getfixturevalue("s3_server").target()
    return Store(target.url, "p", {**target.options, "skip_instance_cache": True})


def put(store: Store, name: str, doc: object) -> None:
    """An unsigned record, as a store writer without the key writes it."""
    store.write_record(f"{store.root}/{name}", json.dumps(doc).encode())


def test_a_forged_lease_entry_changes_nothing_and_moves_no_generation(store, monkeypatch):
    assert write_lease(store, Lease(2, "real-2", time.time()))
    put(store, "lease/000000000099.json", {"generation": 99, "holder": "attacker", "time": time.time()})
    put(store, "lease/000000000100.json", "{garbage")
    assert read_lease(store) == read_lease(store, key=KEY.encode())
    assert read_lease(store).holder == "real-2"
    assert sorted(lease_entry_times(store)) == [2]  # the late-write screen counts signed entries only
    generation = next_generation(store)
    assert generation == 3  # signed entries alone set the next generation
    assert move_lease(store, generation, "real-3").generation == 3
    assert read_lease(store).holder == "real-3"
    monkeypatch.delenv("SPOTWARP_KEY")
    with pytest.raises(DamagedLease):  # without the key, the same entries read as they are: the newest is junk
        read_lease(store)


def test_a_flood_of_unsigned_entries_above_the_holder_changes_nothing(store):
    """70 unsigned entries, junk and well-formed, right above the holder's generation: the holder stays, and the
    next real move takes the first name the flood left free (a create-only write on a junk name never succeeds)."""
    assert write_lease(store, Lease(2, "real-2", time.time()))
    for generation in range(3, 73):
        doc = "{junk" if generation % 2 else {"generation": generation, "holder": "attacker", "time": time.time()}
        put(store, f"lease/{generation:012d}.json", doc)
    assert read_lease(store) == read_lease(store)  # read again: verdicts held, still the same holder
    assert (read_lease(store).generation, read_lease(store).holder) == (2, "real-2")
    assert sorted(lease_entry_times(store)) == [2]
    assert next_generation(store) == 73
    assert move_lease(store, 73, "real-73").holder == "real-73"
    assert read_lease(store).holder == "real-73"


def test_a_signed_entry_copied_to_another_generation_or_project_is_refused(store):
    assert write_lease(store, Lease(3, "real-3", time.time()))
    raw = store.read_record(f"{store.root}/lease/000000000003.json")
    store.write_record(f"{store.root}/lease/000000000009.json", raw.replace(b'"generation": 3', b'"generation": 9'))
    other = Store(store.url, "q", store._options)
    other.write_record(f"{other.root}/lease/000000000003.json", raw)
    assert read_lease(store).holder == "real-3"
    assert read_lease(other) == Lease()  # a signature binds the project: nobody holds q


def test_an_unsigned_entry_taking_the_raced_generation_is_not_another_orchestrator(store):
    assert write_lease(store, Lease(1, "real-1", time.time()))
    put(store, "lease/000000000002.json", {"generation": 2, "holder": "attacker", "time": time.time()})
    with pytest.raises(UnsignedEntry):
        move_lease(store, 2, "real-2")  # a failed race (raced again above), not a conflict ending the watch
    assert write_lease(store, Lease(3, "other-3", time.time()))
    with pytest.raises(LeaseConflict):
        move_lease(store, 3, "real-3")  # a signed entry: another orchestrator with the key took it


def test_without_a_key_a_damaged_newest_entry_still_fences(store, monkeypatch):
    monkeypatch.delenv("SPOTWARP_KEY")
    assert write_lease(store, Lease(1, "real-1", time.time()))
    put(store, "lease/000000000002.json", "{garbage")
    with pytest.raises(DamagedLease):
        read_lease(store)


def test_unsigned_or_altered_heartbeats_and_requests_are_no_news(store):
    beat = {"id": "h-1", "generation": 1, "state": "holder", "time": time.time(), "beat": 5, "pid": 42}
    write_heartbeat(store, beat)
    assert read_heartbeat(store, "h-1")["beat"] == 5
    raw = json.loads(store.read_record(f"{store.root}/hosts/h-1.json"))
    put(store, "hosts/h-1.json", {**raw, "beat": 6})  # altered
    assert read_heartbeat(store, "h-1") is None
    put(store, "hosts/h-2.json", {**beat, "id": "h-2"})  # unsigned
    assert read_heartbeat(store, "h-2") is None
    put(store, "hosts/h-3.json", {**raw, "id": "h-3"})  # a signed one copied to another host's name
    assert read_heartbeat(store, "h-3") is None
    write_request(store, "h-1", {"request": "a" * 16, "kind": "final_snapshot", "generation": 1})
    assert read_request(store, "h-1")["request"] == "a" * 16
    put(store, "requests/h-1.json", {"request": "b" * 16, "kind": "final_snapshot", "generation": 1})
    assert read_request(store, "h-1") is None


def test_unsigned_or_altered_events_are_skipped_and_signed_ones_read_back(store):
    journal = Journal(store)
    real = journal.record(NOTICE_SEEN, host_id="h-1", fatal=True)
    forged = Event(NOTICE_SEEN, time.time() + 1, "attacker", details={"host_id": "h-1", "fatal": True})
    put(store, f"events/{forged.name}", forged.as_dict())
    altered = json.loads(json.dumps(sign_record(real.as_dict(), KEY.encode(), "p", "events/x.json")))
    put(store, "events/20991231T000000000Z-notice_seen-0000.json", altered)  # signed for another name
    events = Journal(store).events()
    assert [e.host for e in events] == [real.host] and events[0].details["host_id"] == "h-1"


def test_check_record_names_why():
    body = {"generation": 1}
    signed = sign_record(body, b"k1", "p", "lease/1.json")
    assert check_record(signed, b"k1", "p", "lease/1.json") == body
    assert check_record(body, None, "p", "lease/1.json") == body  # no key: read as before
    for doc, key, project, name, why in [
        (body, b"k1", "p", "lease/1.json", "unsigned"),
        (signed, b"k2", "p", "lease/1.json", "another key"),
        ({**signed, "generation": 2}, b"k1", "p", "lease/1.json", "altered"),
        (signed, b"k1", "q", "lease/1.json", "altered"),
        (signed, b"k1", "p", "lease/2.json", "altered"),
        ([], b"k1", "p", "lease/1.json", "not a JSON object"),
    ]:
        with pytest.raises(RecordRefused, match=why):
            check_record(doc, key, project, name)


def test_a_replayed_older_beat_is_no_sign_of_life():
    clock = BeatClock(since=0.0)
    assert clock.see({"pid": 7, "beat": 10, "time": 1.0, "state": "holder"}) is True
    assert clock.see({"pid": 7, "beat": 11, "time": 2.0, "state": "holder"}) is True
    assert clock.see({"pid": 7, "beat": 10, "time": 1.0, "state": "holder"}) is False  # replayed
    assert clock.see({"pid": 7, "beat": 11, "time": 2.0, "state": "holder"}) is False  # replayed again
    assert clock.see({"pid": 8, "beat": 1, "time": 3.0, "state": "holder"}) is True  # a restarted process


def test_a_signed_entry_replaced_by_a_forged_one_stops_counting(store):
    """The late-write screen remembers which entries are signed (they are create-only), by the object's identity
    (inode and mtime; ETag): a signed entry deleted and re-created unsigned under its name, within the same
    second, is read again and refused."""
    assert write_lease(store, Lease(2, "real-2", time.time()))
    assert sorted(lease_entry_times(store)) == [2]
    store.fs.rm(f"{store.root}/lease/000000000002.json")
    put(store, "lease/000000000002.json", {"generation": 2, "holder": "attacker", "time": time.time()})
    assert sorted(lease_entry_times(store, key=b"")) == [2]  # there, for a reader without the key
    assert lease_entry_times(store) == {}
