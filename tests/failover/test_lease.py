"""The lease is a compare-and-set: of two orchestrators moving it to the same generation exactly one wins, on a
local folder and on S3 (moto). GCS: what gcsfs sends (the emulator ignores preconditions, so it cannot be a
fencing test). Deleted and damaged leases keep generations monotonic."""

from __future__ import annotations

import json
import threading
import time

import pytest

from spotwarp_jupyter.engine import SnapshotEngine
from spotwarp_jupyter.engine.coordination.fence import (
    DamagedLease,
    Fence,
    Fenced,
    Lease,
    lease_path,
    read_lease,
    write_lease,
)
from spotwarp_jupyter.engine.storage import Store
from spotwarp_jupyter.failover.lease import LeaseConflict, move_lease, next_generation

from engines import UNSIGNED, make_engine


def promote_concurrently(url: str, options: dict, generation: int) -> list[str]:
    """Two orchestrators (own Store each) move the lease to `generation` at once; who was told "promoted"."""
    barrier = threading.Barrier(2)
    won: list[str] = []
    errors: list[BaseException] = []

    def promoter(name: str) -> None:
        store = Store(url, "p", options)
        barrier.wait()
        try:
            move_lease(store, generation, name)
            won.append(name)
        except LeaseConflict:
            pass
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=promoter, args=(n,)) for n in ("left", "right")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    return won


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["local", "s3"])
def test_two_concurrent_promotions_never_both_succeed(kind, request, tmp_path):
    if kind == "local":
        url, options = str(tmp_path / "store"), {}
    else:
        target = request.getfixturevalue("serial_s3_server").target()
        url, options = target.url, target.options
    store = Store(url, "p", options)
    both = 0
    for generation in range(1, 101):
        won = promote_concurrently(url, options, generation)
        both += len(won) == 2
        lease = read_lease(store)
        assert lease.generation == generation and lease.holder in won, (generation, won, lease)
        assert len(won) == 1, f"trial {generation}: {won} were both told promoted"
    assert both == 0


def test_a_moved_lease_never_moves_back_or_sideways(tmp_path):
    store = Store(str(tmp_path / "store"), "p")
    assert move_lease(store, 1, "a").holder == "a"
    with pytest.raises(LeaseConflict, match="generation 1 .holder a."):
        move_lease(store, 1, "b")  # the same generation: taken
    assert not write_lease(store, Lease(1, "b", time.time()))  # an entry is never replaced
    assert read_lease(store).holder == "a"
    move_lease(store, 3, "c")  # generations may skip (a race's floor), never go back
    with pytest.raises(LeaseConflict):
        move_lease(store, 2, "d")
    assert (read_lease(store).generation, read_lease(store).holder) == (3, "c")


def test_gcsfs_sends_if_generation_match_0_for_the_lease(gcs_server, link_to):
    """gcp-storage-emulator ignores preconditions (a second create succeeds there), so this checks the request."""
    link = link_to(gcs_server)
    target = gcs_server.target(port=link.port)
    store = Store(target.url, "p", {**target.options, "skip_instance_cache": True})
    link.record = True
    assert store.create_record(lease_path(store, 7), b'{"generation": 7, "holder": "x", "time": 1}')
    sent = bytes(link.sent)
    assert b"ifGenerationMatch=0" in sent, sent[:2000]


def test_s3_create_only_sends_if_none_match(s3_server, link_to):
    link = link_to(s3_server)
    target = s3_server.target(port=link.port)
    store = Store(target.url, "p", {**target.options, "skip_instance_cache": True})
    link.record = True
    assert store.create_record(lease_path(store, 7), b"{}")
    assert b"if-none-match: *" in bytes(link.sent).lower()
    assert not store.create_record(lease_path(store, 7), b"[]")  # moto honours it: the second create is refused


def engine_for(url: str, fence: Fence = Fence()) -> SnapshotEngine:
    return make_engine(url, "p", key=UNSIGNED, fence=fence)


