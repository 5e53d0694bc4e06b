"""The kernel's half of resuming on a new host (server/resume.py runs it; docs/resume.md).

The server starts the notebook's kernel, loads SpotWarp in it and calls `restore_for_resume`: the same restore
as `%spotwarp restore` (variables, policy, RNG states, loop positions). What it restored and what the snapshot
says was running comes back as JSON through the execute reply's `user_expressions` (`outcome_json`), so the
server needs no output stream to learn it.
"""

from __future__ import annotations

import json
from typing import Any

from ..engine import SpotWarpError
from .session import current

_outcome: dict[str, Any] = {}


def restore_for_resume(ref: str = "latest", warning: str | None = None) -> None:
    """Restore `ref` (the notebook's newest snapshot for `latest`) into this kernel; remember what it said.
    `warning`: the server's, when it resumes code no key vouches for (opted in): said with the kernel's line."""
    global _outcome
    try:
        session = current()
        manifest, result = session.restore(ref)
        record = session.engine.kernel_record(manifest, session.name_in(manifest))
    except SpotWarpError as exc:
        _outcome = {"error": str(exc)}
        return
    except Exception as exc:  # noqa: BLE001 - reported to the server in one line, never a traceback
        _outcome = {"error": f"{type(exc).__name__}: {exc}"}
        return
    _outcome = {"snapshot": manifest.id, "host": manifest.host, "created": manifest.created_iso,
                "created_ts": manifest.created, "notebook": session.notebook, "at": record.get("at"), "running": record.get("running"),
                "positions": record.get("positions") or {}, "resume": session.policy.resume,
                "restored": len(result.restored), "warnings": list(result.warnings),
                "damaged": sorted(record.get("damaged") or {}), "warning": warning}
    session.resumed = resumed_facts(_outcome)
    running = record.get("running") if isinstance(record.get("running"), dict) else {}
    if isinstance(running.get("outputs"), list):  # what the cell printed up to the snapshot leads its run again
        session.carried_outputs = (running.get("id"), [o for o in running["outputs"] if isinstance(o, dict)])


def resumed_facts(outcome: dict[str, Any]) -> dict[str, Any]:
    """What `%spotwarp status` and the widget say of a kernel the server restored on a new host."""
    running = outcome["running"] if isinstance(outcome.get("running"), dict) else None
    rerun = running is not None and outcome.get("at") == "step" and bool(outcome.get("resume"))
    line = f"on this host from snapshot {outcome['snapshot']} ({outcome['host']}, {outcome['created']})"
    steps = ", ".join(f"step {n} of loop {name!r}" for name, n in sorted(outcome["positions"].items()))
    if running is None:
        line += ": no cell was running when it was taken"
    elif rerun:
        line += f" at {steps or 'its start'}: cell {running.get('id')} run again by the server"
    else:
        line += (f": cell {running.get('id')} was interrupted outside a resumable loop and is not run again (run it, "
                 f"or click 'Run cell {running.get('id')}' in the SpotWarp panel)")
    if outcome.get("warning"):
        line += f"; WARNING: {outcome['warning']}"
    return {"snapshot": outcome["snapshot"], "positions": dict(outcome["positions"]),
            "cell": None if running is None else running.get("id"), "rerun": rerun, "line": line}


def outcome_json() -> str:
    """What the last `restore_for_resume` did, as JSON."""
    return json.dumps(_outcome)
