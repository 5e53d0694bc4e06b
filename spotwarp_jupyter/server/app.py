"""The SpotWarp jupyter_server extension: configuration, the project service, the REST routes, continuous backup."""

from __future__ import annotations

import asyncio
import json
import os

from jupyter_core.utils import ensure_async
from jupyter_server.extension.application import ExtensionApp
from traitlets import Dict, Float, List, TraitError, Unicode, default, validate
from traitlets.config import Configurable

from ..engine import Settings, SnapshotEngine, SpotWarpError
from ..engine.units import parse_duration
from .handlers import handlers
from .heartbeat import Heartbeat
from .hub import FRESH_WORKSPACE_NAMES, HubIdentity, restore_mode, restore_on_start, shared_prefix_warning
from .service import ProjectService
from .watchers import PreemptionResponder, start_watchers


def _env_seconds(name: str, fallback: float) -> float:
    text = os.environ.get(name)
    if not text:
        return fallback
    if text.strip() == "0":
        return 0.0
    return parse_duration(text)


class SpotWarp(Configurable):
    """SpotWarp's server settings: `c.SpotWarp.*` in jupyter_server_config.py, or `SPOTWARP_*` variables."""

    project = Unicode(
        help="Project id: the name of this workspace's snapshots (default: $SPOTWARP_PROJECT or 'default')."
    ).tag(config=True)
    storage = Unicode(
        help="Storage URL, any fsspec URL (default: $SPOTWARP_STORAGE or ~/.spotwarp/store)."
    ).tag(config=True)
    storage_options = Dict(
        help="fsspec storage options, e.g. an endpoint (default: the JSON object in $SPOTWARP_STORAGE_OPTIONS)."
    ).tag(config=True)
    workspace = Unicode(
        help="The folder whose files are backed up (default: $SPOTWARP_WORKSPACE, else the server's root_dir)."
    ).tag(config=True)
    backup_interval = Float(help="Seconds between automatic file backups when something changed; 0 turns them off "
                                 "(default: $SPOTWARP_BACKUP_INTERVAL, e.g. 5m, else 300).").tag(config=True)
    kernel_timeout = Float(help="Seconds to wait for a busy kernel to answer a snapshot request before using its "
                                "newest committed state (default: $SPOTWARP_KERNEL_TIMEOUT, else 60).").tag(config=True)

    restore_on_start = Unicode(help="Restore the newest snapshot holding files into a fresh workspace at start: "
                                    "auto (only under JupyterHub), if-empty, never "
                                    "(default: $SPOTWARP_RESTORE_ON_START, else auto).").tag(config=True)
    fresh_workspace_names = List(Unicode(), default_value=list(FRESH_WORKSPACE_NAMES),
                                 help="Top-level names a fresh home or volume holds before its user writes anything; "
                                      "a workspace holding only these counts as empty.").tag(config=True)

    @default("restore_on_start")
    def _default_restore_on_start(self) -> str:
        return os.environ.get("SPOTWARP_RESTORE_ON_START", "auto")

    @default("project")
    def _default_project(self) -> str:
        return os.environ.get("SPOTWARP_PROJECT", "")

    @default("storage")
    def _default_storage(self) -> str:
        return os.environ.get("SPOTWARP_STORAGE", "")

    @default("storage_options")
    def _default_storage_options(self) -> dict:
        from ..engine.settings import parse_storage_options

        return parse_storage_options(os.environ.get("SPOTWARP_STORAGE_OPTIONS"))

    @default("workspace")
    def _default_workspace(self) -> str:
        return os.environ.get("SPOTWARP_WORKSPACE", "")

    @default("backup_interval")
    def _default_backup_interval(self) -> float:
        return _env_seconds("SPOTWARP_BACKUP_INTERVAL", 300.0)

    @default("kernel_timeout")
    def _default_kernel_timeout(self) -> float:
        return _env_seconds("SPOTWARP_KERNEL_TIMEOUT", 60.0)

    heartbeat_interval = Float(help="Seconds between two heartbeats this server writes into the store "
                                    "(`hosts/<id>.json`, read by `spotwarp launch --watch` and `spotwarp hosts`); "
                                    "0 turns them off (default: $SPOTWARP_HEARTBEAT_INTERVAL, else 5).").tag(config=True)

    @default("heartbeat_interval")
    def _default_heartbeat_interval(self) -> float:
        return _env_seconds("SPOTWARP_HEARTBEAT_INTERVAL", 5.0)

    # -- preemption watchers (docs/preemption.md) ------------------------------------------------------
    watchers = List(Unicode(), help="Preemption watchers to run, among signals, aws, gcp, azure (default: "
                                    "$SPOTWARP_WATCHERS, comma-separated, else all; each cloud's watcher backs off "
                                    "quietly where its endpoint does not answer).").tag(config=True)
    aws_metadata_url = Unicode(help="AWS instance metadata (IMDSv2) endpoint; 'off' disables the AWS watcher "
                                    "(default: $SPOTWARP_AWS_METADATA_URL, else http://169.254.169.254).").tag(config=True)
    gcp_metadata_url = Unicode(help="GCP metadata server; 'off' disables the GCP watcher "
                                    "(default: $SPOTWARP_GCP_METADATA_URL, else http://169.254.169.254).").tag(config=True)
    azure_metadata_url = Unicode(help="Azure instance metadata (Scheduled Events) endpoint; 'off' disables the Azure "
                                      "watcher (default: $SPOTWARP_AZURE_METADATA_URL, else http://169.254.169.254)."
                                 ).tag(config=True)
    metadata_poll_interval = Float(help="Seconds between two questions to a metadata endpoint (GCP long-polls "
                                        "instead) (default: $SPOTWARP_METADATA_POLL_INTERVAL, else 1).").tag(config=True)
    watcher_max_backoff = Float(help="Longest pause, in seconds, of a watcher whose endpoint does not answer "
                                     "(default: $SPOTWARP_WATCHER_MAX_BACKOFF, else 300).").tag(config=True)
    shutdown_grace = Float(help="Seconds the server may take after SIGTERM or SIGINT for the final snapshot and its "
                                "exit (Kubernetes gives 30 by default, RunPod about 5) "
                                "(default: $SPOTWARP_SHUTDOWN_GRACE, else 20).").tag(config=True)
    notice_window = Float(help="Seconds a notice that states no deadline leaves for the final snapshot (GCP gives "
                               "30) (default: $SPOTWARP_NOTICE_WINDOW, else 25).").tag(config=True)

    @default("watchers")
    def _default_watchers(self) -> list[str]:
        text = os.environ.get("SPOTWARP_WATCHERS")
        return ["signals", "aws", "gcp", "azure"] if text is None else [w for w in text.replace(" ", "").split(",") if w]

    @validate("watchers")
    def _check_watchers(self, proposal) -> list[str]:
        from .watchers import KINDS

        chosen = [w.strip().lower() for w in proposal["value"]]
        unknown = sorted(set(chosen) - set(KINDS))
        if unknown:
            raise TraitError(f"unknown watcher(s) {', '.join(unknown)}: choose among {', '.join(KINDS)}")
        return chosen

    @default("aws_metadata_url")
    def _default_aws_metadata_url(self) -> str:
        return os.environ.get("SPOTWARP_AWS_METADATA_URL", "http://169.254.169.254")

    @default("gcp_metadata_url")
    def _default_gcp_metadata_url(self) -> str:
        return os.environ.get("SPOTWARP_GCP_METADATA_URL", "http://169.254.169.254")

    @default("azure_metadata_url")
    def _default_azure_metadata_url(self) -> str:
        return os.environ.get("SPOTWARP_AZURE_METADATA_URL", "http://169.254.169.254")

    @default("metadata_poll_interval")
    def _default_metadata_poll_interval(self) -> float:
        return _env_seconds("SPOTWARP_METADATA_POLL_INTERVAL", 1.0)

    @default("watcher_max_backoff")
    def _default_watcher_max_backoff(self) -> float:
        return _env_seconds("SPOTWARP_WATCHER_MAX_BACKOFF", 300.0)

    @default("shutdown_grace")
    def _default_shutdown_grace(self) -> float:
        return _env_seconds("SPOTWARP_SHUTDOWN_GRACE", 20.0)

    @default("notice_window")
    def _default_notice_window(self) -> float:
        return _env_seconds("SPOTWARP_NOTICE_WINDOW", 25.0)