def test_a_deleted_lease_keeps_generations_above_every_snapshot(tmp_path):
    url = str(tmp_path / "store")
    plain = engine_for(url)
    plain.snapshot_kernel({"x": 1}, "nb")
    move_lease(plain.store, 1, "c1")
    move_lease(plain.store, 2, "c2")
    holder = engine_for(url, Fence(2, "c2"))
    written = holder.snapshot_kernel({"x": 2}, "nb")
    assert written.generation == 2
    for path in (tmp_path / "store" / "p" / "lease").iterdir():
        path.unlink()  # someone deletes the lease
    with pytest.raises(Fenced, match="standby"):
        holder.snapshot_kernel({"x": 3}, "nb")  # no lease names it: it writes nothing (and its heartbeat says why)
    floor = lambda: max(m.generation for m in plain.manifests())  # noqa: E731 - what `spotwarp launch` passes
    assert next_generation(plain.store, floor) == 3
    move_lease(plain.store, 3, "c3")
    new = engine_for(url, Fence(3, "c3")).snapshot_kernel({"x": 4}, "nb")
    latest = engine_for(url).get("latest")
    assert latest.id == new.id and latest.generation == 3


@pytest.mark.parametrize("damage", [b"{not json", b'{"generation": "soon"}', b"[]", b'{"generation": 9, "holder": "c2"}'])
def test_a_damaged_lease_fences_everybody_until_launch_moves_past_it(tmp_path, damage):
    url = str(tmp_path / "store")
    plain = engine_for(url)
    move_lease(plain.store, 1, "c1")
    move_lease(plain.store, 2, "c2")
    entry = tmp_path / "store" / "p" / "lease" / "000000000002.json"
    entry.write_bytes(damage)
    with pytest.raises(DamagedLease, match="moves the lease past it .to generation 3"):
        read_lease(plain.store)
    with pytest.raises(Fenced):
        engine_for(url, Fence(2, "c2")).snapshot_kernel({"x": 1}, "nb")
    with pytest.raises(Fenced):
        engine_for(url, Fence(1, "c1")).snapshot_kernel({"x": 1}, "nb")  # an older holder never gets it back
    assert next_generation(plain.store) == 3  # the way out: the next race claims generation 3
    move_lease(plain.store, 3, "c3")
    assert read_lease(plain.store).holder == "c3"
    assert engine_for(url, Fence(3, "c3")).snapshot_kernel({"x": 2}, "nb").generation == 3


def test_an_old_lease_json_is_read_and_counted(tmp_path):
    url = str(tmp_path / "store")
    store = Store(url, "p")
    (tmp_path / "store" / "p" / "lease.json").write_text(json.dumps({"generation": 4, "holder": "old", "time": 1}))
    assert read_lease(store).holder == "old"
    assert next_generation(store) == 5
    move_lease(store, 5, "new")
    assert (read_lease(store).generation, read_lease(store).holder) == (5, "new")


def test_a_lease_the_watch_cannot_read_is_no_loss_until_the_holder_says_it_stopped_writing(tmp_path, monkeypatch):
    """Without a key, a damaged newest lease entry: the watch warns and keeps watching the holder's heartbeat; only
    when the holder itself says it stopped writing (lease_lost) is it a loss, raced past."""
    from spotwarp_jupyter.engine.coordination.heartbeats import write_heartbeat
    from spotwarp_jupyter.failover.watch import Holder, detect_loss

    from waiting import wait_for

    monkeypatch.delenv("SPOTWARP_KEY", raising=False)
    store = Store(str(tmp_path / "store"), "p")
    assert write_lease(store, Lease(1, "h1", time.time()))
    beat = {"id": "h1", "candidate": "h1", "generation": 1, "state": "holder", "time": time.time(), "beat": 1,
            "pid": 1, "interval": 1.0}
    write_heartbeat(store, beat)
    assert store.create_record(lease_path(store, 2), b'{"generation": "soon"')
    events: list[str] = []
    found: list = []
    stop = threading.Event()
    watch = threading.Thread(target=lambda: found.append(detect_loss(
        store, Holder("h1", 1, time.time()), 60.0, None, stop, poll_s=0.05, on_event=lambda kind, _: events.append(kind))))
    watch.start()
    try:
        wait_for(lambda: found or "lease_unreadable" in events, "the watch's first round")
        assert found == [] and events == ["lease_unreadable"], (found, events)
        write_heartbeat(store, {**beat, "state": "standby", "beat": 2, "time": time.time(), "lease_lost": True})
        loss = wait_for(lambda: found and found[0], "the loss")
        assert loss.reason == "lease damaged", loss
    finally:
        stop.set()
        watch.join(30)
