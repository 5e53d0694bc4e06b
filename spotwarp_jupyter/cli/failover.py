"""`spotwarp launch`, `watch` and `hosts`: racing candidate hosts and following the one serving (docs/failover.md)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

from ..engine import ConfigError
from ..engine.units import format_duration
from .common import EXIT_FAILURE, EXIT_OK, _engine, _print, _projects_there, _stored_engine, command


@command("watch")
def cmd_watch(args: argparse.Namespace) -> int:
    args.watch, args.adopt_only = True, True
    _check_dead_after(args)  # before anything is created in the store: a refused watch leaves no trace
    return cmd_launch(args)


@command("launch")
def cmd_launch(args: argparse.Namespace) -> int:
    import signal
    import threading

    from ..failover.announcements import Announcement, refuse_second_watch
    from ..failover.providers import make_provider

    provider = make_provider(args.provider, dict(args.provider_options))
    _refuse_host_local_storage(args, provider)
    engine = _existing_project(args)
    engine.settle_key()  # a new project gets its key here: every candidate signs with the same one; each says
    # in its own start what a missing key means for its resume
    spec = _launch_spec(args, engine)
    store = engine.store

    def floor() -> int:
        """The highest generation a snapshot of the project recorded (the lease may have lost it)."""
        return max((m.generation for m in engine.manifests()), default=0)

    def say(kind: str, data: dict[str, Any]) -> None:
        if args.json:
            print(json.dumps({"event": kind, "time": round(time.time(), 3), **data}, sort_keys=True, default=str),
                  flush=True)
            return
        print(_launch_line(kind, data), flush=True)

    stop = threading.Event()
    announcement = None
    # SIGTERM and SIGHUP (a closed terminal) end a race as Ctrl-C does: every unpromoted candidate goes down
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda *_: stop.set())
    if args.watch:
        refuse_second_watch(store, engine.settings.project, stop)
        announcement = Announcement(store, engine.settings.project).start()
    try:
        return _launch_and_watch(args, engine, provider, spec, store, say, stop, floor)
    finally:
        if announcement is not None:
            announcement.end()


def _launch_and_watch(args: argparse.Namespace, engine: Any, provider: Any, spec: Any, store: Any, say: Any,
                      stop: Any, floor: Any) -> int:
    from ..failover.launch import LaunchPlan, launch

    plan = LaunchPlan(candidates=args.candidates, timeout=args.timeout, dead_after=args.dead_after, watch=args.watch,
                      adopt_only=getattr(args, "adopt_only", False), replace=getattr(args, "replace", False),
                      standby=args.standby)
    leaks = launch(plan, engine.settings.project, provider, spec, store, say, stop, floor)
    if leaks:
        print(f"spotwarp launch: still up after teardown: {'; '.join(leaks)}", file=sys.stderr)
        return EXIT_FAILURE
    return EXIT_OK


def _existing_project(args: argparse.Namespace) -> Any:
    """The project's engine, refusing (before anything is created) a project with no snapshot: a typo in
    --storage or --project-id would otherwise race an empty session. `--allow-empty` races it anyway."""
    from ..engine import StorageError

    allow_empty = getattr(args, "allow_empty", False)
    check = not allow_empty and not getattr(args, "adopt_only", False)
    try:
        engine = _engine(args, create=False)
    except StorageError as exc:
        if allow_empty:
            return _engine(args, create=True)
        if not check or "does not exist" not in str(exc):
            raise
        engine = None
    if check and (engine is None or not engine.manifests()):
        settings = engine.settings if engine is not None else _settings(args)
        others = _projects_there(engine) if engine is not None else []
        there = f" (projects there: {', '.join(others)})" if others else ""
        raise ConfigError(f"project {settings.project!r} has no snapshot in {settings.storage}{there} (a typo in "
                          "--project-id or --storage?): take one with `spotwarp snapshot` or `spotwarp start` first, "
                          "or pass --allow-empty to race an empty session")
    return engine


HOST_LOCAL_PROTOCOLS = ("file", "local", "memory")


def _refuse_host_local_storage(args: argparse.Namespace, provider: Any) -> None:
    """A provider whose hosts are other machines needs storage they all reach: refuse a folder on this one (each
    cloud host would restore from its own empty disk) in one line, before anything is created."""
    if not getattr(provider, "shared_storage_only", False):
        return
    storage = _settings(args).storage
    protocol = storage.split("://", 1)[0].lower() if "://" in storage else "file"
    if protocol in HOST_LOCAL_PROTOCOLS:
        raise ConfigError(f"--provider {provider.name} needs storage every host reaches (s3://, gs://, ...), but "
                          f"{storage} is on this machine only: each cloud host would restore from its own empty disk")


def _settings(args: argparse.Namespace) -> Any:
    from ..engine import Settings
    from ..jupyter_config import server_config_layer

    return Settings.resolve(project=getattr(args, "project", None), storage=args.storage,
                            config=server_config_layer())


def _launch_spec(args: argparse.Namespace, engine: Any) -> Any:
    """What each candidate runs: the project, its storage and key, the offer wanted; checks --dead-after."""
    from ..failover.provider import LaunchSpec

    env = _check_dead_after(args)
    if engine.key:  # to the candidates through their environment (SkyPilot: its secrets), never a command line
        env["SPOTWARP_KEY"] = engine.key.decode()
    if engine.settings.storage_options:
        env["SPOTWARP_STORAGE_OPTIONS"] = json.dumps(engine.settings.storage_options)
    return LaunchSpec(engine.settings.project, engine.settings.storage, args.gpus, tuple(args.clouds),
                      args.max_price, args.remote_workspace, env, args.remote_port)


def _check_dead_after(args: argparse.Namespace) -> dict[str, str]:
    """Refuse a --dead-after shorter than two of the candidates' heartbeats; the environment passed to them."""
    from ..engine.settings import resolve_setting
    from ..jupyter_config import server_config_layer

    passed = ("SPOTWARP_KEY", "SPOTWARP_STORAGE_OPTIONS", "SPOTWARP_HEARTBEAT_INTERVAL")
    env = {name: os.environ[name] for name in passed if os.environ.get(name)}
    # the candidates' heartbeat, as their servers will resolve it (0, off, still leaves 5 s for the check)
    beat = resolve_setting("heartbeat_interval", env=env, config=server_config_layer()) or 5.0
    if args.dead_after < 2 * beat:
        raise ConfigError(f"--dead-after {format_duration(args.dead_after)} is too short for heartbeats every "
                          f"{format_duration(beat)} (SPOTWARP_HEARTBEAT_INTERVAL): give at least twice that")
    return env


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
        url = d.get("url")  # the provider's own; a provider that knows none (SkyPilot) prints none
        return f"promoted {d['candidate']} (generation {d['generation']})" + (f": {url}" if url else "")
    if kind == "failover_finished":
        return (f"session served by {d['winner']} on {d['offer']}: detect {fmt(d.get('detect_s'))}, provision "
                f"{fmt(d.get('provision_s'))}, restore and serve {fmt(d.get('restore_serve_s'))}, race "
                f"{fmt(d.get('race_s'))}, total {fmt(d.get('total_s'))}")
    if kind == "host_lost":
        return f"host {d['lost']} lost ({d['reason']}), detected {fmt(d.get('detect_s'))} after its last sign"
    if kind == "race_failed":
        return f"race failed: {d['error']}; trying again"
    if kind == "clock_skew":
        behind = d["behind_s"]
        return (f"warning: the clock of {d['host']} is {abs(behind):g} s {'behind' if behind > 0 else 'ahead of'} "
                "this machine's (silence is judged on this machine's clock alone; check NTP on both)")
    if kind == "store_unreachable":
        return f"warning: the store is unreachable ({d['error']}); the watch retries and declares nothing meanwhile"
    if kind == "store_reachable":
        return f"the store answers again after {fmt(d.get('outage_s'))}; watching {d['holder']}"
    if kind == "store_slow":
        return (f"warning: the store took {fmt(d.get('read_s'))} to answer; the watch counts {d['holder']}'s "
                "silence again from now")
    if kind == "replace_requested":
        return f"asking {d['holder']} for a final snapshot before replacing it"
    if kind == "replace_snapshot":
        if d.get("snapshot"):
            return f"{d['holder']} committed its final snapshot {d['snapshot']}; racing its replacement"
        return (f"warning: {d['holder']} committed no final snapshot within {fmt(d.get('waited_s'))}: racing its "
                "replacement from the latest snapshot (work since then on it is lost)")
    if kind == "promotion_unseen":
        return (f"warning: {d['candidate']} has not shown itself holder within {fmt(d.get('waited_s'))}: is "
                "SPOTWARP_KEY the same here and on the hosts? (a lease entry signed with another key, or unsigned "
                "where a host has a key, is refused there)")
    if kind == "standby_ready":
        return (f"standby {d['candidate']} serves in standby for generation {d['generation']} after "
                f"{fmt(d.get('ready_s'))}: a loss promotes it at once")
    if kind == "standby_failed":
        return f"warning: no standby{' ' + d['candidate'] if d.get('candidate') else ''}: {d['error']}"
    if kind == "provider_note":
        return str(d["note"])
    if kind == "adopted":
        return f"watching {d['holder']} (generation {d['generation']}), already serving"
    if kind == "stopped":
        leaks = f"; still up after teardown: {'; '.join(d['leaks'])}" if d.get("leaks") else ""
        return f"stopped watching: {d['holder']} stays up and serves the session{leaks}"
    return f"{kind}: {json.dumps(d, default=str)}"


