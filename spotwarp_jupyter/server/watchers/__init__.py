"""Preemption watchers: every notice the host can see becomes a committed final snapshot.

`start_watchers` builds the configured watchers on the server's event loop (nothing is awaited, so
finding out which cloud this is never slows start-up) and returns them for `GET status`. Where the
firmware (DMI) names the vendor, other clouds' default endpoints are not even probed.
"""

from __future__ import annotations

from typing import Any, Awaitable, Callable

from ..kernel_link import request_safe_point_snapshot
from .base import Notice, NotThisCloud, Unreachable, Watcher
from .clouds import DEFAULT_METADATA_URL, AwsWatcher, AzureWatcher, GcpWatcher, host_cloud
from .final import PreemptionResponder
from .signals import SignalWatcher

KINDS = ("signals", "aws", "gcp", "azure")
_OFF = ("", "off", "none", "false", "0")


def start_watchers(config: Any, responder: PreemptionResponder, serverapp: Any,
                   on_exit: Callable[[], Awaitable[None]]) -> list[Watcher]:
    """Start every enabled watcher (`c.SpotWarp.watchers`, each cloud's URL not "off"); return them."""
    enabled = [w.strip().lower() for w in config.watchers]
    unknown = sorted(set(enabled) - set(KINDS))
    if unknown:
        raise ValueError(f"unknown watcher(s) {', '.join(unknown)}: choose among {', '.join(KINDS)}")
    common = {"poll_interval": config.metadata_poll_interval, "max_backoff": config.watcher_max_backoff}
    watchers: list[Watcher] = []
    cloud = host_cloud()
    for kind in KINDS:
        if kind not in enabled:
            continue
        if kind == "signals":
            watchers.append(SignalWatcher(responder, serverapp, config.shutdown_grace, on_exit))
            continue
        url = getattr(config, f"{kind}_metadata_url")
        if url.strip().lower() in _OFF:
            continue
        cls = {"aws": AwsWatcher, "gcp": GcpWatcher, "azure": AzureWatcher}[kind]
        # AWS and Azure state when the host goes (AWS: 2 minutes ahead); GCP does not (30 s)
        window = config.notice_window if kind == "gcp" else max(config.notice_window, 120.0)
        watcher = cls(responder, url, window=window, **common)
        if cloud not in (None, kind) and url.rstrip("/") == DEFAULT_METADATA_URL:
            # the firmware names another vendor: listed, never probed (an endpoint set by hand is always asked)
            watcher.state = f"off: this host is not on {kind} (firmware: {cloud})"
        watchers.append(watcher)
    for watcher in watchers:
        if not watcher.state.startswith("off"):
            watcher.start()
    return watchers


__all__ = ["AwsWatcher", "AzureWatcher", "GcpWatcher", "KINDS", "Notice", "NotThisCloud", "PreemptionResponder",
           "SignalWatcher", "Unreachable", "Watcher", "request_safe_point_snapshot", "start_watchers"]
