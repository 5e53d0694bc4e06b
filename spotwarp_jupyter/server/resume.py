"""The session resumes by itself on a new host: kernels back, the interrupted training cell continues (docs/resume.md).

After `spotwarp start` (or a promotion, or the hub's restore on spawn) restored the files into an empty workspace,
every notebook whose kernel was live in the snapshot gets a Jupyter session through the server's own session
manager (a JupyterLab tab opening the notebook later attaches to that kernel), the kernel restores its state as
`%spotwarp restore` does, and a cell that was running inside a `resumable` loop when the snapshot was taken runs
again from its recorded source: the loop continues at the next step. Its outputs go into that cell of the notebook
as they come: live into the notebook's shared document when jupyter-collaboration runs in this server, else into
the file through the contents manager (server/cell_outputs.py).
Nothing here blocks the event loop: kernels are driven through async clients, the store is read in the
service's thread pool.
"""

from __future__ import annotations

import ast
import asyncio
import concurrent.futures
import json
import logging
import os
import time
from dataclasses import dataclass, field
from queue import Empty
from typing import Any

from jupyter_core.utils import ensure_async

from ..engine import Manifest, SnapshotEngine, SpotWarpError
from ..engine.coordination import HOLDER, SERVING
from ..engine.coordination.heartbeats import read_heartbeats, stale_after
from ..engine.journal import (
    FINAL_SNAPSHOT_COMMITTED,
    HOST_LOST,
    KERNEL_RESUMED,
    PREEMPTION_DETECTED,
    loss_without_notice,
)
from ..engine.keys import resume_trust, vouched
from ..engine.units import format_duration
from ..service.project import resume_sources
from .cell_outputs import Outputs, open_outputs, private_missing
from .kernel_link import wait_until_served

log = logging.getLogger("spotwarp")
RESTORE_TIMEOUT_S = 600.0
_KERNEL_RESUME = "__import__('spotwarp_jupyter.kernel.resume', fromlist=['_'])"


@dataclass
class Plan:
    """One notebook to resume, or why not (`skip`)."""

    notebook: str
    api_path: str = ""
    kernel_name: str = ""
    cells: dict[str, str] = field(default_factory=dict)  # cell id -> source in the notebook file now
    skip: str | None = None
    kept: bool = False  # the notebook is a kept workspace's, as its user left it (not restored from the snapshot)
    saved_at: float | None = None  # the notebook file's mtime, for a kept one


def plan_resume(engine: SnapshotEngine, workspace: str, root_dir: str, snapshot_id: str, ref: str,
                kernelspecs: set[str], default_spec: str, resume_unsigned: bool = False,
                kept: bool = False) -> list[Plan]:
    """Which notebooks to resume (blocking: reads the store and the notebook files).

    The notebooks whose kernel was live in the snapshot the files came from, and, when that was `latest`, those
    of kernel snapshots taken after it. A notebook whose record no key vouches for starts no kernel (its restore
    would unpickle, its recorded cell run, a store writer's code), unless `resume_unsigned` accepts that.
    `kept`: the workspace was kept (its files were not restored): each notebook is taken as it is on disk."""
    sources: dict[str, Manifest] = resume_sources(engine.manifests(), snapshot_id, ref)
    plans = []
    for name in sorted(sources):
        manifest = sources[name]
        if not resume_unsigned and not vouched(manifest, engine.key):
            plan = Plan(name, skip=str(resume_trust(engine.settings.project, [manifest], engine.key, False).line))
        else:
            plan = _plan_one(name, manifest.kernels[name], workspace, root_dir, kernelspecs, default_spec)
            if kept and not plan.skip:
                plan.kept = True
                try:
                    plan.saved_at = os.stat(os.path.join(workspace, *name.split("/"))).st_mtime
                except OSError:
                    plan.saved_at = None
        plans.append(plan)
    return plans


