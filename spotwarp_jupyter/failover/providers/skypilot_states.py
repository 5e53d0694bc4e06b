"""A SkyPilot candidate's state: its launch request, then its cluster and job, as PENDING/RUNNING/FAILED/GONE."""

from __future__ import annotations

from typing import Any

from ..provider import FAILED, GONE, PENDING, RUNNING, CandidateStatus
from .skypilot_sdk import one_line

# sky.api_status request states.
_REQUEST_WAITING = ("PENDING", "RUNNING")


def launch_state(sky: Any, data: dict[str, Any]) -> CandidateStatus | None:
    """While the launch request runs: PENDING; when it failed: FAILED; when it succeeded: None (look at the job)."""
    request_id = data["request_id"]
    payloads = sky.api_status([request_id])
    status = str(payloads[0].status).upper() if payloads else ""
    if status.split(".")[-1] in _REQUEST_WAITING:
        return CandidateStatus(PENDING, "provisioning")
    if status.endswith("CANCELLED"):
        return CandidateStatus(GONE, "launch cancelled")
    try:
        job_id, _ = sky.get(request_id)  # raises the launch's own exception when it failed
    except Exception as e:  # noqa: BLE001
        data["error"] = one_line(e)
        return CandidateStatus(FAILED, data["error"])
    data["job_id"] = job_id
    return None


def cluster_state(sky: Any, data: dict[str, Any]) -> CandidateStatus:
    """Once launched: the cluster's and its `spotwarp start` job's states as PENDING/RUNNING/FAILED/GONE."""
    records = sky.get(sky.status([data["cluster"]]))
    if not records:
        return CandidateStatus(GONE, "cluster gone")
    cluster_status = str(records[0]["status"]).split(".")[-1].upper()
    if cluster_status == "INIT":
        return CandidateStatus(PENDING, "cluster initialising")
    if cluster_status != "UP":
        return CandidateStatus(GONE, f"cluster {cluster_status.lower()}")
    job_id = data.get("job_id")
    jobs = sky.get(sky.job_status(data["cluster"], [job_id] if job_id is not None else None))
    # Keys may come back as strings from the API server's JSON.
    job = jobs.get(job_id, jobs.get(str(job_id))) if job_id is not None else next(iter(jobs.values()), None)
    job_status = str(job).split(".")[-1].upper() if job is not None else "MISSING"
    if job_status in ("INIT", "PENDING", "SETTING_UP"):
        return CandidateStatus(PENDING, f"job {job_status.lower()}")
    if job_status == "RUNNING":
        return CandidateStatus(RUNNING, "")
    return CandidateStatus(FAILED, f"spotwarp start ended: job {job_status.lower()}")
