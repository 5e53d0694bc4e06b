"""`%load_ext spotwarp`: register the magic and the kernel's hooks; `%unload_ext` undoes it."""

from __future__ import annotations

from .. import safepoints
from ..training import register_state_providers
from ..training.resumable import on_resume as resume_hooks
from . import access_hook, notices
from . import comm as comm_target
from . import session as session_module
from .magics import SpotWarpMagics, cell_id

_loaded: dict[int, SpotWarpMagics] = {}


def load_ipython_extension(ipython) -> None:
    """Register `%spotwarp` and start this kernel's SpotWarp session."""
    if id(ipython) in _loaded:
        return
    magics = SpotWarpMagics(shell=ipython, parent=ipython)
    ipython.register_magics(magics)
    _loaded[id(ipython)] = magics
    register_state_providers(session_module.STATE_PROVIDERS)  # RNG states and resumable positions
    safepoints.set_handler(magics.session.at_safe_point)
    access_hook.install(ipython, magics.session.access)  # which variables each cell can touch
    magics.session.arrivals.transform = ipython.transform_cell
    if _in_a_cell(ipython):  # this cell's pre_run_cell ran before the hook was there
        magics.session.arrivals.running_cell = _cell_source(ipython)
    ipython.events.register("post_run_cell", _post_run_cell)
    ipython.events.register("pre_run_cell", _pre_run_cell)
    comm_target.register()
    notices.install(ipython)  # preemption notices reach the kernel even while a cell runs
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


def _in_a_cell(ipython) -> bool:
    """True while a cell runs (a display then lands in its output); False at kernel start."""
    try:
        return bool(ipython.kernel.get_parent("shell").get("header"))
    except Exception:  # noqa: BLE001 - older ipykernel: assume a cell, as before
        return True


def _cell_source(ipython) -> str | None:
    """The source of the cell running now, from IPython's input history."""
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
    access_hook.cell_finished(session.access, lambda: safepoints.reached("cell"))


def _pre_run_cell(info) -> None:
    """A restore's large variables: bound as they arrive; a cell that may use one still loading waits for it."""
    session = session_module._current
    if session is None:
        return
    arrivals = session.arrivals
    raw = getattr(info, "raw_cell", "") or ""
    arrivals.running_cell = raw  # a restore in this cell waits for what the rest of the cell uses
    if arrivals.load is None:
        return
    try:
        code = arrivals.transform(raw)
    except Exception:  # noqa: BLE001 - not transformable: wait for everything
        code = "globals()"
    arrivals.before_cell(code, raw)


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
    safepoints.set_handler(None)
    access_hook.uninstall(ipython)
    comm_target.unregister()
    notices.uninstall(ipython)
    session_module.set_current(None)
