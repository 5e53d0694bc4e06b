"""`spotwarp launch`, `watch` and `hosts`: racing candidate hosts and following the one serving (docs/failover.md)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

from ..engine import ConfigError, SpotWarpError
from ..engine.units import format_duration
from .common import EXIT_FAILURE, EXIT_OK, _engine, _print, command


@command("watch")
def cmd_watch(args: argparse.Namespace) -> int:
    args.watch, args.adopt_only = True, True
    return cmd_launch(args)


@command("launch")
def cmd_launch(args: argparse.Namespace) -> int:
    import signal
    import threading

    from ..failover.race import finish, race, wait_promotion_seen
    from ..failover.registry import make_provider
    from ..failover.watch import adopt, holder_of, watch

    engine = _engine(args, create=True)
    provider = make_provider(args.provider, dict(args.provider_options))
    spec = _launch_spec(args, engine)
    store = engine.store

    def say(kind: str, data: dict[str, Any]) -> None:
        if args.json:
            print(json.dumps({"event": kind, "time": round(time.time(), 3), **data}, sort_keys=True, default=str),
                  flush=True)
            return
        print(_launch_line(kind, data), flush=True)

    stop = threading.Event()
    if args.watch:
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
    holder = adopt(store, args.dead_after) if args.watch else None
    if holder is None and getattr(args, "adopt_only", False):
        raise SpotWarpError(f"no live host serves project {engine.settings.project!r} (no heartbeat within "
                            f"{format_duration(args.dead_after)}): start one with `spotwarp launch`")
    if holder is not None:
        say("adopted", {"holder": holder.id, "generation": holder.generation})
    else:
        result = race(provider, spec, store, args.candidates, timeout=args.timeout, on_event=say)
        wait_promotion_seen(store, result, timeout=min(30.0, max(5.0, args.dead_after)))
        say("failover_finished", finish(store, result, "launch"))
        holder = holder_of(result)
    if args.watch:
        try:
            holder = watch(provider, spec, store, args.candidates, holder, args.dead_after, stop, say,
                           race_timeout=args.timeout)
        except KeyboardInterrupt:
            stop.set()
        say("stopped", {"holder": holder.id, "leaks": provider.leaks()})
    leaks = provider.leaks()
    if leaks:
        print(f"spotwarp launch: still up after teardown: {'; '.join(leaks)}", file=sys.stderr)
        return EXIT_FAILURE
    return EXIT_OK


def _launch_spec(args: argparse.Namespace, engine: Any) -> Any:
    """What each candidate runs: the project, its storage and key, the offer wanted; checks --dead-after."""
    from ..engine.settings import resolve_setting
    from ..failover.provider import LaunchSpec
    from ..jupyter_config import server_config_layer

    passed = ("SPOTWARP_KEY", "SPOTWARP_STORAGE_OPTIONS", "SPOTWARP_HEARTBEAT_INTERVAL")
    env = {name: os.environ[name] for name in passed if os.environ.get(name)}
    # the candidates' heartbeat, as their servers will resolve it (0, off, still leaves 5 s for the check)
    beat = resolve_setting("heartbeat_interval", env=env, config=server_config_layer()) or 5.0
    if args.dead_after < 2 * beat:
        raise ConfigError(f"--dead-after {format_duration(args.dead_after)} is too short for heartbeats every "
                          f"{format_duration(beat)} (SPOTWARP_HEARTBEAT_INTERVAL): give at least twice that")
    if engine.settings.storage_options:
        env["SPOTWARP_STORAGE_OPTIONS"] = json.dumps(engine.settings.storage_options)
    return LaunchSpec(engine.settings.project, engine.settings.storage, args.gpus, tuple(args.clouds),
                      args.max_price, args.remote_workspace, env, args.remote_port)


def _launch_line(kind: str, d: dict[str, Any]) -> str:
    fmt = lambda s: "-" if s is None else format_duration(s)  # noqa: E731
    if kind == "race_started":
        return (f"race for generation {d['generation']}: "
                + ", ".join(f"{c['id']} ({c['offer']})" for c in d["candidates"]))
    if kind == "candidate_failed":
        return f"candidate {d['id']} dropped: {d.get('message') or d.get('state')}"
    if kind == "candidate_ready":
        return (f"candidate {d['id']} serves the restored session (provision {fmt(d.get('provision_s'))}, "
                f"restore and serve {fmt(d.get('restore_serve_s'))})")
    if kind == "promoted":
        return f"promoted {d['candidate']} (generation {d['generation']}): {d.get('url') or ''}"
    if kind == "failover_finished":
        return (f"session served by {d['winner']} on {d['offer']}: detect {fmt(d.get('detect_s'))}, provision "
                f"{fmt(d.get('provision_s'))}, restore and serve {fmt(d.get('restore_serve_s'))}, race "
                f"{fmt(d.get('race_s'))}, total {fmt(d.get('total_s'))}")
    if kind == "host_lost":
        return f"host {d['lost']} lost ({d['reason']}), detected {fmt(d.get('detect_s'))} after its last sign"
    if kind == "race_failed":
        return f"race failed: {d['error']}; trying again"
    if kind == "adopted":
        return f"watching {d['holder']} (generation {d['generation']}), already serving"
    return f"{kind}: {json.dumps(d, default=str)}"


@command("hosts")
def cmd_hosts(args: argparse.Namespace) -> int:
    from ..engine.coordination import age, read_heartbeats, read_lease

    engine = _engine(args)
    lease = read_lease(engine.store)
    now = time.time()
    hosts = [{**doc, "age_s": round(age(doc, now) or 0.0, 1)} for doc in read_heartbeats(engine.store)]
    data = {"project": engine.settings.project, "lease": lease.as_dict(), "hosts": hosts}
    lines = [f"lease    generation {lease.generation}, holder {lease.holder or '- (no failover yet)'}"
             + (f", since {format_duration(now - lease.time)} ago" if lease.time else "")]
    if hosts:
        lines.append(f"{'id':<22} {'state':<9} {'gen':>4} {'beat':>8} {'restored':<10} {'restore':>8}  url")
    for h in hosts:
        restore = h.get("restore") or {}
        mark = " *" if h.get("id") == lease.holder else ""
        lines.append(f"{str(h.get('id'))[:22]:<22} {str(h.get('state')):<9} {h.get('generation', 0):>4} "
                     f"{format_duration(h['age_s']) + ' ago':>8} {restore.get('snapshot') or '-':<10} "
                     f"{format_duration(restore['duration_s']) if restore.get('duration_s') is not None else '-':>8}  "
                     f"{h.get('url') or ''}{mark}")
    if not hosts:
        lines.append("no host has written a heartbeat for this project")
    _print(args, data, "\n".join(lines))
    return EXIT_OK
