"""`%load_ext spotwarp`: register the magic and the kernel's hooks; `%unload_ext` undoes it."""

from __future__ import annotations

from typing import Any

from .. import safepoints
from ..engine import SnapshotEngine
from ..training import collective, register_state_providers
from ..training.resumable import on_resume as resume_hooks
from . import access_hook, banner_tip, notices
from . import comm as comm_target
from . import outputs as cell_outputs
from . import session as session_module
from .magics import SpotWarpMagics, cell_id
from .notebooks import notebook_from_server

_loaded: dict[int, SpotWarpMagics] = {}
_idle: dict[str, Any] = {"loop": None, "timer": None}  # the kernel's main loop; the pending idle safe point


def load_ipython_extension(ipython) -> None:
    """Register `%spotwarp` and start this kernel's SpotWarp session."""
    if id(ipython) in _loaded:
        return
    magics = SpotWarpMagics(shell=ipython, parent=ipython)
    ipython.register_magics(magics)
    _loaded[id(ipython)] = magics
    register_state_providers(session_module.STATE_PROVIDERS)  # RNG states and resumable positions
    banner_tip.install()  # a kernel_info (a tab connecting) draws nothing from the notebook's `random`
    safepoints.set_handler(magics.session.automatic.at_safe_point)
    access_hook.install(ipython, magics.session.access)  # which variables each cell can touch
    magics.session.arrivals.transform = ipython.transform_cell
    if _in_a_cell(ipython):  # this cell's pre_run_cell ran before the hook was there
        magics.session.arrivals.running_cell = _cell_source(ipython)
        magics.session.cell_started(_cell_id(), magics.session.arrivals.running_cell or "", _request_id())
    cell_outputs.install(ipython, magics.session.outputs)
    ipython.events.register("post_run_cell", _post_run_cell)
    ipython.events.register("pre_run_cell", _pre_run_cell)
    comm_target.register()
    _idle["loop"] = getattr(getattr(ipython, "kernel", None), "io_loop", None)
    notices.install(ipython)  # preemption notices and renames reach the kernel even while a cell runs
    collective.engine_factory = lambda: _ranks_engine(magics.session)
    collective.after_first_commit = lambda manifest: _record_launching_cell(magics.session, manifest)
    if getattr(ipython, "kernel", None) is not None:
        named = notebook_from_server()  # read after install: a rename from now on is heard, one before is here
        if named:
            magics.session.started_as(named)
    if notices.training_resumed not in resume_hooks:
        resume_hooks.append(notices.training_resumed)
    if magics.show_widget and getattr(ipython, "kernel", None) is not None:  # a notebook, not a terminal
        if _in_a_cell(ipython):
            _show_widget(magics)
        else:  # loaded at kernel start (ipython_kernel_config.py): nothing would show it, so wait for a cell
            def first_cell(info=None) -> None:
                ipython.events.unregister("pre_run_cell", first_cell)
                _show_widget(magics)

            ipython.events.register("pre_run_cell", first_cell)


def _ranks_engine(session: Any) -> SnapshotEngine:
    """In a torch.distributed rank this kernel forked: an engine of its own on the kernel's project, storage, key
    and fence (the kernel's engine, its locks and threads, are not the rank's to use)."""
    parent = session._engine
    if parent is None:
        return SnapshotEngine(session.settings)
    return SnapshotEngine(session.settings, key=parent.key, fence=parent.fence)


def _record_launching_cell(session: Any, manifest: Any) -> None:
    """In rank 0 of ranks a cell forked, after their first collective snapshot: commit this kernel's variables as
    they were at the fork (the cell is still blocked launching) with that cell as running at a loop's step, so an
    unattended resume on a new host runs it again and the ranks continue from their snapshot (docs/distributed.md).
    Rank 0's own random states are not the kernel's: they are left out."""
    if session.running is None:
        return
    extras = {name: value for name, value in session.extras().items() if name != "rng"}
    engine = _ranks_engine(session)
    engine.snapshot_kernel(session.namespace, session.notebook, f"launching cell of {manifest.collective.get('name')!r}",
                           session.hidden, session.capture_options(), extras, annotations=session.annotations("step"))


def _in_a_cell(ipython) -> bool:
    """True while a cell runs (a display then lands in its output); False at kernel start."""
    try:
        return bool(ipython.kernel.get_parent("shell").get("header"))
    except Exception:  # noqa: BLE001 - older ipykernel: assume a cell, as before
        return True