class SpotWarpApp(ExtensionApp):
    """Serves `{base_url}spotwarp/api/` and backs the workspace up while JupyterLab runs."""

    name = "spotwarp"
    load_other_extensions = True
    classes = [SpotWarp]

    def initialize_settings(self) -> None:
        config = SpotWarp(parent=self)
        serverapp = self.serverapp
        workspace = config.workspace or serverapp.root_dir
        try:
            settings = Settings.resolve(config={"project": config.project, "storage": config.storage,
                                                "storage_options": config.storage_options, "workspace": workspace})
            engine = SnapshotEngine(settings)
            mode = restore_mode(config.restore_on_start)
        except SpotWarpError as exc:
            self.log.error("SpotWarp is off: %s", exc)
            raise
        self.config_object = config
        identity = HubIdentity.from_env()
        warning = shared_prefix_warning(settings.storage, identity)
        if warning:
            self.log.warning("SpotWarp: %s", warning)
        # a new pod after a preemption: the user's files are back before anything is served
        start_restore = restore_on_start(engine, settings.workspace or workspace, mode, identity,
                                         config.fresh_workspace_names)
        self.service = ProjectService(engine, settings.workspace or workspace, serverapp.root_dir,
                                      serverapp.kernel_manager, serverapp.session_manager, config.kernel_timeout)
        # kernels inherit the server's environment: they snapshot into the same project, and name their
        # notebook relative to the same workspace
        os.environ.update({"SPOTWARP_PROJECT": settings.project, "SPOTWARP_STORAGE": settings.storage,
                           "SPOTWARP_WORKSPACE": self.service.workspace})
        self.settings.update({"spotwarp": self.service, "spotwarp_start_restore": start_restore})
        self._backup_task: asyncio.Task | None = None
        self.log.info("SpotWarp: project %s, storage %s, workspace %s", settings.project, settings.storage,
                      self.service.workspace)

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
                                               self._promoted, self._fenced)
            self.service.heartbeat.start()
        # watchers start in the background: finding out which cloud this is never delays serving
        self.service.responder = PreemptionResponder(self.service)
        self.service.watchers = start_watchers(self.config_object, self.service.responder, serverapp,
                                               self._exit_after_notice)

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
        asyncio.ensure_future(self._commit_promotion())

    async def _commit_promotion(self) -> None:
        try:
            await self.service.promoted()
        except Exception as exc:  # noqa: BLE001 - the backup loop and kernels take over from here
            self.log.warning("SpotWarp: promotion snapshot failed: %s", exc)

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
        if getattr(self, "service", None) is not None:
            self.service.close()
