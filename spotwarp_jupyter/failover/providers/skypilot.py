"""The SkyPilot provider: candidates are SkyPilot clusters, one per offer, on spot machines.

A thin layer over SkyPilot's public Python API (`sky.Task`, `sky.Resources`, `sky.launch`,
`sky.status`, `sky.job_status`, `sky.down`, the catalog's `sky.list_accelerators`). SkyPilot
recovers one candidate at a time; the race launches several, so each candidate is its own
cluster pinned to one offer (cloud, region, instance type) and torn down when it finishes.

`sky` is imported only when the provider is used, so the failover package works without it.
SDK calls go through SkyPilot's API server (a local one is started by SkyPilot when none is set).
Reaching SkyPilot is in skypilot_sdk.py, reading its catalog in skypilot_offers.py, and mapping its
request, cluster and job states in skypilot_states.py.
"""

from __future__ import annotations

import shlex
import threading
from collections.abc import Sequence
from typing import Any

from ..._version import __version__
from ...engine.errors import ConfigError
from ..provider import FAILED, GONE, CandidateHandle, CandidateStatus, LaunchSpec, Offer
from .skypilot_offers import catalog_offers, enabled_clouds
from .skypilot_sdk import INSTALL_HINT, OLDEST_SKYPILOT, SkyPilotUnavailable, cluster_name, load_sky, one_line
from .skypilot_states import cluster_state, launch_state

__all__ = ["INSTALL_HINT", "OLDEST_SKYPILOT", "SkyPilotProvider", "SkyPilotUnavailable", "cluster_name", "load_sky",
           "one_line"]

# The storage extra a candidate needs for the project's storage URL.
DISTRIBUTION = "spotwarp-jupyter"  # on PyPI; `spotwarp` there is another project's
_STORAGE_EXTRAS = {"s3": "s3", "s3a": "s3", "gs": "gcs", "gcs": "gcs"}


def _flag(options: dict, name: str, default: bool) -> bool:
    """A yes/no option, given as a bool (Python) or as text (`--provider-option open_port=false`)."""
    value = options.get(name, default)
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ConfigError(f"SkyPilot provider option {name} must be true or false, got {value!r}")


