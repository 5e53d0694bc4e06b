"""Warm kernels: a standby candidate starts the kernels its promotion will resume, before it is promoted.

In standby a candidate may not write, but it may start processes. For every notebook the resume would start a
kernel for (server/resume.py's plan, from the snapshot it restored at start), it starts that kernel the way a
Jupyter session would (same kernelspec, working folder and environment), without a session, and has it import
the installed packages its variables' types come from (torch, numpy...): the seconds a fresh kernel spends
importing them are spent before the loss. Nothing is restored and nothing is bound in the kernel's namespace
(the imports run silently, outside it, without an execution count); packages found in the workspace (the user's
own modules) are not imported, since importing runs their code. The snapshots are looked at again every 5 s
in standby: a notebook opened later gets its warm kernel, and a kernel whose newer state needs more packages
imports them too. Once promoted, the resume gives each warm
kernel its notebook's session (`create_session(kernel_id=...)`) instead of starting one; a warm kernel the
resume does not use is shut down.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from dataclasses import dataclass, field
from typing import Any

from jupyter_core.utils import ensure_async

from ..engine.manifests import newest_kernel_records
from .resume import RESTORE_TIMEOUT_S, _reply, kernel_names, plan_resume

log = logging.getLogger("spotwarp")

_WARM_UP = """exec('''import importlib.util, os, sys
for name in names:
    try:
        spec = importlib.util.find_spec(name)
        origin = os.path.realpath(spec.origin or '') if spec is not None else ''
        if origin and not origin.startswith(workspace + os.sep):
            importlib.import_module(name)
    except Exception:
        pass
''', {'names': %s, 'workspace': %s})"""


@dataclass
class WarmKernel:
    kernel_id: str
    kernel_name: str
    api_path: str
    # its imports; another client of the kernel connects only after (clients of one kernel manager share a
    # session id, and with it the socket identity the kernel tells them apart by)
    imported: asyncio.Future | None = None
    names: set[str] = field(default_factory=set)  # the packages asked for so far

    async def ready(self) -> None:
        """Once its imports are done (or failed): the resume's client may connect."""
        if self.imported is not None:
            await asyncio.shield(self.imported)


def packages(record: dict[str, Any]) -> list[str]:
    """The top-level packages a kernel record's variables' types come from (never `builtins` or `__main__`)."""
    names = {str(v.get("type") or "").split(".")[0] for v in (record.get("variables") or {}).values()
             if isinstance(v, dict) and "." in str(v.get("type") or "")}
    return sorted(n for n in names if n.isidentifier() and n not in ("builtins", "__main__"))