def _cell_source(ipython) -> str | None:
    """The source of the cell running now: as its execute request sent it (the history strips its last newline,
    and a cell run again on a new host must be the cell as typed), else from IPython's input history."""
    try:
        code = ipython.kernel.get_parent("shell").get("content", {}).get("code")
        if isinstance(code, str):
            return code
    except Exception:  # noqa: BLE001 - not in a kernel: the history serves
        pass
    try:
        return ipython.history_manager.input_hist_raw[-1]
    except Exception:  # noqa: BLE001 - no history: the restore then does not look at its cell
        return None


def _show_widget(magics: SpotWarpMagics) -> None:
    try:
        from IPython.display import display

        from ..widget import StatusWidget
    except ImportError:  # anywidget missing: %spotwarp widget says how to get it
        return
    try:
        display(StatusWidget(magics.session))
        magics.widget_shown_in = cell_id(magics.shell)
    except Exception as exc:  # noqa: BLE001 - the widget is a convenience; loading must not fail for it
        print(f"SpotWarp: status widget unavailable ({type(exc).__name__}: {exc}); %spotwarp status still works")


def _post_run_cell(result) -> None:
    session = session_module._current
    if session is None:
        safepoints.reached("cell")
        return
    session.arrivals.running_cell = None
    session.cell_ended()
    access_hook.cell_finished(session.access, lambda: safepoints.reached("cell"))
    _schedule_idle_safe_point(session.automatic.idle_snapshot_in())


def _schedule_idle_safe_point(delay: float | None) -> None:
    """Run a safe point when the snapshot the cell's end did not take is due, if the kernel idles then: the
    kernel's main loop runs it only between cells (a cell running then reaches its own safe points)."""
    loop = _idle["loop"]
    if loop is None:
        return
    if _idle["timer"] is not None:
        loop.remove_timeout(_idle["timer"])
        _idle["timer"] = None
    if delay is not None:
        def fire() -> None:
            _idle["timer"] = None
            safepoints.reached("idle")

        _idle["timer"] = loop.call_later(delay, fire)


def _pre_run_cell(info) -> None:
    """A restore's large variables: bound as they arrive; a cell that may use one still loading waits for it."""
    session = session_module._current
    if session is None:
        return
    arrivals = session.arrivals
    raw = getattr(info, "raw_cell", "") or ""
    session.cell_started(_cell_id(), raw, _request_id())
    arrivals.running_cell = raw  # a restore in this cell waits for what the rest of the cell uses
    if arrivals.load is None:
        return
    try:
        code = arrivals.transform(raw)
    except Exception:  # noqa: BLE001 - not transformable: wait for everything
        code = "globals()"
    arrivals.before_cell(code, raw)


def _cell_id() -> str | None:
    """The id of the notebook cell running now, as JupyterLab sends it (`cellId` in the request's metadata)."""
    try:
        from IPython import get_ipython

        cell = get_ipython().kernel.get_parent("shell").get("metadata", {}).get("cellId")
    except Exception:  # noqa: BLE001 - a terminal IPython, an older ipykernel: no cell ids
        return None
    return cell if isinstance(cell, str) and cell else None


def _request_id() -> str | None:
    """The msg_id of the execute request running now: the parent of the outputs the cell publishes."""
    try:
        from IPython import get_ipython

        request = get_ipython().kernel.get_parent("shell").get("header", {}).get("msg_id")
    except Exception:  # noqa: BLE001 - a terminal IPython: no outputs to keep
        return None
    return request if isinstance(request, str) and request else None


def unload_ipython_extension(ipython) -> None:
    """Remove the magic and hooks; snapshots already committed stay in storage."""
    magics = _loaded.pop(id(ipython), None)
    if magics is None:
        return
    ipython.magics_manager.magics["line"].pop("spotwarp", None)
    ipython.magics_manager.registry.pop(type(magics).__name__, None)
    for event, hook in (("post_run_cell", _post_run_cell), ("pre_run_cell", _pre_run_cell)):
        try:
            ipython.events.unregister(event, hook)
        except ValueError:
            pass
    _schedule_idle_safe_point(None)
    _idle["loop"] = None
    safepoints.set_handler(None)
    access_hook.uninstall(ipython)
    cell_outputs.uninstall(ipython, magics.session.outputs)
    comm_target.unregister()
    notices.uninstall(ipython)
    collective.engine_factory = collective.after_first_commit = None
    banner_tip.uninstall()
    session_module.set_current(None)
