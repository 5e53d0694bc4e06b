"""`spotwarp report`: preemptions survived, work lost, time to resume, compute saved; failover races."""

from __future__ import annotations

import argparse

from ..engine.units import format_duration
from ..service import Project
from .common import EXIT_OK, _print, _stored_engine, command


@command("report")
def cmd_report(args: argparse.Namespace) -> int:
    project = Project(_stored_engine(args))
    data = {"project": project.name, **project.report()}
    fmt = lambda s: "-" if s is None else format_duration(s)  # noqa: E731
    lines = [f"project {data['project']}: {data['preemptions_survived']} of {data['preemptions']} preemptions "
             f"survived, work lost {fmt(data['work_lost_s'])}, median time to resume {fmt(data['resume_s_median'])}, "
             f"compute saved {fmt(data['compute_saved_s'])}"]
    if data["events"]:
        lines.append(f"{'lost (UTC)':<25} {'host':<16} {'notice':<8} {'final':<10} {'restored':<10} "
                     f"{'lost':>8} {'resume':>8} {'saved':>8}")
    for r in data["events"]:
        notice = (r["source"] or "?") if r.get("with_notice", True) else "none"  # none: a resume detected the loss
        lines.append(f"{r.get('time') or r['notice']:<25} {r['host'][:16]:<16} {notice:<8} {r['final_snapshot'] or '-':<10} "
                     f"{r['restored_snapshot'] or '-':<10} {fmt(r['work_lost_s']):>8} {fmt(r['resume_s']):>8} "
                     f"{fmt(r['compute_saved_s']):>8}")
    if data["failovers"]:
        lines.append(f"failovers: {sum(1 for f in data['failovers'] if f['ok'])} of {len(data['failovers'])} races "
                     "served the session")
        lines.append(f"{'time (UTC)':<25} {'reason':<13} {'provider':<9} {'candidate':<16} {'offer':<24} "
                     f"{'detect':>8} {'provision':>9} {'restore+serve':>13} {'total':>8}  outcome")
    for f in data["failovers"]:
        lines.append(f"{f['time']:<25} {f['reason'] or '-':<13} {f['provider'] or '-':<9} {'(race)':<16} {'':<24} "
                     f"{fmt(f['detect_s']):>8} {fmt(f['provision_s']):>9} {fmt(f['restore_serve_s']):>13} "
                     f"{fmt(f['total_s']):>8}  {'winner ' + f['winner'] if f['ok'] else f['error'] or 'failed'}")
        for c in f["candidates"]:
            lines.append(f"{'':<25} {'':<13} {'':<9} {c['id'][:16]:<16} {(c['offer'] or '')[:24]:<24} {'':>8} "
                         f"{fmt(c['provision_s']):>9} {fmt(c['restore_serve_s']):>13} {'':>8}  "
                         f"{c['state']}{': ' + c['message'] if c.get('message') else ''}")
    if data.get("resumes"):
        lines.append(f"resumed by the server (docs/resume.md): {len(data['resumes'])}")
        lines.append(f"{'time (UTC)':<25} {'host':<16} {'notebook':<20} {'snapshot':<10} {'continued after':<24} "
                     f"{'start to running':>16} {'redone':>8}  how")
    for r in data.get("resumes") or []:
        steps = ", ".join(f"{name} {n}" for name, n in sorted(r["positions"].items())) or "-"
        redone = ("?" if r.get("steps_redone") is None
                  else f"<={r['steps_redone']}" if r.get("steps_redone_upper_bound") else f"~{r['steps_redone']}")
        lines.append(f"{r['time']:<25} {r['host'][:16]:<16} {(r['notebook'] or '-')[:20]:<20} {r['snapshot'] or '-':<10} "
                     f"{steps[:24]:<24} {fmt(r['start_to_running_s']):>16} {redone:>8}  {r.get('steps_redone_how') or ''}")
    _print(args, data, "\n".join(lines))
    return EXIT_OK