class WarmKernels:
    """A standby's warm kernels, by notebook. The snapshots are looked at again every `every_s` while in standby
    (a notebook the holder opens later gets its warm kernel too); `started` is set after the first look."""

    def __init__(self, every_s: float = 5.0) -> None:
        self.kernels: dict[str, WarmKernel] = {}
        self.started = asyncio.Event()
        self.closed = False  # the resume took what it uses: no more warm kernels
        self.every_s = every_s
        self.say: Any = log.info

    async def warm_up(self, service: Any, serverapp: Any, snapshot_id: str, ref: str) -> None:
        """Until the resume takes them: start the kernels the resume of `snapshot_id` would start."""
        while not self.closed:
            try:
                await self._look(service, serverapp, snapshot_id, ref)
            except Exception as exc:  # noqa: BLE001 - the store unreadable: looked at again later
                log.warning("SpotWarp: warm kernels: %s", exc)
            self.started.set()
            await asyncio.sleep(self.every_s)  # the poll of the store's snapshots while in standby

    async def _look(self, service: Any, serverapp: Any, snapshot_id: str, ref: str) -> None:
        names = await kernel_names(service, serverapp)  # off the loop, as the store's listings below
        # a record no key vouches for starts no warm kernel: its imports would be a store writer's choice
        plans = await service.run(plan_resume, service.engine, service.workspace, service.root_dir, snapshot_id,
                                  ref, names, serverapp.kernel_manager.default_kernel_name,
                                  service.project.resume_unsigned)
        plans = [p for p in plans if not p.skip]
        if not plans:
            return
        records = await service.run(lambda: newest_kernel_records(service.engine.manifests()))
        workspace = os.path.realpath(service.workspace)
        for plan in plans:
            wanted = packages(records.get(plan.notebook) or {})
            kernel = self.kernels.get(plan.notebook)
            if kernel is not None:  # newer state may need more packages: imported once the last ones are
                more = [n for n in wanted if n not in kernel.names]
                if more and (kernel.imported is None or kernel.imported.done()):
                    kernel.names.update(more)
                    client, msg_id = _send(serverapp, kernel.kernel_id, more, workspace)
                    kernel.imported = asyncio.ensure_future(_imported(client, msg_id, plan.notebook, more, self.say))
                continue
            try:
                kernel, client, msg_id = await _start(serverapp, plan, wanted, workspace)
            except Exception as exc:  # noqa: BLE001 - no warm kernel: the resume starts one as without
                log.warning("SpotWarp: no warm kernel for %s: %s", plan.notebook, exc)
                continue
            if self.closed:  # the resume went ahead without it
                client.stop_channels()
                await ensure_async(serverapp.kernel_manager.shutdown_kernel(kernel.kernel_id, now=True))
                return
            self.kernels[plan.notebook] = kernel
            self.say = getattr(serverapp, "log", log).info
            self.say("SpotWarp: warm kernel started in standby for %s", plan.notebook)
            kernel.imported = asyncio.ensure_future(_imported(client, msg_id, plan.notebook, wanted, self.say))


    def take(self, plan: Any, kernel_manager: Any) -> WarmKernel | None:
        """The warm kernel for `plan`'s notebook, when it was started for the same path and kernelspec."""
        kernel = self.kernels.pop(plan.notebook, None)
        if kernel is None or (kernel.kernel_name, kernel.api_path) != (plan.kernel_name, plan.api_path) \
                or kernel.kernel_id not in kernel_manager:
            if kernel is not None:
                self.kernels[plan.notebook] = kernel  # shut down with the other unused ones
            return None
        return kernel

    async def shut_down_unused(self, serverapp: Any) -> None:
        """The warm kernels the resume did not use; no more are started."""
        self.closed = True
        for kernel in list(self.kernels.values()):
            if kernel.imported is not None:
                kernel.imported.cancel()
            try:
                await ensure_async(serverapp.kernel_manager.shutdown_kernel(kernel.kernel_id, now=True))
            except Exception as exc:  # noqa: BLE001 - gone already
                log.warning("SpotWarp: warm kernel %s not shut down: %s", kernel.kernel_id, exc)
        self.kernels.clear()


async def _imported(client: Any, msg_id: str, notebook: str, names: list[str], say: Any) -> None:
    """Wait for a warm kernel's imports, then let go of its client."""
    try:
        await _reply(client, msg_id, RESTORE_TIMEOUT_S)
        say("SpotWarp: the warm kernel for %s imported its packages (%s)", notebook, ", ".join(names) or "none")
    except Exception as exc:  # noqa: BLE001 - a warm-up that failed only costs the time it saved
        log.warning("SpotWarp: a warm kernel's imports did not finish: %s", exc)
    finally:
        client.stop_channels()


async def _start(serverapp: Any, plan: Any, names: list[str], workspace: str) -> tuple[WarmKernel, Any, str]:
    """Start the kernel as a session would (kernelspec, folder, environment); send it the imports."""
    sessions = serverapp.session_manager
    kernel_path = await ensure_async(serverapp.contents_manager.get_kernel_path(path=plan.api_path))
    kernel_id = await serverapp.kernel_manager.start_kernel(
        path=kernel_path, kernel_name=plan.kernel_name,
        env=sessions.get_kernel_env(plan.api_path, os.path.basename(plan.api_path)))
    client, msg_id = _send(serverapp, kernel_id, names, workspace)
    return WarmKernel(kernel_id, plan.kernel_name, plan.api_path, names=set(names)), client, msg_id


def _send(serverapp: Any, kernel_id: str, names: list[str], workspace: str) -> tuple[Any, str]:
    """A client of the kernel, and the imports sent through it (silently: no output, no execution count)."""
    client = serverapp.kernel_manager.get_kernel(kernel_id).client()
    client.start_channels(shell=True, iopub=False, stdin=False, hb=False, control=False)
    msg_id = client.execute(_WARM_UP % (json.dumps(names), json.dumps(workspace)), silent=True,
                            store_history=False, allow_stdin=False)
    return client, msg_id