def _plan_one(notebook: str, record: dict[str, Any], workspace: str, root_dir: str, kernelspecs: set[str],
              default_spec: str) -> Plan:
    plan = Plan(notebook)
    policy = record.get("policy") if isinstance(record.get("policy"), dict) else {}
    if policy.get("resume") is False:
        plan.skip = "resume is off in its policy (%spotwarp policy --no-resume): no kernel started"
        return plan
    path = os.path.realpath(os.path.join(workspace, *notebook.split("/")))
    if not os.path.isfile(path) or not path.startswith(os.path.realpath(workspace) + os.sep):
        plan.skip = "the notebook is not in the workspace (deleted or renamed since the snapshot): no kernel started"
        return plan
    try:
        with open(path, encoding="utf-8") as f:
            document = json.load(f)
        spec = ((document.get("metadata") or {}).get("kernelspec") or {}).get("name") or default_spec
        plan.cells = {c["id"]: _text(c.get("source")) for c in document.get("cells") or ()
                      if isinstance(c, dict) and isinstance(c.get("id"), str)}
    except (OSError, ValueError, AttributeError) as exc:
        plan.skip = f"the notebook cannot be read ({exc}): no kernel started"
        return plan
    if spec not in kernelspecs:
        plan.skip = f"its kernelspec {spec!r} is not installed on this host: no kernel started"
        return plan
    plan.kernel_name = spec
    plan.api_path = os.path.relpath(path, os.path.realpath(root_dir)).replace(os.sep, "/")
    return plan


def _text(source: Any) -> str:
    return "".join(source) if isinstance(source, list) else str(source or "")


def the_loss(service: Any, snapshot_id: str, own_id: str | None) -> dict[str, Any]:
    """What is known of the loss of the host this one resumes from (blocking: reads the store), and, when a host
    served the project after the snapshot and stopped with no notice or final snapshot recorded, a
    `preemption_detected` event in the journal: the report and the panel count it.

    Its end is the orchestrator's `host_lost`, else the newest heartbeat of another serving host around the
    snapshot (a heartbeat is written every few seconds: the host ran until then, at least)."""
    engine = service.engine
    try:
        began = float(os.environ.get("SPOTWARP_STARTED_AT") or 0) or time.time()
    except ValueError:
        began = time.time()
    manifest = next((m for m in engine.manifests() if m.id == snapshot_id), None)
    events = service.journal.events()
    finals = {e.snapshot for e in events if e.event == FINAL_SNAPSHOT_COMMITTED and e.details.get("fatal", True)}
    loss: dict[str, Any] = {"finals": sorted(f for f in finals if f)}
    since = manifest.created if manifest is not None else began
    beats = [d for d in read_heartbeats(engine.store) if d.get("id") != own_id and d.get("state") in (SERVING, HOLDER)
             and float(d.get("time") or 0) >= since - stale_after(d)]
    if beats:
        lost = max(beats, key=lambda d: float(d["time"]))
        loss.update(host=str(lost.get("host") or lost["id"]), lost_at=float(lost["time"]),
                    run_began=lost.get("started_at") or lost.get("ready_at"))
    orchestrated = [e for e in events if e.event == HOST_LOST and isinstance(e.details.get("lost_at"), (int, float))
                    and e.time >= since]
    if orchestrated:
        loss["lost_at"] = float(orchestrated[-1].details["lost_at"])
    run_began = loss.get("run_began") if isinstance(loss.get("run_began"), (int, float)) else None
    loss["with_notice"] = not loss_without_notice(events, began, run_began)
    if not loss["with_notice"] and "lost_at" in loss:  # a host served after the snapshot, and is gone
        service.journal.record(PREEMPTION_DETECTED, snapshot_id, lost_host=loss.get("host"),
                               lost_at=loss.get("lost_at"), started_at=began)
    return loss


def idle_words(snapshot_id: str, created: float | None, loss: dict[str, Any]) -> str:
    """What a restored snapshot taken between cells says of the lost host: no cell ran when it was taken, and what
    is known of the time after it."""
    if snapshot_id in (loss.get("finals") or ()):
        return "no cell was running at its final snapshot, taken on notice"
    lost_at = loss.get("lost_at")
    if lost_at is not None and created is not None:
        return (f"no cell was running when it was taken, {format_duration(max(0.0, lost_at - created))} before "
                f"{loss.get('host') or 'the lost host'}'s last heartbeat: what ran after it is in no snapshot")
    return "no cell was running when it was taken: what ran after it on the lost host is not known"


