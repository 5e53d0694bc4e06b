"""The watch against an S3 store (moto) that stops answering without refusing: the storage client's own
retries hold a read through the outage and it then succeeds, with nothing raised for the watch to see."""

from __future__ import annotations

import os
import queue
import threading
import time

import pytest

from spotwarp_jupyter.cli.failover import _launch_line
from spotwarp_jupyter.engine.coordination.fence import HOLDER
from spotwarp_jupyter.engine.coordination.heartbeats import write_heartbeat
from spotwarp_jupyter.engine.storage import Store
from spotwarp_jupyter.failover.lease import move_lease
from spotwarp_jupyter.failover.watch import Holder, detect_loss

pytestmark = pytest.mark.slow  # a 12 s outage, then a real loss to detect

DEAD_AFTER = 4.0
STALL_S = 12.0  # the outage: three times --dead-after


def _beating(store: Store, stop: threading.Event) -> None:
    """The holder's heartbeat, every 0.5 s, as a server writes it."""
    beat = 0
    while not stop.is_set():
        beat += 1
        write_heartbeat(store, {"id": "h1", "generation": 1, "state": HOLDER, "time": time.time(), "beat": beat,
                                "interval": 0.5, "pid": os.getpid()})
        stop.wait(0.5)


def test_a_read_held_open_through_an_outage_is_no_silence_and_a_dead_host_is_still_seen(s3_server, link_to):
    to_watch, to_host = link_to(s3_server), link_to(s3_server)  # the orchestrator's and the holder's own paths
    prefix = os.urandom(6).hex()
    watch_target = s3_server.target(prefix, port=to_watch.port)
    host_target = s3_server.target(prefix, port=to_host.port)
    watch_store = Store(watch_target.url, "p", {**watch_target.options, "skip_instance_cache": True})
    host_store = Store(host_target.url, "p", {**host_target.options, "skip_instance_cache": True})
    move_lease(watch_store, 1, "h1")
    host_stop, watch_stop = threading.Event(), threading.Event()
    host = threading.Thread(target=_beating, args=(host_store, host_stop), daemon=True)
    host.start()
    said: queue.Queue = queue.Queue()

    def watching() -> None:
        loss = detect_loss(watch_store, Holder("h1", 1, time.time()), DEAD_AFTER, None, watch_stop,
                           on_event=lambda kind, data: said.put((kind, data)))
        said.put(("returned", loss))

    watcher = threading.Thread(target=watching, daemon=True)
    watcher.start()
    try:
        # both paths hang: the watch's read in flight waits, the holder's next beat waits
        to_watch.stall()
        to_host.stall()
        watch_stop.wait(STALL_S)  # the outage's length, part of the scenario
        to_watch.restore()
        # the watch's read comes back with the beat from before the outage, while the holder's is still held
        kind, data = said.get(timeout=120)
        assert kind == "store_slow", (kind, data)
        assert data["read_s"] >= DEAD_AFTER / 2 and data["holder"] == "h1"
        assert "took" in _launch_line(kind, data)
        to_host.restore()
        try:
            kind, data = said.get(timeout=3 * DEAD_AFTER)  # the host's beats come through: nothing to say
            raise AssertionError(f"the watch said {kind} {data} of a holder that beats again")
        except queue.Empty:
            pass
        # the grace is not blindness: a holder that stops beating is still declared lost
        host_stop.set()
        host.join(60)
        kind, loss = said.get(timeout=60)
        assert kind == "returned" and loss is not None and loss.reason == "no heartbeat", (kind, loss)
    finally:
        to_watch.restore()
        to_host.restore()
        host_stop.set()
        watch_stop.set()
        watcher.join(60)
