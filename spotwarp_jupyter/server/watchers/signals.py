"""SIGTERM and SIGINT to the server: the final snapshot, then a clean exit, within the grace period.

Kubernetes, most clouds' shutdown and RunPod send SIGTERM, then SIGKILL after a grace period (30 s by
default on Kubernetes, about 5 s on RunPod). SpotWarp takes over the server's own handlers only where the
server installed them (a `jupyter lab` process; not a server embedded in tests or another application).
A second SIGINT (Ctrl-C twice) stops at once, as Jupyter does.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from typing import Any, Awaitable, Callable

from .base import Notice, OnNotice, Watcher

log = logging.getLogger("spotwarp")
EXIT_RESERVE_S = 1.5  # stopping kernels and the server after the final commit


class SignalWatcher(Watcher):
    """Turns SIGTERM/SIGINT into a notice whose deadline is the grace period, then exits."""

    name = "signals"

    def __init__(self, on_notice: OnNotice, serverapp: Any, grace: float, on_exit: Callable[[], Awaitable[None]]):
        super().__init__(on_notice)
        self.serverapp = serverapp
        self.grace = grace
        self.on_exit = on_exit
        self.previous: dict[int, Any] = {}
        self.triggered: float | None = None
        self.done = asyncio.Event()

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "grace_s": self.grace}

    def start(self) -> None:
        own = getattr(self.serverapp, "_signal_stop", None)
        try:
            current = signal.getsignal(signal.SIGTERM)
        except ValueError:
            current = None
        if own is None or current != own:
            self.state = "off: the server does not handle SIGTERM itself here (embedded or test server)"
            return
        self._loop = asyncio.get_running_loop()
        try:
            for sig in (signal.SIGTERM, signal.SIGINT):
                self.previous[sig] = signal.signal(sig, self._handle)
        except ValueError as exc:  # not the main thread
            self.state = f"off: {exc}"
            return
        self.state = f"watching (final snapshot within {self.grace:g} s of SIGTERM or SIGINT)"

    async def stop(self) -> None:
        for sig, handler in self.previous.items():
            try:
                if signal.getsignal(sig) == self._handle:
                    signal.signal(sig, handler)
            except ValueError:
                pass
        self.previous.clear()
        if not self.state.startswith(("off", "notice")):
            self.state = "stopped"

    def _handle(self, sig: int, frame: Any) -> None:
        """The Python-level handler: hand over to the event loop (never block in a signal handler)."""
        if self.triggered is not None:
            if sig == signal.SIGINT:  # Ctrl-C again: stop now
                self.serverapp._signal_stop(sig, frame)
            return
        self.triggered = time.time()
        self._loop.call_soon_threadsafe(lambda: asyncio.ensure_future(self._respond(sig)))

    async def _respond(self, sig: int) -> None:
        name = signal.Signals(sig).name
        seen = self.triggered or time.time()
        notice = Notice(self.name, name, seen + max(1.0, self.grace - EXIT_RESERVE_S), True, key=name, seen=seen,
                        watcher=self)
        self.last_notice = notice
        self.state = f"notice: {name}"
        log.warning("SpotWarp: %s received: final snapshot, then exit (grace %g s)", name, self.grace)
        try:
            await asyncio.wait_for(self.on_notice(notice), timeout=max(0.5, notice.deadline - time.time()))
        except asyncio.TimeoutError:
            log.error("SpotWarp: the final snapshot did not finish within the grace period; exiting anyway")
        except Exception as exc:  # noqa: BLE001 - exit regardless: the previous snapshots are intact
            log.error("SpotWarp: final snapshot failed: %s", exc)
        finally:
            self.done.set()
            await self.on_exit()
