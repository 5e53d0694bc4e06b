"""The provider seam: what the failover race needs from a place that can run a candidate host.

A provider offers machines, starts a candidate on one, tells how it is doing, and tears it down.
Readiness is not the provider's business: a candidate reports "restored and serving" through the
project's store, so the race works the same on every provider. The racing logic imports no
provider module; providers import nothing from the race. No Jupyter imports.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from typing import Any, Protocol, Sequence

# What `poll` answers.
PENDING = "pending"  # asked for, not yet running (provisioning, setup)
RUNNING = "running"  # the machine and the start command are up (not necessarily serving yet)
FAILED = "failed"  # could not be provisioned, or the start command exited; `message` says why
GONE = "gone"  # torn down, preempted or vanished
CANDIDATE_STATES = (PENDING, RUNNING, FAILED, GONE)


@dataclass(frozen=True)
class LaunchSpec:
    """What to run and on what: one project, its storage, the hardware wanted."""

    project_id: str
    storage: str
    gpus: str | None = None  # "A100:1", SkyPilot's accelerator syntax
    clouds: tuple[str, ...] = ()  # empty: any the provider has credentials for
    max_price: float | None = None  # USD per hour, spot
    workspace_path: str = "~/spotwarp-workspace"
    env: dict[str, str] = field(default_factory=dict)  # passed to the candidate (SPOTWARP_KEY, storage options)
    port: int = 8888

    def start_command(self, candidate_id: str, generation: int) -> str:
        """The shell command a candidate host runs: `spotwarp start` in standby for this race."""
        args = [
            "spotwarp", "start",
            "--project-id", self.project_id,
            "--storage", self.storage,
            "--workspace-path", self.workspace_path,
            "--port", str(self.port),
            "--candidate-id", candidate_id,
            "--generation", str(generation),
        ]
        return " ".join(shlex.quote(a) for a in args)


@dataclass(frozen=True)
class Offer:
    """One machine a provider can start, with its hourly spot price."""

    provider: str
    cloud: str
    region: str | None
    instance_type: str | None
    accelerators: str | None
    price_per_hour: float | None  # spot, USD; None where unknown (local)
    details: dict[str, Any] = field(default_factory=dict)

    def describe(self) -> str:
        where = "/".join(p for p in (self.cloud, self.region, self.instance_type) if p)
        price = f" ${self.price_per_hour:.2f}/h" if self.price_per_hour is not None else ""
        return f"{where}{price}"


@dataclass
class CandidateHandle:
    """A started candidate: which offer, and what the provider needs to find it again."""

    candidate_id: str
    offer: Offer
    data: dict[str, Any] = field(default_factory=dict)  # provider-private (cluster name, pid, ...)


@dataclass(frozen=True)
class CandidateStatus:
    """What `poll` found."""

    state: str  # one of CANDIDATE_STATES
    message: str = ""


class Provider(Protocol):
    """A place that can run candidate hosts (this machine's processes, SkyPilot's clouds)."""

    name: str

    def offers(self, spec: LaunchSpec, count: int) -> Sequence[Offer]:
        """Up to `count` distinct offers for `spec`, cheapest first; empty when none fits."""

    def launch(self, spec: LaunchSpec, offer: Offer, candidate_id: str, generation: int) -> CandidateHandle:
        """Start a candidate on `offer`; returns once asked for, never waits for it to serve."""

    def poll(self, handle: CandidateHandle) -> CandidateStatus:
        """How the candidate is doing now; never raises for a candidate that failed (FAILED)."""

    def down(self, handle: CandidateHandle) -> None:
        """Tear the candidate down (idempotent); the race has already fenced it off."""

    def leaks(self) -> list[str]:
        """Candidates this provider started that are still up although torn down (for the report)."""
