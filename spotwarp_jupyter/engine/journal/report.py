"""The report: what preemptions cost and what SpotWarp saved, read from the journal's events and the manifests.

Feeds `spotwarp report` and `spotwarp status`; pure functions of what they are given (no storage access).
"""

from __future__ import annotations

import statistics
from typing import Any, Sequence

from ..manifests import Manifest
from . import events as kinds  # the event kinds, by name
from .events import Event, _iso

# each begins a new host's run of a project
RECOVERIES = (kinds.RESTORE_STARTED, kinds.KERNEL_RESUMED, kinds.PREEMPTION_DETECTED)


def capture_time(manifests: Sequence[Manifest], snapshot_id: str | None, notebook: str | None) -> float | None:
    """When the kernel state in `snapshot_id` (for `notebook`) was captured.

    A project snapshot copies kernel records: the state's moment is that of the earliest snapshot holding the
    same record. A kernel snapshot's capture began `duration_s` before its commit.
    """
    by_id = {m.id: m for m in manifests}
    target = by_id.get(snapshot_id or "")
    if target is None:
        return None
    if notebook is None or notebook not in target.kernels:
        notebook = next(iter(target.kernels), None)
    if notebook is None:
        return target.created
    record = target.kernels[notebook]
    times = [m.created - (float(m.stats.get("duration_s") or 0) if m.kind == "kernel" else 0.0)
             for m in manifests if m.kernels.get(notebook) == record]
    return min(times) if times else target.created


def _first_fatal_notice_per_run(events: Sequence[Event]) -> list[tuple[Event, Event | None]]:
    """The first fatal notice of each server run, with that run's final snapshot (if one was committed)."""
    notices: dict[Any, Event] = {}
    finals: dict[Any, Event] = {}
    for e in events:
        run = (e.host, e.details.get("run"))
        if e.event == kinds.NOTICE_SEEN and e.details.get("fatal", True) and run not in notices:
            notices[run] = e
        elif e.event == kinds.FINAL_SNAPSHOT_COMMITTED and e.details.get("fatal", True) and run in notices \
                and run not in finals:
            finals[run] = e
    return [(n, finals.get(run)) for run, n in notices.items()]


def _work_origin(manifests: Sequence[Manifest]) -> float | None:
    """When the project's work began: its first snapshot, less the time a kernel snapshot took to capture."""
    return min((m.created - (float(m.stats.get("duration_s") or 0) if m.kind == "kernel" else 0.0)
                for m in manifests), default=None)


def _recovery(notice: Event, next_notice: float, restores: Sequence[Event], used: set[int],
              events: Sequence[Event]) -> tuple[Event | None, Event | None, Event | None]:
    """The recovery from one notice: the restore that began it, that restore's end, and the training resumed."""
    # the first restore after the notice on another run, before the next notice
    start = next((r for r in restores if notice.time <= r.time < next_notice and id(r) not in used
                  and (r.host, r.details.get("run")) != (notice.host, notice.details.get("run"))), None)
    if start is not None:
        used.add(id(start))
    later = [e for e in events if e.time >= (start.time if start else notice.time) and e.time < next_notice]
    finished = next((e for e in later if e.event == kinds.RESTORE_FINISHED and start is not None
                     and e.host == start.host and e.details.get("ok", True)), None)
    resumed = next((e for e in later if e.event == kinds.TRAINING_RESUMED), None)
    return start, finished, resumed


def _totals(rows: list[dict[str, Any]], events: Sequence[Event]) -> dict[str, Any]:
    survived_rows = [r for r in rows if r["survived"]]
    resumes = [r["resume_s"] for r in survived_rows if r["resume_s"] is not None]
    return {
        "preemptions": len(rows),
        "preemptions_survived": len(survived_rows),
        "work_lost_s": round(sum(r["work_lost_s"] or 0.0 for r in survived_rows), 3),
        "resume_s_median": round(statistics.median(resumes), 3) if resumes else None,
        "compute_saved_s": round(sum(r["compute_saved_s"] or 0.0 for r in survived_rows), 3),
        "warnings": sum(1 for e in events if e.event == kinds.NOTICE_SEEN and not e.details.get("fatal", True)),
    }


def loss_without_notice(events: Sequence[Event], started_at: float, lost_run_began: float | None = None) -> bool:
    """Whether the host a new host resumes from stopped with neither a fatal notice nor a final snapshot recorded
    (a SIGKILL, a lost machine).

    A fatal notice ends its host's run, and a final snapshot (a notice's, or one `spotwarp launch --replace` asked
    for) precedes a planned end, so one recorded since that run began (the newest restore, resume or detected loss
    before `started_at`, this host's start, or `lost_run_began` when its heartbeat says) was that host's; none means
    the loss came without one."""
    began = max((e.time for e in events if e.event in RECOVERIES and e.time < started_at),
                default=float("-inf"))
    if lost_run_began is not None:
        began = max(began, lost_run_began)
    return not any(e.time > began and (e.event == kinds.FINAL_SNAPSHOT_COMMITTED
                                       or (e.event == kinds.NOTICE_SEEN and e.details.get("fatal", True)))
                   for e in events)


