"""Warm standby for `spotwarp launch --watch --standby N`: candidates started for the next race before any loss.

While the watch follows a holder at generation G, N candidates of generation G+1 are launched through the provider
(the same `spotwarp start --candidate-id --generation` as a race's, so in standby: they restore, serve, write
nothing). When the holder is lost, the race for G+1 takes them as its candidates: the first is ready at once and
is promoted without waiting for a machine to start. A standby restored the snapshot that was newest when it
started; once promoted it brings its workspace up to the newest snapshot before its promotion snapshot
(docs/failover.md#warm-standby). If the race is for another generation (the lease moved meanwhile), the standbys
are torn down and the race launches fresh candidates.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from typing import Callable

from ..engine.storage import Store
from .lease import next_generation
from .liveness import ready_candidate
from .provider import FAILED, GONE, LaunchSpec, Provider
from .race import Candidate, OnEvent

log = logging.getLogger("spotwarp")
STANDBY_READY = "standby_ready"


class WarmStandby:
    """The standby candidates of one watch: launched in a thread (a provider's launch may take minutes)."""

    def __init__(self, provider: Provider, spec: LaunchSpec, store: Store, count: int, on_event: OnEvent,
                 floor: Callable[[], int] | None, stop: threading.Event, poll_s: float = 0.5):
        self.provider, self.spec, self.store, self.count = provider, spec, store, count
        self.emit, self.floor, self.stop, self.poll_s = on_event, floor, stop, poll_s
        self.lock = threading.Lock()
        self.generation = 0
        self.candidates: list[Candidate] = []
        self.abandoned = threading.Event()  # set when the current standbys are taken or dropped
        self.thread: threading.Thread | None = None

    def start(self, delay_s: float = 0.0) -> None:
        """Launch the standbys for the next generation after `delay_s` (a new holder's resume comes first)."""
        self.abandoned = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(delay_s, self.abandoned), daemon=True,
                                       name="spotwarp-standby")
        self.thread.start()

    def _run(self, delay_s: float, abandoned: threading.Event) -> None:
        if abandoned.wait(delay_s) or self.stop.is_set():
            return
        try:
            generation = next_generation(self.store, self.floor)
            offers = list(self.provider.offers(self.spec, self.count))[:self.count]
        except Exception as exc:  # noqa: BLE001 - no standby: a loss races as without one
            self.emit("standby_failed", {"error": f"{type(exc).__name__}: {exc}"})
            return
        for i, offer in enumerate(offers):
            if abandoned.is_set() or self.stop.is_set():  # taken or dropped meanwhile: launch no more
                break
            c = Candidate(f"g{generation}s{i}-{secrets.token_hex(2)}", offer, launched_at=time.time())
            try:
                c.handle = self.provider.launch(self.spec, offer, c.id, generation)
                c.state = "running"
            except Exception as exc:  # noqa: BLE001
                self.emit("standby_failed", {"candidate": c.id, "error": f"{type(exc).__name__}: {exc}"})
                continue
            with self.lock:
                if abandoned.is_set():  # taken or dropped while this one launched: it goes down at once
                    self._down(c)
                    continue
                self.generation = generation
                self.candidates.append(c)
        self._until_ready(abandoned)

    def _until_ready(self, abandoned: threading.Event) -> None:
        """Say `standby_ready` for each standby whose heartbeat says it serves in standby (its generation)."""
        waiting = list(self.candidates)
        while waiting and not abandoned.is_set() and not self.stop.is_set():
            for c in list(waiting):
                if c.handle is not None and self.provider.poll(c.handle).state in (FAILED, GONE):
                    waiting.remove(c)
                    self.emit("standby_failed", {"candidate": c.id, "error": "it stopped before serving"})
                elif ready_candidate(self.store, c.id, self.generation) is not None:
                    waiting.remove(c)
                    self.emit(STANDBY_READY, {"candidate": c.id, "generation": self.generation,
                                              "ready_s": round(time.time() - c.launched_at, 3)})
            abandoned.wait(self.poll_s)  # the poll of the store's heartbeats, ended by a take or a drop

    def take(self, generation: int) -> list[Candidate]:
        """The live standbys for `generation`, handed to its race (the others go down); none are kept after."""
        with self.lock:
            self.abandoned.set()
            taken, self.candidates = self.candidates, []
        usable = [c for c in taken if self.generation == generation and c.handle is not None
                  and self.provider.poll(c.handle).state not in (FAILED, GONE)]
        for c in taken:
            if c not in usable:
                self._down(c)
        return usable

    def drop(self, wait_s: float = 120.0) -> None:
        """Tear every standby down (the watch ends); a launch in flight is waited for (at most `wait_s`), and
        what it started goes down too."""
        self.take(-1)
        thread = self.thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(wait_s)  # abandoned: it launches no more, and downs what its launch in flight produced
            if thread.is_alive():
                log.warning("SpotWarp: a standby launch still runs after %gs: what it starts may be left up", wait_s)

    def _down(self, c: Candidate) -> None:
        if c.handle is None:
            return
        try:
            self.provider.down(c.handle)
            discard = getattr(self.provider, "discard", None)
            if discard is not None:
                discard(c.handle)
        except Exception as exc:  # noqa: BLE001 - reported by the provider's leaks at the end
            log.warning("SpotWarp: standby %s not torn down: %s", c.id, exc)
