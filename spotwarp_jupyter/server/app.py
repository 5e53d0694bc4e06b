"""The SpotWarp jupyter_server extension: configuration, the project service, the REST routes, continuous backup."""

from __future__ import annotations

import asyncio
import json
import os
import time
from typing import Any, Mapping

from jupyter_core.utils import ensure_async
from jupyter_server.extension.application import ExtensionApp
from traitlets import Bool, Dict, Float, List, TraitError, Unicode, validate
from traitlets.config import Configurable

from ..engine import ConfigError, Settings, SnapshotEngine, SpotWarpError
from ..engine.coordination import HOLDER
from ..engine.settings import DEFAULT_PROJECT, LOCATION, SERVER, SETTINGS, WATCHER_KINDS, configured, resolve_settings
from ..engine.signing import key_id
from .async_project import AsyncProject
from .handlers import handlers
from .heartbeat import Heartbeat
from .hub import FRESH_WORKSPACE_NAMES, HubIdentity, restore_mode, restore_on_start, shared_prefix_warning
from .kernel_link import untrack_control_requests
from .listings import list_through_renames
from .renames import follow_renames
from .resume import Resumer
from .saved_widgets import drop_widget_views
from .warm_kernels import WarmKernels
from .watchers import PreemptionResponder, start_watchers

KERNEL_ACTIONS = "https://events.jupyter.org/jupyter_server/kernel_actions/v1"  # jupyter_server's kernel events


def _shown(value: Any) -> str | None:
    """A declared default as the help says it: numbers without a needless `.0`; None where it says nothing plain."""
    if isinstance(value, float):
        return f"{value:g}"
    return value if isinstance(value, str) else None


def _setting(kind: type, name: str, help: str, shown: str | None = None, note: str | None = None,
             **kwargs: Any) -> Any:
    """A `c.SpotWarp.*` trait of the config layer: None (its default) means no config file set it.

    Its variable and default come from the setting's row in `SETTINGS`; `shown` words a default that is not a
    plain value, `note` adds to the parentheses after it.
    """
    setting = SETTINGS[name]
    shown = shown or _shown(setting.default)
    aside = "; ".join(part for part in (shown and f"default: {shown}", note) if part)
    return kind(default_value=None, allow_none=True, **kwargs,
                help=f"{help}{f' ({aside})' if aside else ''}. ${setting.env} overrides it; "
                     "a --SpotWarp.* flag overrides both.").tag(config=True)