def _lost_at(event: Event) -> float | None:
    value = event.details.get("lost_at")
    return float(value) if isinstance(value, (int, float)) else None


def _losses(events: Sequence[Event]) -> list[tuple[float, Event, Event | None]]:
    """Every preemption, by when it happened: (time, its notice or detection, the final snapshot on notice)."""
    noticed = [(n.time, n, final) for n, final in _first_fatal_notice_per_run(events)]
    detected = [(_lost_at(e) or e.time, e, None) for e in events if e.event == kinds.PREEMPTION_DETECTED]
    return sorted(noticed + detected, key=lambda loss: loss[0])


def _detected_recovery(loss: Event, events: Sequence[Event], until: float) -> tuple[Event | None, Event | None]:
    """The restore that began the resume which detected `loss` (on the detecting host, before it), and the first
    sign of the training running again after that restore."""
    start = next((r for r in reversed(events) if r.event == kinds.RESTORE_STARTED and r.host == loss.host
                  and r.time <= loss.time), None)
    since = start.time if start is not None else loss.time
    running = next((e for e in events if e.event in (kinds.TRAINING_RESUMED, kinds.KERNEL_RESUMED)
                    and since <= e.time < until), None)
    finished = next((e for e in events if e.event == kinds.RESTORE_FINISHED and start is not None
                     and e.host == start.host and since <= e.time < until and e.details.get("ok", True)), None)
    return start, running or finished or loss


def report(events: Sequence[Event], manifests: Sequence[Manifest]) -> dict[str, Any]:
    """Per project: preemptions survived (with a notice, or without one as a resume detected it), work lost per
    event, time to resume, compute saved (see docs/preemption.md)."""
    events = sorted(events, key=lambda e: e.time)
    losses = _losses(events)
    restores = [e for e in events if e.event == kinds.RESTORE_STARTED]
    rows: list[dict[str, Any]] = []
    embodied = 0.0  # compute held by the restored state: what restarting from scratch would have to redo
    work_since = _work_origin(manifests)  # when the current run's work started
    used: set[int] = set()
    for index, (when, notice, final) in enumerate(losses):
        next_loss = losses[index + 1][0] if index + 1 < len(losses) else float("inf")
        if notice.event == kinds.PREEMPTION_DETECTED:
            start, running_again = _detected_recovery(notice, events, next_loss)
            restored_id, notebook = notice.snapshot, notice.notebook
            lost_at = _lost_at(notice)
            host = str(notice.details.get("lost_host") or "?")
            resumed = (running_again if running_again is not None and running_again.event == kinds.TRAINING_RESUMED
                       else None)
        else:
            start, finished, resumed = _recovery(notice, next_loss, restores, used, events)
            restored_id = (resumed.snapshot if resumed and resumed.snapshot else None) or (start.snapshot if start else None)
            notebook = resumed.notebook if resumed else None
            lost_at = final.time if final is not None else notice.time
            host = notice.host
            running_again = resumed or finished
        captured = capture_time(manifests, restored_id, notebook)
        saved = None
        if running_again is not None and captured is not None and work_since is not None:
            embodied += max(0.0, captured - work_since)
            saved = round(embodied, 3)
            work_since = running_again.time
        rows.append({
            "time": _iso(when), "with_notice": notice.event == kinds.NOTICE_SEEN,
            "notice": notice.as_dict()["time"] if notice.event == kinds.NOTICE_SEEN else None, "host": host,
            "source": notice.details.get("source") if notice.event == kinds.NOTICE_SEEN else None,
            "final_snapshot": final.snapshot if final else None,
            "notice_to_final_s": final.details.get("notice_to_commit_s") if final else None,
            "restored_snapshot": restored_id, "restored_on": start.host if start else (resumed.host if resumed else None),
            "survived": running_again is not None,
            "work_lost_s": None if captured is None or lost_at is None else round(max(0.0, lost_at - captured), 3),
            "resume_s": round(running_again.time - start.time, 3) if running_again and start else None,
            "compute_saved_s": saved,
            "resumed_at_step": resumed.details.get("position") if resumed else None,
        })
    return {**_totals(rows, events), "events": rows, "failovers": failover_rows(events), "resumes": resume_rows(events, manifests)}


