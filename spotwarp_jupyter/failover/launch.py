"""What `spotwarp launch` and `spotwarp watch` do once their arguments are read: adopt the live holder or race for
a new one, move a live project to a new host after its final snapshot (`--replace`), then follow the holder
(`--watch`). Events go to `say`; the CLI only parses, calls this and prints."""

from __future__ import annotations

import secrets
import threading
import time
from dataclasses import dataclass
from typing import Callable

from ..engine.coordination.heartbeats import delete_request, write_request
from ..engine.errors import ConfigError, SpotWarpError
from ..engine.journal import FINAL_SNAPSHOT_COMMITTED, Journal
from ..engine.storage import Store
from ..engine.units import format_duration
from .provider import LaunchSpec, Provider
from .race import OnEvent, finish, race, wait_promotion_seen
from .watch import Holder, adopt, holder_of, watch


@dataclass(frozen=True)
class LaunchPlan:
    """The choices of one `launch` or `watch`: how many candidates race, how long a race may take, when a silent
    holder is lost, and whether to follow it (`watch`), only adopt a live one (`adopt_only`), move it (`replace`),
    or keep warm standbys for the next race (`standby`, with `watch` only)."""

    candidates: int
    timeout: float
    dead_after: float
    watch: bool = False
    adopt_only: bool = False
    replace: bool = False
    standby: int = 0


def launch(plan: LaunchPlan, project: str, provider: Provider, spec: LaunchSpec, store: Store, say: OnEvent,
           stop: threading.Event, floor: Callable[[], int]) -> list[str]:
    """Serve `project` from one host, and follow it with `plan.watch`; the provider's leaks (machines still up
    after teardown) at the end. One-line ConfigError / SpotWarpError for choices that cannot hold."""
    if plan.standby and not plan.watch:
        raise ConfigError("--standby keeps candidates for the next race of a watch: use it with --watch")
    holder = adopt(store, plan.dead_after, stop)
    if holder is not None and not plan.watch and not plan.replace:
        raise SpotWarpError(f"project {project!r} is served by the live host {holder.id} (generation "
                            f"{holder.generation}): follow it with `spotwarp watch`, or move it to a new host with "
                            "`spotwarp launch --replace` (it takes a final snapshot first)")
    if holder is not None and plan.replace:
        final_snapshot(store, holder, say, timeout=min(plan.timeout, 120.0), stop=stop)
        holder = None
    if holder is None and plan.adopt_only:
        raise SpotWarpError(f"no live host serves project {project!r} (no heartbeat within "
                            f"{format_duration(plan.dead_after)}): start one with `spotwarp launch`")
    if holder is not None and holder.interval and plan.dead_after < 2 * holder.interval:
        raise ConfigError(f"--dead-after {format_duration(plan.dead_after)} is too short for {holder.id}, which beats "
                          f"every {format_duration(holder.interval)}: give at least twice that")
    if holder is not None:
        say("adopted", {"holder": holder.id, "generation": holder.generation})
    else:
        if getattr(provider, "notice", None):
            say("provider_note", {"note": provider.notice})
            provider.notice = None
        result = race(provider, spec, store, plan.candidates, timeout=plan.timeout, on_event=say, floor=floor,
                      stop=stop)
        wait_promotion_seen(store, result, timeout=min(30.0, max(5.0, plan.dead_after)), on_event=say)
        say("failover_finished", finish(store, result, "launch"))
        holder = holder_of(result)
    if plan.watch:
        try:
            holder = watch(provider, spec, store, plan.candidates, holder, plan.dead_after, stop, say,
                           race_timeout=plan.timeout, floor=floor, standby=plan.standby)
        except KeyboardInterrupt:
            stop.set()
        say("stopped", {"holder": holder.id, "leaks": provider.leaks()})
    return provider.leaks()


def final_snapshot(store: Store, holder: Holder, say: OnEvent, timeout: float, stop: threading.Event) -> str | None:
    """Ask the live holder for a final snapshot (through the store: its next beat reads the request) and wait
    for it; the snapshot's id, or None (said) when none came within `timeout`."""
    nonce = secrets.token_hex(8)
    write_request(store, holder.id, {"request": nonce, "kind": "final_snapshot", "generation": holder.generation,
                                     "window_s": timeout, "time": time.time()})
    say("replace_requested", {"holder": holder.id, "request": nonce})
    deadline = time.monotonic() + timeout
    found = None
    try:
        while found is None and time.monotonic() < deadline and not stop.is_set():
            found = next((e for e in Journal(store).events(limit=50) if e.event == FINAL_SNAPSHOT_COMMITTED
                          and e.details.get("kind") == f"replace-{nonce}" and e.details.get("host_id") == holder.id),
                         None)
            if found is None:
                stop.wait(0.5)  # deadline-bounded poll of the store
    finally:
        delete_request(store, holder.id)
    say("replace_snapshot", {"holder": holder.id, "snapshot": found.snapshot if found else None,
                             "waited_s": round(timeout - max(0.0, deadline - time.monotonic()), 3)})
    return found.snapshot if found else None