class SkyPilotProvider:
    """Candidates on SkyPilot clusters: one cluster per offer, spot, torn down when done.

    Options (all optional):
      image_id: machine or container image with SpotWarp preinstalled (SkyPilot syntax,
                e.g. "docker:ghcr.io/you/spotwarp:1" or an AMI id); setup skips the pip install then.
      install: what setup pip-installs when the image lacks this version of SpotWarp (default:
               "spotwarp-jupyter==<this version>" with the storage extra the spec's URL needs; a wheel's
               URL or path for an unreleased version). Setup then checks that `spotwarp` is SpotWarp at
               exactly this version: PyPI's `spotwarp` is an unrelated project with a `spotwarp` command.
      open_port: open spec.port on the candidate (default True).
      idle_minutes: SkyPilot autodown after this many idle minutes (default None: down when the job ends).
      dryrun_offers: confirm each catalog offer with `sky.launch(dryrun=True)` (default True).
      retry_until_up: passed to sky.launch (default False: a failed offer fails its candidate).
    """

    name = "skypilot"
    shared_storage_only = True  # every cloud host must restore from the same store: never a folder on this machine

    def __init__(self, options: dict | None = None) -> None:
        opts = dict(options or {})
        known = {"image_id", "install", "open_port", "idle_minutes", "dryrun_offers", "retry_until_up"}
        unknown = sorted(set(opts) - known)
        if unknown:
            raise ConfigError(f"unknown SkyPilot provider option(s): {', '.join(unknown)} (known: {', '.join(sorted(known))})")
        self.image_id: str | None = opts.get("image_id")
        self.install: str | None = opts.get("install")
        self.open_port: bool = _flag(opts, "open_port", True)
        idle = opts.get("idle_minutes")
        try:
            self.idle_minutes: int | None = None if idle in (None, "") else int(idle)
        except (TypeError, ValueError):
            raise ConfigError(f"SkyPilot provider option idle_minutes must be a whole number, got {idle!r}") from None
        self.dryrun_offers: bool = _flag(opts, "dryrun_offers", True)
        self.retry_until_up: bool = _flag(opts, "retry_until_up", False)
        self.rejected: list[str] = []  # offers the dryrun refused, one line each
        self.errors: list[str] = []  # teardown errors, one line each
        self._lock = threading.Lock()
        self._started: dict[str, CandidateHandle] = {}
        self._downed: set[str] = set()

    # -- the task -------------------------------------------------------------------------

    def setup_command(self, spec: LaunchSpec) -> str:
        """Install this version of SpotWarp unless the image has it (a prepared image goes straight to `run`),
        then check that the `spotwarp` that `run` calls is SpotWarp at exactly this version."""
        requirement = self.install
        if requirement is None:
            scheme = spec.storage.split("://", 1)[0].lower() if "://" in spec.storage else ""
            extra = _STORAGE_EXTRAS.get(scheme)
            requirement = f"{DISTRIBUTION}[{extra}]=={__version__}" if extra else f"{DISTRIBUTION}=={__version__}"
        wanted = shlex.quote(f"spotwarp {__version__}")  # what `spotwarp --version` of this release prints
        refuse = shlex.quote(f"setup: `spotwarp` here is not SpotWarp {__version__} (install {DISTRIBUTION}=={__version__}"
                             ", or pass --provider-option install=...); it says: ")
        return (f"spotwarp --version 2>/dev/null | grep -qxF {wanted} || python3 -m pip install --quiet "
                f"{shlex.quote(requirement)}; spotwarp --version 2>/dev/null | grep -qxF {wanted} || "
                f"{{ echo {refuse}\"$(spotwarp --version 2>&1 | head -n 1)\" >&2; exit 1; }}")

    @staticmethod
    def run_command(spec: LaunchSpec, candidate_id: str, generation: int) -> str:
        """`spotwarp start` in standby, serving on every interface (the opened port reaches JupyterLab, not a
        loopback-only server) and as root if need be (CUDA images run as root; Jupyter refuses root otherwise)."""
        return f"{spec.start_command(candidate_id, generation)} --allow-root -- --ServerApp.ip=0.0.0.0"

    def build_task(self, spec: LaunchSpec, offer: Offer | None, candidate_id: str, generation: int) -> Any:
        """The sky.Task for one candidate: `spotwarp start` in standby, pinned to `offer`'s machine."""
        sky = load_sky()
        task = sky.Task(
            name=cluster_name(spec.project_id, candidate_id),
            setup=self.setup_command(spec),
            run=self.run_command(spec, candidate_id, generation),
            # spec.env carries SPOTWARP_KEY and storage credentials: secrets, which SkyPilot redacts.
            secrets=dict(spec.env) or None,
        )
        task.set_resources(sky.Resources(**self._resources_args(spec, offer)))
        return task

    def _resources_args(self, spec: LaunchSpec, offer: Offer | None) -> dict[str, Any]:
        args: dict[str, Any] = {"accelerators": spec.gpus, "use_spot": True}
        if offer is not None:
            sky = load_sky()
            args["cloud"] = sky.CLOUD_REGISTRY.from_str(offer.cloud)
            args["region"] = offer.region
            args["instance_type"] = offer.instance_type
        if spec.max_price is not None:
            args["max_hourly_cost"] = spec.max_price
        if self.open_port:
            args["ports"] = [str(spec.port)]
        if self.image_id:
            args["image_id"] = self.image_id
        return args

    # -- offers ---------------------------------------------------------------------------

    def catalog_offers(self, spec: LaunchSpec) -> list[Offer]:
        """Every spot offer in SkyPilot's catalog for spec's accelerator, clouds and price cap, cheapest first."""
        return catalog_offers(spec, self.name)

    def offers(self, spec: LaunchSpec, count: int) -> Sequence[Offer]:
        """Up to `count` distinct offers, cheapest spot price first; each confirmed by a dryrun unless turned off."""
        ranked = self.catalog_offers(spec)
        if not self.dryrun_offers:
            return ranked[:count]
        # One question for the enabled clouds spares a dryrun per offer SkyPilot could never launch.
        enabled = set(enabled_clouds(load_sky(), sorted({o.cloud for o in ranked})))
        chosen: list[Offer] = []
        for offer in ranked:
            if len(chosen) >= count:
                break
            if offer.cloud not in enabled:
                self.rejected.append(f"{offer.describe()}: {offer.cloud} is not enabled in SkyPilot (run: sky check {offer.cloud})")
                continue
            problem = self.dryrun(spec, offer)
            if problem is None:
                chosen.append(offer)
            else:
                self.rejected.append(f"{offer.describe()}: {problem}")
        return chosen

    def dryrun(self, spec: LaunchSpec, offer: Offer) -> str | None:
        """Run SkyPilot's optimizer on `offer` without launching: None when feasible, else one line why not."""
        sky = load_sky()
        try:
            task = self.build_task(spec, offer, "dryrun", 0)
            sky.get(sky.launch(task, cluster_name=cluster_name(spec.project_id, "dryrun"), dryrun=True, down=True))
        except Exception as e:  # noqa: BLE001 (SkyPilot's reasons are many; each is one line here)
            return one_line(e)
        return None

    # -- candidates -----------------------------------------------------------------------

    def launch(self, spec: LaunchSpec, offer: Offer, candidate_id: str, generation: int) -> CandidateHandle:
        """Submit one cluster for `offer` (returns once SkyPilot has the request); failures show in `poll`."""
        sky = load_sky()
        name = cluster_name(spec.project_id, candidate_id)
        handle = CandidateHandle(candidate_id=candidate_id, offer=offer, data={"cluster": name})
        with self._lock:
            self._started[name] = handle
        try:
            task = self.build_task(spec, offer, candidate_id, generation)
            handle.data["request_id"] = sky.launch(
                task, cluster_name=name, down=True, idle_minutes_to_autostop=self.idle_minutes,
                retry_until_up=self.retry_until_up,
            )
        except Exception as e:  # noqa: BLE001 (the race reads it from poll, like any failed start)
            handle.data["error"] = one_line(e)
        return handle

    def poll(self, handle: CandidateHandle) -> CandidateStatus:
        """Map SkyPilot's request, cluster and job states to PENDING/RUNNING/FAILED/GONE; never raises."""
        data = handle.data
        if data.get("downed"):
            return CandidateStatus(GONE, "torn down")
        if data.get("error"):
            return CandidateStatus(FAILED, data["error"])
        try:
            sky = load_sky()
            if data.get("job_id") is None:
                waiting = launch_state(sky, data)
                if waiting is not None:
                    return waiting
            return cluster_state(sky, data)
        except Exception as e:  # noqa: BLE001 (any SkyPilot failure is a failed candidate, in one line)
            data["error"] = one_line(e)
            return CandidateStatus(FAILED, data["error"])

    def down(self, handle: CandidateHandle) -> None:
        """Cancel the launch if still running and `sky.down` the cluster; idempotent, errors kept in `errors`."""
        data = handle.data
        name = data["cluster"]
        with self._lock:
            if name in self._downed:
                return
            self._downed.add(name)
        data["downed"] = True
        try:
            sky = load_sky()
        except SkyPilotUnavailable as e:
            self._record(name, str(e))
            return
        request_id = data.get("request_id")
        if request_id is not None and data.get("job_id") is None:
            try:
                sky.get(sky.api_cancel(request_id, silent=True))
            except Exception as e:  # noqa: BLE001
                self._record(name, f"cancelling the launch: {one_line(e)}")
        try:
            sky.get(sky.down(name))
        except Exception as e:  # noqa: BLE001
            if type(e).__name__ != "ClusterDoesNotExist":  # never came up, or already gone: nothing to tear down
                self._record(name, one_line(e))

    def _record(self, name: str, message: str) -> None:
        line = f"{name}: {message}"
        with self._lock:
            self.errors.append(line)

    def leaks(self) -> list[str]:
        """Clusters this provider started and tore down that SkyPilot still lists (or that could not be checked)."""
        with self._lock:
            downed = sorted(self._downed)
        if not downed:
            return []
        try:
            sky = load_sky()
            records = sky.get(sky.status(downed))
        except Exception as e:  # noqa: BLE001
            return [f"{name} (not checked: {one_line(e)})" for name in downed]
        return sorted(str(r["name"]) for r in records if str(r["name"]) in downed)
