"""REST handlers under `{base_url}spotwarp/api/`: parse, call the project service, answer JSON.

The contract is written down in api/openapi.yaml. Domain errors map to HTTP in one place.
"""

from __future__ import annotations

import json
from typing import Any

from jupyter_server.auth.decorator import authorized
from jupyter_server.base.handlers import APIHandler
from tornado import web

from ..engine import ManifestError, RolledBack, SnapshotNotFound, SpotWarpError
from ..engine.coordination import Fenced
from ..service import SnapshotSummary
from ..service.wire import rest_restore_json, rest_status_json, snapshot_json, summary_json
from .async_project import AsyncProject, PromotionInProgress, ServerStopping
from .resume import RunRefused, run_interrupted

_ID = r"(?P<snapshot_id>[^/]+)"


class SpotWarpHandler(APIHandler):
    """Shared by every SpotWarp route: the service, JSON answers, error mapping."""

    auth_resource = "spotwarp"

    @property
    def service(self) -> AsyncProject:
        return self.settings["spotwarp"]

    def reply(self, data: Any, status: int = 200) -> None:
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(data))

    def json_body(self) -> dict[str, Any]:
        """The request's JSON object (empty when there is no body); 400 for anything else."""
        raw = self.request.body
        if not raw or not raw.strip():
            return {}
        try:
            body = json.loads(raw)
        except (ValueError, UnicodeDecodeError):
            raise web.HTTPError(400, "request body is not valid JSON") from None
        except RecursionError:  # nested deeper than the parser goes: no body of ours is more than one level
            raise web.HTTPError(400, "request body is nested too deeply") from None
        if not isinstance(body, dict):
            raise web.HTTPError(400, "request body must be a JSON object")
        return body

    async def call(self, coro) -> Any:
        try:
            return await coro
        except SnapshotNotFound as exc:
            raise web.HTTPError(404, str(exc)) from None
        except (Fenced, PromotionInProgress) as exc:  # standby, lost the lease, or not caught up yet: no writes
            raise web.HTTPError(409, str(exc)) from None
        except ServerStopping as exc:
            raise web.HTTPError(503, str(exc)) from None
        except (ManifestError, RolledBack) as exc:  # damaged, tampered, unsafe or missing newest: refused, nothing changed
            raise web.HTTPError(400, str(exc)) from None
        except SpotWarpError as exc:
            raise web.HTTPError(500, str(exc)) from None


class StatusHandler(SpotWarpHandler):
    @web.authenticated
    @authorized("read")
    async def get(self) -> None:
        status = rest_status_json(*await self.call(self.service.status()))
        status["start_restore"] = self.settings.get("spotwarp_start_restore")  # restore-on-spawn, if any
        self.reply(status)


class SnapshotsHandler(SpotWarpHandler):
    @web.authenticated
    @authorized("read")
    async def get(self) -> None:
        self.reply({"snapshots": [summary_json(s) for s in await self.call(self.service.snapshots())]})

    @web.authenticated
    @authorized("write")
    async def post(self) -> None:
        body = self.json_body()
        unknown = sorted(set(body) - {"message"})
        if unknown:
            raise web.HTTPError(400, f"unknown field(s) {', '.join(unknown)}: the body takes only a message")
        message = body.get("message")
        if message is not None and (not isinstance(message, str) or len(message) > 1000):
            raise web.HTTPError(400, "message must be a string of at most 1000 characters")
        if message is not None and not _is_text(message):
            raise web.HTTPError(400, "message must be text: it holds a lone surrogate (an escape such as \\ud800)")
        manifest = await self.call(self.service.snapshot(message or None))
        self.reply(snapshot_json(SnapshotSummary.of(manifest)), status=201)


class RestoreHandler(SpotWarpHandler):
    # restoring loads pickled state into running kernels: the action that runs code, as for kernels
    @web.authenticated
    @authorized("execute")
    async def post(self, snapshot_id: str) -> None:
        if self.json_body():
            raise web.HTTPError(400, "restore takes no body: the snapshot id is in the URL")
        self.reply(rest_restore_json(await self.call(self.service.restore(snapshot_id))))


class ResumeRunHandler(SpotWarpHandler):
    # runs a notebook cell's recorded source in its kernel: the action that runs code, as for kernels
    @web.authenticated
    @authorized("execute")
    async def post(self) -> None:
        await self.call(self.service.check_open())  # a stopping (or fenced) server runs nothing more
        body = self.json_body()
        unknown = sorted(set(body) - {"notebook"})
        if unknown:
            raise web.HTTPError(400, f"unknown field(s) {', '.join(unknown)}: the body takes only a notebook")
        notebook = body.get("notebook")
        if not isinstance(notebook, str) or not notebook or len(notebook) > 4096 or not _is_text(notebook):
            raise web.HTTPError(400, "notebook must be the notebook's path as `resume` in GET status names it")
        try:
            entry = await run_interrupted(self.service.resumer, notebook)
        except RunRefused as exc:
            raise web.HTTPError(exc.status, str(exc)) from None
        self.reply(entry, status=202)


def _is_text(value: str) -> bool:
    """True when `value` is encodable text (JSON allows lone surrogates such as "\\ud800"; UTF-8 does not)."""
    try:
        value.encode()
    except UnicodeEncodeError:
        return False
    return True


def handlers() -> list[tuple[str, type[SpotWarpHandler]]]:
    """Routes relative to the server's base_url."""
    return [
        (r"/spotwarp/api/status", StatusHandler),
        (r"/spotwarp/api/snapshots", SnapshotsHandler),
        (rf"/spotwarp/api/snapshots/{_ID}/restore", RestoreHandler),
        (r"/spotwarp/api/resume/run", ResumeRunHandler),
    ]