@command("hosts")
def cmd_hosts(args: argparse.Namespace) -> int:
    from ..failover.hosts import survey

    engine = _stored_engine(args)
    now = time.time()
    hosts = survey(engine.store, now, prune_older_than=args.prune)
    data = {"project": engine.settings.project, "lease": {**hosts.lease.as_dict(), "damaged": hosts.damaged},
            "hosts": hosts.hosts, "unreadable": hosts.unreadable, "pruned": hosts.pruned, "more": hosts.more}
    _print(args, data, _hosts_text(data, hosts.lease, hosts.damaged, now))
    return EXIT_OK


def _hosts_text(data: dict[str, Any], lease: Any, damaged: str | None, now: float) -> str:
    from ..engine.coordination.heartbeats import MAX_HOSTS

    hosts, unreadable, pruned = data["hosts"], data["unreadable"], data["pruned"]
    lines = [f"lease    DAMAGED: {damaged}" if damaged else
             f"lease    generation {lease.generation}, holder {lease.holder or '- (no failover yet)'}"
             + (f", since {format_duration(now - lease.time)} ago" if lease.time else "")]
    if hosts:
        lines.append(f"{'id':<22} {'state':<18} {'gen':>4} {'beat':>8} {'restored':<10} {'restore':>8}  url")
    for h in hosts:
        restore = h.get("restore") or {}
        mark = " *" if h["id"] == lease.holder else ""
        state = f"lost (was {h['state']})" if h["stale"] else h["state"]
        lines.append(f"{h['id'][:22]:<22} {state:<18} {h['generation']:>4} "
                     f"{format_duration(h['age_s']) + ' ago':>8} {str(restore.get('snapshot') or '-'):<10} "
                     f"{_seconds(restore.get('duration_s')):>8}  {h.get('url') or ''}{mark}")
    if not hosts:
        lines.append("no host has written a heartbeat for this project")
    if unreadable:
        lines.append(f"{len(unreadable)} unreadable file(s) in hosts/ skipped (damaged, or unsigned where SPOTWARP_KEY "
                     f"is set): {', '.join(unreadable[:5])}" + (" ..." if len(unreadable) > 5 else "")
                     + " (`spotwarp hosts --prune` removes old ones)")
    if data["more"]:
        lines.append(f"{data['more']} more heartbeat file(s) not read (at most {MAX_HOSTS})")
    if pruned:
        lines.append(f"pruned {len(pruned)}: {', '.join(pruned[:10])}" + (" ..." if len(pruned) > 10 else ""))
    return "\n".join(lines)


def _seconds(value: Any) -> str:
    return format_duration(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else "-"