class SpotWarp(Configurable):
    """SpotWarp's server settings: flags, then `SPOTWARP_*` variables, then `c.SpotWarp.*` config, then defaults."""

    project = _setting(Unicode, "project", "Project id: the name of this workspace's snapshots",
                       shown=repr(DEFAULT_PROJECT))
    storage = _setting(Unicode, "storage", "Storage URL, any fsspec URL", shown="~/.spotwarp/store")
    storage_options = _setting(Dict, "storage_options", "fsspec storage options, e.g. an endpoint",
                               note="the variable holds a JSON object")
    workspace = _setting(Unicode, "workspace", "The folder whose files are backed up", shown="the server's root_dir")
    backup_interval = _setting(Float, "backup_interval", "Seconds between automatic file backups when something "
                               "changed; 0 turns them off", note="the variable may say 5m")
    kernel_timeout = _setting(Float, "kernel_timeout", "Seconds to wait for a busy kernel to answer a snapshot "
                              "request before using its newest committed state")
    restore_on_start = _setting(Unicode, "restore_on_start", "Restore the newest snapshot holding files into a "
                                "fresh workspace at start: auto (only under JupyterHub), if-empty, never")
    fresh_workspace_names = List(Unicode(), default_value=list(FRESH_WORKSPACE_NAMES),
                                 help="Top-level names a fresh home or volume holds before its user writes anything; "
                                      "a workspace holding only these counts as empty.").tag(config=True)
    heartbeat_interval = _setting(Float, "heartbeat_interval", "Seconds between two heartbeats this server writes "
                                  "into the store (`hosts/<id>.json`, read by `spotwarp launch --watch` and "
                                  "`spotwarp hosts`); 0 turns them off")

    # -- preemption watchers (docs/preemption.md) ------------------------------------------------------
    watchers = _setting(List, "watchers", f"Preemption watchers to run, among {', '.join(WATCHER_KINDS)}",
                        shown="all", note="each cloud's watcher backs off quietly where its endpoint does not "
                        "answer; the variable is comma-separated", trait=Unicode())
    aws_metadata_url = _setting(Unicode, "aws_metadata_url", "AWS instance metadata (IMDSv2) endpoint; 'off' "
                                "disables the AWS watcher")
    gcp_metadata_url = _setting(Unicode, "gcp_metadata_url", "GCP metadata server; 'off' disables the GCP watcher")
    azure_metadata_url = _setting(Unicode, "azure_metadata_url", "Azure instance metadata (Scheduled Events) "
                                  "endpoint; 'off' disables the Azure watcher")
    metadata_poll_interval = _setting(Float, "metadata_poll_interval", "Seconds between two questions to a metadata "
                                      "endpoint (GCP long-polls instead)")
    watcher_max_backoff = _setting(Float, "watcher_max_backoff", "Longest pause, in seconds, of a watcher whose "
                                   "endpoint does not answer")
    shutdown_grace = _setting(Float, "shutdown_grace", "Seconds the server may take after SIGTERM or SIGINT for the "
                              "final snapshot and its exit (Kubernetes gives 30 by default, RunPod about 5)")
    resume_kernels = _setting(Bool, "resume_kernels", "On a new host (files restored at start), start a kernel "
                              "for every notebook whose kernel was live in the snapshot, restore its variables and "
                              "re-run a cell interrupted inside a resumable loop (docs/resume.md)",
                              shown="True", note="`spotwarp start --no-resume` turns it off")
    resume_unsigned = _setting(Bool, "resume_unsigned", "Resume kernels (unpickle, re-run the recorded cell) "
                               "from snapshots no key vouches for: anyone who can write the store can then run "
                               "code on this host (docs/threat-model.md)", shown="False",
                               note="`spotwarp start --resume-unsigned` turns it on")
    notice_window = _setting(Float, "notice_window", "Seconds a notice that states no deadline leaves for the final "
                             "snapshot (GCP gives 30)")

    @validate("watchers")
    def _check_watchers(self, proposal) -> list[str] | None:
        try:
            return None if proposal["value"] is None else SETTINGS["watchers"].parse(proposal["value"])
        except ConfigError as exc:
            raise TraitError(str(exc)) from None

    def resolve(self, flags: Mapping[str, Any] | None = None, root_dir: str | None = None) -> Settings:
        """Replace every setting by its resolved value (flags > environment > config > defaults); the location.

        Before this, the traits hold only what config files set (None where they set nothing).
        """
        flags = flags or {}
        layer = configured(self, LOCATION + SERVER)
        values = resolve_settings(SERVER, flags=flags, config=layer)
        for name in SERVER:
            setattr(self, name, values[name])
        return Settings.resolve(**{name: flags.get(name) for name in LOCATION}, config=layer,
                                defaults={"workspace": root_dir})


def _into_server_log(server_log: Any) -> None:
    """SpotWarp's own logger writes through the server log's handlers: its lines get their time and level."""
    import logging

    spotwarp = logging.getLogger("spotwarp")
    handlers = getattr(server_log, "handlers", None) or []
    if spotwarp.handlers or not handlers:
        return
    for handler in handlers:
        spotwarp.addHandler(handler)
    if spotwarp.level == logging.NOTSET:
        spotwarp.setLevel(logging.INFO)


