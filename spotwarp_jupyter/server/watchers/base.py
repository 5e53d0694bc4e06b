"""What every preemption watcher shares: the notice it reports, its state for `GET status`, a quiet backoff."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

from tornado.httpclient import AsyncHTTPClient, HTTPRequest, HTTPResponse

log = logging.getLogger("spotwarp")


@dataclass
class Notice:
    """A warning that this host will be taken away (or, when not fatal, may be soon)."""

    source: str  # the watcher: signals, aws, gcp, azure
    kind: str  # what the source said: SIGTERM, spot-interruption, rebalance-recommendation, preempted, Preempt
    deadline: float  # wall-clock time by which the final snapshot must be committed
    fatal: bool = True
    key: str = ""  # the same notice seen twice has the same key
    details: dict[str, Any] = field(default_factory=dict)
    seen: float = field(default_factory=time.time)
    watcher: "Watcher | None" = None

    @property
    def window_s(self) -> float:
        return max(0.0, self.deadline - self.seen)


OnNotice = Callable[[Notice], Awaitable[Any]]


class Unreachable(Exception):
    """The endpoint did not answer (no such network, timeout, connection refused)."""


class NotThisCloud(Exception):
    """Something answered, but not this cloud's metadata protocol."""


class Watcher:
    """One source of notices, polled (or long-polled) on the server's event loop; never blocks it."""

    name = "watcher"
    first_backoff_s = 1.0

    def __init__(self, on_notice: OnNotice, endpoint: str = "", poll_interval: float = 1.0,
                 max_backoff: float = 300.0, request_timeout: float = 2.0):
        self.on_notice = on_notice
        self.endpoint = endpoint.rstrip("/")
        self.poll_interval = poll_interval
        self.max_backoff = max_backoff
        self.request_timeout = request_timeout
        self.state = "starting"
        self.last_notice: Notice | None = None
        self.failures = 0
        self._seen: set[str] = set()
        self._task: asyncio.Task | None = None
        self._http: AsyncHTTPClient | None = None

    def describe(self) -> dict[str, Any]:
        """What `GET status` shows of this watcher."""
        notice = self.last_notice
        return {"name": self.name, "state": self.state, "endpoint": self.endpoint or None,
                "last_notice": None if notice is None else {"kind": notice.kind, "seen": round(notice.seen, 3),
                                                            "fatal": notice.fatal, "window_s": round(notice.window_s, 1)}}

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except BaseException:  # noqa: BLE001 - cancelled, or it had failed: either way it is over
                pass
        if self._http is not None:
            self._http.close()
        self.state = "stopped"

    async def poll(self) -> list[Notice]:
        """Ask the source once (a long poll may wait); return what it announces now."""
        raise NotImplementedError

    async def acknowledge(self, notice: Notice) -> None:
        """Tell the source we are ready (after the final snapshot); most sources need nothing."""

    async def _run(self) -> None:
        while True:
            try:
                notices = await self.poll()
            except asyncio.CancelledError:
                raise
            except NotThisCloud as exc:
                self.failures = 0
                delay = self.max_backoff
                self._set_state(f"not this cloud ({exc}); asking again in {delay:g} s")
            except Unreachable as exc:
                self.failures += 1
                delay = min(self.max_backoff, self.first_backoff_s * 2 ** (self.failures - 1))
                self._set_state(f"unreachable ({exc}); retrying in {delay:g} s")
            except Exception as exc:  # noqa: BLE001 - a watcher never takes the server down
                self.failures += 1
                delay = min(self.max_backoff, self.first_backoff_s * 2 ** (self.failures - 1))
                self._set_state(f"error ({type(exc).__name__}: {exc}); retrying in {delay:g} s")
            else:
                self.failures = 0
                self._set_state("watching" if self.last_notice is None else f"notice: {self.last_notice.kind}")
                for notice in notices:
                    if notice.key in self._seen:
                        continue
                    self._seen.add(notice.key)
                    notice.watcher = self
                    self.last_notice = notice
                    self._set_state(f"notice: {notice.kind}")
                    asyncio.ensure_future(self.on_notice(notice))
                delay = self.poll_interval
            await asyncio.sleep(delay)

    def _set_state(self, state: str) -> None:
        if state.split(";")[0] != self.state.split(";")[0]:
            log.debug("SpotWarp watcher %s: %s", self.name, state)
        self.state = state

    async def fetch(self, path: str, method: str = "GET", headers: dict[str, str] | None = None,
                    body: str | None = None, timeout: float | None = None) -> HTTPResponse:
        """One request to the endpoint; Unreachable when nothing answers."""
        if self._http is None:
            self._http = AsyncHTTPClient(force_instance=True)
        request = HTTPRequest(self.endpoint + path, method=method, headers=headers or {}, body=body,
                              connect_timeout=min(1.0, self.request_timeout),
                              request_timeout=timeout or self.request_timeout, follow_redirects=False,
                              allow_nonstandard_methods=True)
        try:
            response = await self._http.fetch(request, raise_error=False)
        except OSError as exc:  # DNS failure, network unreachable
            raise Unreachable(str(exc) or type(exc).__name__) from None
        if response.code == 599:
            raise Unreachable(str(response.error) if response.error else "no answer")
        return response