def failover_rows(events: Sequence[Event]) -> list[dict[str, Any]]:
    """One row per race of `spotwarp launch`: why, and detect / provision / restore-and-serve / total seconds."""
    rows = []
    for e in events:
        if e.event != kinds.FAILOVER_FINISHED:
            continue
        d = e.details
        rows.append({
            "time": e.as_dict()["time"], "race": d.get("race"), "reason": d.get("reason"), "lost": d.get("lost"),
            "provider": d.get("provider"), "generation": d.get("generation"), "ok": d.get("ok", False),
            "winner": d.get("winner"), "offer": d.get("offer"), "detect_s": d.get("detect_s"),
            "provision_s": d.get("provision_s"), "restore_serve_s": d.get("restore_serve_s"),
            "total_s": d.get("total_s"), "error": d.get("error"), "candidates": d.get("candidates") or [],
        })
    return rows


def resume_rows(events: Sequence[Event], manifests: Sequence[Manifest] = ()) -> list[dict[str, Any]]:
    """One row per cell a new host's server ran again by itself (docs/resume.md): where, from which snapshot, at
    which step, seconds from `spotwarp start` to the training running again, and the steps redone."""
    events = sorted(events, key=lambda e: e.time)
    rows = []
    for e in events:
        if e.event != kinds.KERNEL_RESUMED:
            continue
        redone, how = steps_redone(e, events, manifests)
        rows.append({"time": e.as_dict()["time"], "host": e.host, "notebook": e.notebook, "snapshot": e.snapshot,
                     "cell": e.details.get("cell"), "positions": dict(e.details.get("positions") or {}),
                     "start_to_running_s": e.details.get("start_to_running_s"), "steps_redone": redone,
                     "steps_redone_how": how, "steps_redone_upper_bound": "(an upper bound)" in how})
    return rows


def steps_redone(resumed: Event, events: Sequence[Event], manifests: Sequence[Manifest]) -> tuple[int | None, str]:
    """The steps the lost host completed after the snapshot a resume continued from, and how that is known.

    Nothing records the lost host's last step, so it is estimated: its step rate over its newest snapshots taken at
    a loop's step (since an inner loop last started over; the loop that moved most), times the seconds from the
    snapshot's capture to the host's end. That end is the commit of its final snapshot on notice (its kernels stop
    there), else its last sign of life (a `host_lost` or `preemption_detected` event's last heartbeat), else the
    start of the host that resumed: an upper bound, said so. None when the rate or the snapshot is not known."""
    captured = capture_time(manifests, resumed.snapshot, resumed.notebook)
    if captured is None:
        return None, "unknown: the snapshot it continued from is not in the listing"
    target = next((m for m in manifests if m.id == resumed.snapshot), None)
    rate = _step_rate(manifests, resumed.notebook, target.created if target else captured)
    if rate is None:
        return None, "unknown: fewer than two snapshots at a loop's step before it (no step rate)"
    loop, per_s = rate
    started = resumed.time - float(resumed.details.get("start_to_running_s") or 0.0)
    finals = [e.time for e in events if e.event == kinds.FINAL_SNAPSHOT_COMMITTED and e.details.get("fatal", True)
              and captured <= e.time <= started]
    # the loss recorded after the capture (its last heartbeat change may come before it: then nothing was redone)
    lost = [max(captured, lost_at) for e in events if e.event in (kinds.HOST_LOST, kinds.PREEMPTION_DETECTED)
            and (lost_at := _lost_at(e)) is not None and captured <= e.time <= resumed.time]
    if finals:
        end, until = finals[0], "the final snapshot's commit on notice (its kernels stopped there)"
    elif lost:
        end, until = lost[-1], "its last heartbeat"
    else:
        end, until = started, "the resuming host's start (an upper bound)"
    steps = max(0, round(per_s * (end - captured)))
    return steps, (f"estimated: {per_s:.2f} steps/s of loop {loop!r} x {max(0.0, end - captured):.1f} s from the "
                   f"snapshot to {until}")


def _step_rate(manifests: Sequence[Manifest], notebook: str | None, until: float) -> tuple[str, float] | None:
    """(loop, steps per second) over the newest run of snapshots of `notebook` at a loop's step up to `until` in
    which no loop started over (a new epoch ends it), measured on the loop that moved most."""
    records = sorted(((m.created, m.kernels[notebook].get("positions") or {}) for m in manifests
                      if notebook in m.kernels and m.kernels[notebook].get("at") == "step"
                      and m.created <= until), key=lambda r: r[0])
    unique = [r for i, r in enumerate(records) if i == 0 or r[1] != records[i - 1][1]]  # project copies repeat
    first = len(unique) - 1
    while first > 0 and all(n >= unique[first - 1][1].get(name, 0) for name, n in unique[first][1].items()
                            if isinstance(n, int)) and unique[first - 1][0] < unique[first][0]:
        first -= 1
    if first == len(unique) - 1:
        return None
    (t0, before), (t1, after) = unique[first], unique[-1]
    moved = {name: n - before.get(name, 0) for name, n in after.items() if isinstance(n, int)}
    loop = max(moved, key=lambda name: moved[name], default=None)
    return None if loop is None or moved[loop] <= 0 else (loop, moved[loop] / (t1 - t0))