class SpotWarpApp(ExtensionApp):
    """Serves `{base_url}spotwarp/api/` and backs the workspace up while JupyterLab runs."""

    name = "spotwarp"
    load_other_extensions = True
    classes = [SpotWarp]

    def initialize_settings(self) -> None:
        config = SpotWarp(parent=self)
        serverapp = self.serverapp
        # `jupyter lab --SpotWarp.project=x` is a flag: stronger than SPOTWARP_PROJECT, unlike a config file;
        # traitlets has already typed its value into the trait
        given = getattr(serverapp, "cli_config", {}).get("SpotWarp", {})
        flags = {name: getattr(config, name) for name in given if name in SETTINGS}
        server_log = getattr(serverapp, "log", self.log)
        _into_server_log(server_log)
        try:
            settings = config.resolve(flags, serverapp.root_dir)
            workspace = settings.workspace
            engine = SnapshotEngine(settings)
            mode = restore_mode(config.restore_on_start)
            # signing from now on, kernels included (they inherit SPOTWARP_KEY); a new project gets its key here
            key = engine.settle_key()
        except SpotWarpError as exc:
            self.log.error("SpotWarp is off: %s", exc)
            raise
        if key.line:
            (self.log.info if key.key else self.log.warning)("SpotWarp: %s", key.line)
        self.config_object = config
        identity = HubIdentity.from_env()
        warning = shared_prefix_warning(settings.storage, identity)
        if warning:
            self.log.warning("SpotWarp: %s", warning)
        # a new pod after a preemption: the user's files are back before anything is served
        start_restore = restore_on_start(engine, workspace, mode, identity, config.fresh_workspace_names,
                                         server_log, resume_unsigned=bool(config.resume_unsigned))
        started = self._host_info_restore()
        if start_restore is None and started is not None:  # what `spotwarp start` restored, in status and the log
            start_restore = {"restored": True, "id": started.get("snapshot"), "kept": bool(started.get("kept")),
                             **{k: started[k] for k in ("files_restored", "bytes_restored", "duration_s", "line")
                                if started.get(k) is not None}}
            if started.get("line"):
                server_log.info("SpotWarp start restore: %s", started["line"])
        self.service = AsyncProject(engine, workspace, serverapp.root_dir,
                                      serverapp.kernel_manager, serverapp.session_manager, config.kernel_timeout)
        self.service.project.resume_unsigned = bool(config.resume_unsigned)
        untrack_control_requests(serverapp.kernel_manager)
        self.service.trust.update(key_id=key_id(key.key) if key.key else None, line=None if key.key else key.line)
        self.settings.update({"spotwarp": self.service, "spotwarp_start_restore": start_restore})
        self._hook_into_server(settings, config)
        self._backup_task: asyncio.Task | None = None
        self.log.info("SpotWarp: project %s, storage %s, workspace %s", settings.project, settings.storage,
                      self.service.workspace)

    def _hook_into_server(self, settings: Settings, config: SpotWarp) -> None:
        """What the server and its kernels share with SpotWarp: the environment kernels inherit, kernel events,
        renames, listings and saves."""
        # kernels inherit the server's environment: they snapshot into the same project, and name their
        # notebook relative to the same workspace
        os.environ.update({"SPOTWARP_PROJECT": settings.project, "SPOTWARP_STORAGE": settings.storage,
                           "SPOTWARP_WORKSPACE": self.service.workspace})
        if config.resume_unsigned:  # the kernels say they were resumed opted in, whatever set it
            os.environ["SPOTWARP_RESUME_UNSIGNED"] = "true"
        # which kernels started after their notebook's stored state, and were not restored (GET status `newer`)
        events = getattr(self.serverapp, "event_logger", None)
        if events is not None:
            events.add_listener(schema_id=KERNEL_ACTIONS, listener=self.service.kernel_action)
        # a renamed or moved notebook: its kernel learns the new name (its snapshots stay its own)
        follow_renames(self.serverapp.session_manager, self.serverapp.kernel_manager, self.service.notebook_of)
        # a folder listed while a file in it is renamed (a first save) is listed, never "Directory not found"
        list_through_renames(self.serverapp.contents_manager)
        # a saved notebook keeps the status widget as text: reopened, it shows no "model not found"
        register = getattr(self.serverapp.contents_manager, "register_pre_save_hook", None)
        if register is not None:
            register(drop_widget_views)

    def initialize_handlers(self) -> None:
        self.handlers.extend(handlers())

    async def _start_jupyter_server_extension(self, serverapp) -> None:
        interval = self.config_object.backup_interval
        if interval > 0:
            self._backup_task = asyncio.create_task(self.service.backup_loop(interval))
        interval = self.config_object.heartbeat_interval
        fence = self.service.engine.fence
        if interval > 0 or fence.candidate:
            # a candidate always beats: the orchestrator learns from it that it serves, and it learns its promotion
            self.service.heartbeat = Heartbeat(self.service.engine.store, fence, interval if interval > 0 else 5.0,
                                               self._host_info(serverapp), asyncio.get_running_loop(),
                                               self._promoted, self._fenced, self._lease_lost, self._requested)
            self.service.heartbeat.start()
        # watchers start in the background: finding out which cloud this is never delays serving
        self.service.responder = PreemptionResponder(self.service)
        self.service.watchers = start_watchers(self.config_object, self.service.responder, serverapp,
                                               self._exit_after_notice)
        self._resume_task: asyncio.Task | None = None
        self._warm: WarmKernels | None = None
        if not fence.candidate:  # a candidate resumes once promoted (_commit_promotion)
            self._start_resume()
        elif self._resume_snapshot() and self.config_object.resume_kernels:
            # in standby: the kernels the promotion will resume start now, and import their packages
            self._warm = WarmKernels()
            self._warm_task = asyncio.ensure_future(self._warm.warm_up(
                self.service, serverapp, self._resume_snapshot(), (self._host_info(serverapp)["restore"] or {})
                .get("ref") or "latest"))

    def _resume_snapshot(self) -> str | None:
        """The snapshot the files were restored from at start (`spotwarp start`, or JupyterHub's restore)."""
        restored = self._host_info(self.serverapp)["restore"] or {}
        hub = self.settings.get("spotwarp_start_restore") or {}
        return restored.get("snapshot") or (hub.get("id") if hub.get("restored") else None)

    def _host_info_restore(self) -> dict | None:
        """What `spotwarp start` restored (SPOTWARP_START_RESTORE), None when it restored nothing or is unknown."""
        try:
            restored = json.loads(os.environ.get("SPOTWARP_START_RESTORE") or "null")
        except ValueError:
            return None
        return restored if isinstance(restored, dict) else None

    def _kept_home(self) -> bool:
        """Whether the files the resume starts from were a kept workspace's (only missing ones restored)."""
        hub = self.settings.get("spotwarp_start_restore") or {}
        return bool((self._host_info_restore() or {}).get("kept") or (hub.get("restored") and hub.get("kept")))

    def _start_resume(self, caught_up: str | None = None, gate: asyncio.Event | None = None) -> None:
        """A new host: files were restored at start, so resume the notebooks' kernels (server/resume.py).

        `caught_up`: the snapshot a promoted candidate's files now hold; `gate`: set once its promotion snapshot is
        committed (kernels start and restore meanwhile, a cell runs only after)."""
        restored = self._host_info(self.serverapp)["restore"] or {}
        snapshot = caught_up or self._resume_snapshot()
        if not snapshot or getattr(self, "_resume_task", None) is not None:
            return
        if not self.config_object.resume_kernels:
            self.service.resumed.append({"notebook": "*", "state": "off", "line": "kernels not resumed: resume is "
                                         "off (spotwarp start --no-resume, c.SpotWarp.resume_kernels = False)"})
            self.log.info("SpotWarp resume: off (spotwarp start --no-resume or c.SpotWarp.resume_kernels)")
            return
        self._resume_task = asyncio.ensure_future(
            Resumer(self.service, self.serverapp, gate, getattr(self, "_warm", None)).resume(
                snapshot, restored.get("ref") or "latest", kept=self._kept_home() and not caught_up))

    def _host_info(self, serverapp) -> dict:
        """What the heartbeat says of this server: where it listens, when `spotwarp start` began, what it restored."""
        info = {"project": self.service.engine.settings.project, "port": serverapp.port,
                "url": serverapp.connection_url, "started_at": None, "restore": None}
        try:
            info["started_at"] = float(os.environ.get("SPOTWARP_STARTED_AT") or 0) or None
            info["restore"] = json.loads(os.environ.get("SPOTWARP_START_RESTORE") or "null")
        except ValueError:
            pass
        return info

    def _promoted(self) -> None:
        self.log.info("SpotWarp: promoted (generation %d): files brought up to date, then the promotion snapshot",
                      self.service.engine.fence.generation)
        asyncio.ensure_future(self._commit_promotion())

    async def _commit_promotion(self, first_pause_s: float = 1.0, max_pause_s: float = 30.0) -> None:
        """The workspace brought to the newest snapshot (a standby restored an older one), then the promotion
        snapshot, retried with backoff until it is committed (or this host is no longer the holder): until it
        lands, nothing of this generation ranks above what the previous holder wrote. The kernels' resume starts
        once the files are up to date; the cells it re-runs wait for the promotion snapshot."""
        pause = first_pause_s
        attempt = 0
        committed = asyncio.Event()
        caught_up: str | None = None
        while True:
            attempt += 1
            try:
                if caught_up is None:
                    caught_up = await self.service.catch_up((self._host_info(self.serverapp)["restore"] or {})
                                                            .get("snapshot")) or ""
                    if self._warm is not None:
                        await self._warm.started.wait()  # its kernels started (their imports may go on)
                        self._warm.closed = True  # the resume takes those it uses, and shuts down the others
                    self._start_resume(caught_up or None, committed)
                    if self._warm is not None and self._resume_task is None:
                        await self._warm.shut_down_unused(self.serverapp)
                manifest = await self.service.promoted()
                committed.set()
                self.log.info("SpotWarp: promotion snapshot %s committed", manifest.id if manifest else None)
                return
            except Exception as exc:  # noqa: BLE001 - retried below
                heartbeat = self.service.heartbeat
                if heartbeat is not None and heartbeat.role != HOLDER:
                    self.log.warning("SpotWarp: promotion snapshot failed (%s); no longer the holder: not retried", exc)
                    return
                self.service.last_error = f"promotion snapshot failed (attempt {attempt}): {exc}"
                self.log.error("SpotWarp: promotion snapshot failed (attempt %d): %s; retrying in %.0f s", attempt,
                               exc, pause)
            await asyncio.sleep(pause)  # backoff between attempts, not a synchronisation
            pause = min(max_pause_s, pause * 2)

    def _requested(self, doc: dict) -> None:
        """`spotwarp launch --replace` asks for a final snapshot before it fences this host off."""
        from .watchers.base import Notice

        window = float(doc.get("window_s") or 60.0) if isinstance(doc.get("window_s"), (int, float)) else 60.0
        notice = Notice("orchestrator", f"replace-{doc['request']}", time.time() + min(600.0, max(5.0, window)),
                        fatal=False, key=doc["request"])
        if self.service.responder is not None:
            asyncio.ensure_future(self.service.responder(notice))

    def _lease_lost(self, why: str) -> None:
        """The lease that named this holder vanished: it keeps serving but writes nothing; status says why."""
        self.service.last_error = f"lease lost: {why}"

    def _fenced(self, why: str) -> None:
        """Lost the lease: say so (log, status) and stop; every write was already refused by the engine."""
        self.service.last_error = f"fenced: {why}"
        asyncio.ensure_future(self._exit_after_notice())

    async def _exit_after_notice(self) -> None:
        """After SIGTERM/SIGINT and the final snapshot: stop kernels at once (their state is in), then the server."""
        try:
            await ensure_async(self.serverapp.kernel_manager.shutdown_all(now=True))
        except Exception as exc:  # noqa: BLE001 - stop regardless
            self.log.warning("SpotWarp: stopping kernels: %s", exc)
        self.serverapp.stop()

    async def stop_extension(self) -> None:
        if getattr(getattr(self, "service", None), "heartbeat", None) is not None:
            self.service.heartbeat.stop()
        for watcher in getattr(getattr(self, "service", None), "watchers", []):
            await watcher.stop()
        if getattr(self, "_backup_task", None) is not None:
            self._backup_task.cancel()
        if getattr(self, "_resume_task", None) is not None:
            self._resume_task.cancel()
        if getattr(self, "_warm_task", None) is not None:
            self._warm_task.cancel()
        for task in list(getattr(getattr(getattr(self, "service", None), "resumer", None), "tasks", ())):
            task.cancel()  # a cell run as asked (POST resume/run) after the resume itself ended
        if getattr(self, "service", None) is not None:
            self.service.close()