class Resumer:
    """Resumes the notebooks of one restore; what happened to each is in `service.resumed` (status) and the log."""

    def __init__(self, service: Any, serverapp: Any, gate: asyncio.Event | None = None, warm: Any = None):
        self.service = service
        self.serverapp = serverapp
        self.gate = gate  # a promoted candidate's promotion snapshot committed: only then does a cell run
        self.warm = warm  # a promoted standby's warm kernels (warm_kernels.py)
        self.tasks: set[asyncio.Task] = set()
        # notebook -> (its plan, the cell interrupted outside a resumable loop): what POST resume/run runs
        self.interrupted: dict[str, tuple[Plan, dict[str, Any]]] = {}
        self.loss: dict[str, Any] = {}  # what is known of the lost host's end (the_loss)
        self.warning: str | None = None  # opted in to a resume no key vouches for: said with every entry
        service.resumer = self

    def say(self, notebook: str, state: str, line: str, **facts: Any) -> dict[str, Any]:
        """Record one notebook's state (replacing its previous one) and log its line."""
        if self.warning and state not in ("skipped", "off"):
            line, facts = f"{line}; WARNING: {self.warning}", {**facts, "warning": self.warning}
        entry = {"notebook": notebook, "state": state, "line": f"{notebook}: {line}", **facts}
        self.service.resumed[:] = [e for e in self.service.resumed if e["notebook"] != notebook] + [entry]
        server_log = getattr(self.serverapp, "log", log)  # Jupyter's own log shows INFO lines
        (server_log.warning if state in ("skipped", "failed") else server_log.info)("SpotWarp resume: %s", entry["line"])
        return entry

    async def resume(self, snapshot_id: str, ref: str = "latest", kept: bool = False) -> None:
        """Resume every notebook of the snapshot `snapshot_id` the files were restored from (`kept`: the workspace
        kept its own files, only missing ones were restored)."""
        heartbeat = getattr(self.service, "heartbeat", None)
        try:
            self.loss = await self.service.run(the_loss, self.service, snapshot_id, getattr(heartbeat, "id", None))
        except Exception as exc:  # noqa: BLE001 - the resume goes on; the report misses this loss
            log.warning("SpotWarp resume: the lost host's end not known: %s", exc)
        unsigned_ok = bool(getattr(getattr(self.service, "project", None), "resume_unsigned", False))
        try:
            await self._trust(snapshot_id, ref)
            names = await kernel_names(self.service, self.serverapp)
            plans = await self.service.run(plan_resume, self.service.engine, self.service.workspace,
                                           self.service.root_dir, snapshot_id, ref, names,
                                           self.serverapp.kernel_manager.default_kernel_name, unsigned_ok, kept)
        except Exception as exc:  # noqa: BLE001 - the store or a kernelspec unreadable: one line, nothing run
            self.say("*", "failed", f"nothing resumed: {type(exc).__name__}: {exc}")
            plans = []
        try:
            for plan in plans:
                if plan.skip:
                    self.say(plan.notebook, "skipped", plan.skip)
                else:
                    warm = self.warm.take(plan, self.serverapp.kernel_manager) if self.warm is not None else None
                    task = asyncio.ensure_future(self._one(plan, ref if ref not in ("", None) else "latest", warm))
                    self.tasks.add(task)
                    task.add_done_callback(self.tasks.discard)
        finally:  # the warm kernels no plan took go down, whatever happened above
            if self.warm is not None:
                await self.warm.shut_down_unused(self.serverapp)
        if self.tasks:
            await asyncio.gather(*list(self.tasks), return_exceptions=True)

    async def _trust(self, snapshot_id: str, ref: str) -> None:
        """Whether a key vouches for what the resume would run: in status (`trust`) and, when not, one line in the
        log; opted in (resume_unsigned), the warning goes with every notebook's entry."""
        trust = await self.service.run(self.service.project.resume_trust, snapshot_id, ref)
        self.service.trust.update(trust.as_dict())
        if trust.line:
            getattr(self.serverapp, "log", log).warning("SpotWarp resume: %s", trust.line)
        if trust.allowed and not trust.vouched:
            self.warning = trust.line

    async def _one(self, plan: Plan, ref: str, warm: Any = None) -> None:
        resuming = getattr(self.service, "resuming", set())
        resuming.add(plan.notebook)  # its kernel, once started, is being restored: GET status offers nothing yet
        try:
            await self._resume_one(plan, ref, warm)
        finally:
            resuming.discard(plan.notebook)

    async def _resume_one(self, plan: Plan, ref: str, warm: Any) -> None:
        started = time.monotonic()
        sessions = self.serverapp.session_manager
        if await ensure_async(sessions.session_exists(path=plan.api_path)):
            self.say(plan.notebook, "skipped", "a session for it was opened before the resume got to it: "
                     "its kernel is left to its user (%spotwarp restore)")
            await self._shut_down_warm(warm)
            return
        try:  # `warm`: a kernel a standby started for it (warm_kernels.py), else a new one
            if warm is not None:
                await warm.ready()
            session = await sessions.create_session(
                path=plan.api_path, name=os.path.basename(plan.api_path), type="notebook", kernel_name=plan.kernel_name,
                kernel_id=warm.kernel_id if warm is not None else None)
            kernel_id = session["kernel"]["id"]
        except Exception as exc:  # noqa: BLE001 - one line in status and log
            self.say(plan.notebook, "failed", f"its kernel did not start: {type(exc).__name__}: {exc}")
            await self._shut_down_warm(warm)
            return
        client = self.serverapp.kernel_manager.get_kernel(kernel_id).client()
        client.start_channels(shell=True, iopub=True, stdin=False, hb=False, control=False)
        try:
            await client.wait_for_ready(timeout=RESTORE_TIMEOUT_S)
            await _answer_kernel_info_for_tabs(client, self.serverapp.kernel_manager.get_kernel(kernel_id))
            timings = {"kernel_started_s": _since_start(started)}
            outcome = await self._restore(client, ref)
            outcome["timings"] = {**timings, "state_restored_s": _since_start(started)}
            await self._continue(client, kernel_id, plan, outcome, started)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - one line in status and log
            self.say(plan.notebook, "failed", f"{type(exc).__name__}: {exc}", kernel_id=kernel_id)
        finally:
            client.stop_channels()

    async def _shut_down_warm(self, warm: Any) -> None:
        """A warm kernel no session took: its imports cancelled, the kernel shut down (gone already: logged)."""
        if warm is None:
            return
        if warm.imported is not None:
            warm.imported.cancel()
        try:
            await ensure_async(self.serverapp.kernel_manager.shutdown_kernel(warm.kernel_id, now=True))
        except Exception as exc:  # noqa: BLE001 - gone already
            log.warning("SpotWarp: warm kernel %s not shut down: %s", warm.kernel_id, exc)

    async def _restore(self, client: Any, ref: str) -> dict[str, Any]:
        """Load SpotWarp in the kernel and restore, as `%spotwarp restore` does; what the kernel says it did."""
        code = f"%load_ext spotwarp\n{_KERNEL_RESUME}.restore_for_resume({ref!r}, {self.warning!r})"
        msg_id = client.execute(code, silent=False, store_history=False, allow_stdin=False,
                                user_expressions={"outcome": f"{_KERNEL_RESUME}.outcome_json()"})
        reply = await _reply(client, msg_id, RESTORE_TIMEOUT_S)
        await _until_idle(client, msg_id, RESTORE_TIMEOUT_S)  # iopub is live: the cell's outputs will all come
        content = reply["content"]
        if content.get("status") != "ok":
            raise SpotWarpError(f"loading SpotWarp failed: {content.get('ename')}: {content.get('evalue')}")
        value = content.get("user_expressions", {}).get("outcome", {})
        if value.get("status") != "ok":
            raise SpotWarpError(f"the restore did not report: {value.get('ename')}: {value.get('evalue')}")
        return json.loads(ast.literal_eval(value["data"]["text/plain"]))

    async def _continue(self, client: Any, kernel_id: str, plan: Plan, outcome: dict[str, Any],
                        started: float) -> None:
        """After the restore: re-run the interrupted cell when it was inside a resumable loop, else say which it was."""
        if "error" in outcome:
            self.say(plan.notebook, "failed", f"state not restored, nothing run: {outcome['error']}",
                     kernel_id=kernel_id)
            return
        facts = {"kernel_id": kernel_id, "snapshot": outcome["snapshot"], "positions": outcome.get("positions") or {},
                 **outcome["timings"]}
        running = outcome.get("running") if isinstance(outcome.get("running"), dict) else None
        where = f"restored from snapshot {outcome['snapshot']} ({outcome.get('host')}, {outcome.get('created')})"
        if outcome.get("damaged"):  # failed to restore before, carried forward by later snapshots: never silent
            where += f" without {', '.join(outcome['damaged'])} (damaged in an earlier snapshot, not restored)"
        if running is None:
            where += _kept_words(plan, outcome)
            created = outcome.get("created_ts") if isinstance(outcome.get("created_ts"), (int, float)) else None
            if self.loss.get("lost_at") is not None:
                facts["lost_at"] = self.loss["lost_at"]
            self.say(plan.notebook, "restored", f"{where}; {idle_words(outcome['snapshot'], created, self.loss)}",
                     **facts)
            return
        cell = running.get("id") or "(a cell without id)"
        where += _kept_words(plan, outcome)
        if plan.kept and outcome.get("at") == "step" and running.get("id") not in plan.cells:
            self.say(plan.notebook, "restored", f"{where}; cell {cell} was running, and the notebook on disk no "
                     "longer holds it: not run again (the notebook as its user left it wins)",
                     interrupted_cell=running.get("id"), **facts)
            return
        if outcome.get("at") != "step" or not outcome.get("resume", True):
            why = "resume is off in its policy" if outcome.get("at") == "step" else "outside a resumable loop"
            self.interrupted[plan.notebook] = (plan, running)
            self.say(plan.notebook, "restored", f"{where}; cell {cell} was running ({why}): not run again "
                     f"(run it yourself, or with 'Run cell {cell}' in the SpotWarp panel)",
                     interrupted_cell=running.get("id"), **facts)
            return
        note = ""
        if running.get("id") in plan.cells and plan.cells[running["id"]] != running["source"]:
            note = "; the notebook's cell differs from what ran: the recorded source is run"
        steps = ", ".join(f"step {n} of loop {name!r}" for name, n in sorted(facts["positions"].items()))
        if self.gate is not None:
            await self.gate.wait()  # what the cell writes ranks after the promotion snapshot
        facts.update(cell=running.get("id"), seconds_to_running=_since_start(started))
        self.say(plan.notebook, "running", f"{where}; re-running cell {cell} from {steps or 'its start'}{note}",
                 **facts)
        await _journal_resumed(self.service, plan.notebook, facts)
        status = await CellRun(self, client, kernel_id, plan, running).run()
        self.say(plan.notebook, "finished" if status == "ok" else "failed",
                 f"{where}; cell {cell} re-ran and {'finished' if status == 'ok' else 'ended: ' + status}{note}",
                 **facts)


