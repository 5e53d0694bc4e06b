"""The large variables of a progressive restore, arriving in a kernel: bound between cells, waited for when used."""

from __future__ import annotations

import sys
from typing import Any, Callable

from ..engine.variables import BackgroundLoad
from .cell_names import after_restore, looks_only, may_touch


class Arrivals:
    """One kernel's restore still loading, and the cell running now (which may need what it loads)."""

    def __init__(self, namespace: dict[str, Any]):
        self.namespace = namespace
        self.load: BackgroundLoad | None = None
        self.running_cell: str | None = None  # the source of the cell running now (set by the extension)
        self.transform: Callable[[str], str] = lambda code: code  # IPython's cell transform (magics to Python)
        self.report: str | None = None  # the last failure report, once loading ended

    def started(self, load: BackgroundLoad | None) -> None:
        """A restore has bound its small variables; `load` brings the rest. Waits if its own cell needs them."""
        self.load = load
        if load is not None and self._rest_of_cell_needs(load):
            self.finish()

    def _rest_of_cell_needs(self, load: BackgroundLoad) -> bool:
        """Whether the code after the restore, in the cell that runs it, may use a variable still loading."""
        rest = after_restore(self.running_cell or "")
        if not rest.strip() or looks_only(rest):
            return False
        try:
            code = self.transform(rest)
        except Exception:  # noqa: BLE001 - not transformable: assume it does
            return True
        return may_touch(code, self.namespace, load.pending())

    def before_cell(self, code: str, raw_cell: str = "") -> None:
        """Bind what has arrived; first wait for the rest if the cell may use it."""
        load = self.load
        if load is None:
            return
        if not load.done.is_set() and not looks_only(raw_cell) and may_touch(code, self.namespace, load.pending()):
            load.wait()
        self._bind()

    def finish(self) -> None:
        """Wait for every large variable and bind it (a snapshot must never miss one)."""
        if self.load is not None:
            self.load.wait()
            self._bind()

    def _bind(self) -> None:
        load = self.load
        if load is None:
            return
        load.bind_ready(self.namespace)
        report = load.failure_report()
        if report:
            self.report = report
            print(report, file=sys.stderr)
        if load.finished():
            self.load = None