def _kept_words(plan: Plan, outcome: dict[str, Any]) -> str:
    """For a kept workspace's notebook: that its file stayed as it was, and, when it was saved after the snapshot,
    that the kernel's state is nonetheless the snapshot's (the newest there is)."""
    if not plan.kept:
        return ""
    created = outcome.get("created_ts")
    if plan.saved_at is not None and isinstance(created, (int, float)) and plan.saved_at > created + 1.0:
        return (f"; the notebook on disk, kept as it is, was saved {format_duration(plan.saved_at - created)} after "
                "that snapshot: the kernel holds the snapshot's state, the newest stored")
    return "; the notebook on disk kept as it is"


class RunRefused(Exception):
    """POST resume/run refused: `status` is the HTTP status, the message one line."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


async def run_interrupted(resumer: Resumer | None, notebook: str) -> dict[str, Any]:
    """Run again, as asked (the panel's one click), the recorded source of the cell that was interrupted outside a
    resumable loop in `notebook`, in its resumed kernel; its outputs go into the notebook as a re-run's do.

    Answers the notebook's status entry once the cell is sent; RunRefused for an unknown notebook, a promotion
    not yet committed, nothing interrupted (or already run), or a kernel that is gone."""
    entry = next((e for e in resumer.service.resumed if e["notebook"] == notebook), None) if resumer else None
    if entry is None or resumer is None:
        raise RunRefused(404, f"{notebook}: not resumed on this host (see resume in GET status)")
    if resumer.gate is not None and not resumer.gate.is_set():  # what it writes must rank after the promotion
        raise RunRefused(409, f"{notebook}: promotion in progress: run it once the promotion snapshot is committed")
    held = resumer.interrupted.pop(notebook, None)  # taken before any await: a second ask at once finds nothing
    if held is None or entry.get("state") != "restored":
        raise RunRefused(409, f"{notebook}: no interrupted cell waits to run (state {entry.get('state')})")
    kernel_id = entry.get("kernel_id")
    kernels = resumer.serverapp.kernel_manager
    km = kernels.get_kernel(kernel_id) if kernel_id in kernels else None
    if km is None or not await ensure_async(km.is_alive()):
        resumer.interrupted[notebook] = held  # asked again, it says the same
        raise RunRefused(409, f"{notebook}: its resumed kernel {kernel_id} is gone (shut down): nothing run")
    plan, running = held
    facts = {k: v for k, v in entry.items() if k not in ("notebook", "state", "line", "interrupted_cell", "cell")}
    cell = running.get("id") or "(a cell without id)"
    where = f"restored from snapshot {entry.get('snapshot')}"
    answer = resumer.say(notebook, "running", f"{where}; running interrupted cell {cell} again, as asked",
                         **facts, cell=running.get("id"))
    task = asyncio.ensure_future(_run_asked(resumer, km, kernel_id, plan, running, where, facts))
    resumer.tasks.add(task)
    task.add_done_callback(resumer.tasks.discard)
    return answer


async def _run_asked(resumer: Resumer, km: Any, kernel_id: str, plan: Plan, running: dict[str, Any], where: str,
                     facts: dict[str, Any]) -> None:
    cell = running.get("id") or "(a cell without id)"
    client = km.client()
    client.start_channels(shell=True, iopub=True, stdin=False, hb=False, control=False)
    try:
        await wait_until_served(client, RESTORE_TIMEOUT_S)  # no kernel_info: the restored `random` stays as it is
        status = await CellRun(resumer, client, kernel_id, plan, running).run()
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # noqa: BLE001 - one line in status and log
        status = f"{type(exc).__name__}: {exc}"
    finally:
        client.stop_channels()
    resumer.say(plan.notebook, "finished" if status == "ok" else "failed",
                f"{where}; cell {cell} ran again, as asked, and {'finished' if status == 'ok' else 'ended: ' + status}",
                **facts, cell=running.get("id"))


async def _journal_resumed(service: Any, notebook: str, facts: dict[str, Any]) -> None:
    """`kernel_resumed` in the project's journal (`spotwarp report`), off the event loop; a failure is only logged."""
    try:
        await service.run(service.journal.record, KERNEL_RESUMED, facts["snapshot"], notebook, cell=facts["cell"],
                          positions=facts["positions"], start_to_running_s=facts["seconds_to_running"])
    except Exception as exc:  # noqa: BLE001 - the training goes on; the report misses one row
        log.warning("SpotWarp resume: kernel_resumed not journaled: %s", exc)


async def kernel_names(service: Any, serverapp: Any) -> set[str]:
    """The kernelspecs' names, found off the event loop (a scan of every kernel directory)."""
    found = await service.run(serverapp.kernel_spec_manager.find_kernel_specs)
    return set(await ensure_async(found))  # an async kernelspec manager's coroutine is awaited here


def _since_start(started: float) -> float:
    """Seconds from `spotwarp start` (SPOTWARP_STARTED_AT; else from this notebook's resume) until now."""
    try:
        began = float(os.environ.get("SPOTWARP_STARTED_AT") or 0)
    except ValueError:
        began = 0.0
    return round(time.time() - began if began else time.monotonic() - started, 3)


async def _answer_kernel_info_for_tabs(client: Any, kernel: Any) -> None:
    """Ask the kernel's info now, while it is idle, and keep the answer where jupyter_server keeps the one it
    asks for the first browser tab that connects (`_kernel_info_future` on the kernel's manager, reused for every
    later tab). Without it, a tab opened while the resumed cell runs waits behind the cell for that answer
    (`kernel_info_timeout`, 60 s) before its websocket opens, its kernel shown `connecting`."""
    if hasattr(kernel, "_kernel_info_future") or not hasattr(kernel, "execution_state"):
        return  # a tab connected already, or not jupyter_server's kernel manager
    try:
        from jupyter_server.services.kernels.connection.channels import ZMQChannelsWebsocketConnection as Conn
    except ImportError:
        Conn = None
    if not hasattr(Conn, "_kernel_info_future"):  # what reads it there; another jupyter_server: nothing would
        private_missing("ZMQChannelsWebsocketConnection._kernel_info_future", "jupyter_server", "a tab opened while "
                        "the resumed cell runs may wait for the cell (kernel_info_timeout) before it connects")
        return
    reply = await _reply(client, client.kernel_info(), 30.0)
    answered: concurrent.futures.Future = concurrent.futures.Future()
    answered.set_result(reply["content"])
    kernel._kernel_info_future = answered


async def _reply(client: Any, msg_id: str, timeout: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise SpotWarpError(f"the kernel did not answer within {timeout:g} s")
        try:
            reply = await client.get_shell_msg(timeout=remaining)
        except Empty:
            continue
        if reply.get("parent_header", {}).get("msg_id") == msg_id:
            return reply


async def _until_idle(client: Any, msg_id: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            msg = await client.get_iopub_msg(timeout=max(0.1, deadline - time.monotonic()))
        except Empty:
            continue
        if msg.get("parent_header", {}).get("msg_id") == msg_id and msg["msg_type"] == "status" \
                and msg["content"].get("execution_state") == "idle":
            return
    raise SpotWarpError(f"the kernel did not go idle within {timeout:g} s")


class CellRun:
    """The interrupted cell, run again from its recorded source; its outputs go into the notebook as they come:
    into its shared document when jupyter-collaboration runs here, else into the file (server/cell_outputs.py)."""

    def __init__(self, resumer: Resumer, client: Any, kernel_id: str, plan: Plan, running: dict[str, Any]):
        self.resumer, self.client, self.kernel_id, self.plan = resumer, client, kernel_id, plan
        self.cell_id: str | None = running.get("id")
        self.source: str = running["source"]
        self.outputs = Outputs()
        earlier = running.get("outputs") if isinstance(running.get("outputs"), list) else []
        # what the cell printed up to the snapshot: the run goes on after it, as the loop does
        self.earlier = [json.loads(json.dumps(o)) for o in earlier
                        if isinstance(o, dict) and isinstance(o.get("output_type"), str)]

    async def run(self) -> str:
        """Execute the cell as JupyterLab would (its id in the request's metadata); 'ok' or why it ended."""
        target = await open_outputs(self.resumer.serverapp, self.plan.api_path, self.cell_id, self.source)
        if self.earlier:
            self.outputs.items.extend(self.earlier)
            await target.apply(self.outputs, [("add", o) for o in self.earlier])
        getattr(self.resumer.serverapp, "log", log).info(
            "SpotWarp resume: %s: outputs of cell %s go %s", self.plan.notebook, self.cell_id,
            "live into the notebook's shared document" if target.live else "into the notebook file")
        content = {"code": self.source, "silent": False, "store_history": True, "user_expressions": {},
                   "allow_stdin": False, "stop_on_error": True}
        msg = self.client.session.msg("execute_request", content,
                                      metadata={"cellId": self.cell_id} if self.cell_id else {})
        self.client.shell_channel.send(msg)
        msg_id = msg["header"]["msg_id"]
        km = self.resumer.serverapp.kernel_manager.get_kernel(self.kernel_id)
        status = "ok"
        try:
            while True:
                try:
                    reply = await self.client.get_iopub_msg(timeout=1.0)
                except Empty:
                    if not await ensure_async(km.is_alive()):
                        status = "the kernel died"
                        break
                    await target.tick(self.outputs)
                    continue
                if reply.get("parent_header", {}).get("msg_id") != msg_id:
                    continue
                kind = reply["msg_type"]
                if kind == "status" and reply["content"].get("execution_state") == "idle":
                    break
                if kind == "error":
                    status = f"{reply['content'].get('ename')}: {reply['content'].get('evalue')}"
                await target.apply(self.outputs, self.outputs.take(kind, reply))
                await target.tick(self.outputs)
        finally:
            await target.end(self.outputs)
        return status
