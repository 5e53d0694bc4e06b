"""Which variables a cell may touch: the names in its code and in the notebook code it can call.

Used while a restore still loads large variables: a cell that may touch one of them waits for it;
any other cell runs at once. When in doubt (code that does not parse, magics, `globals()`,
`eval`), the answer is "every name". The analysis of the code is engine/incremental/code_names.py's (shared with
incremental snapshots); this module knows the cell's magic lines.
"""

from __future__ import annotations

import re
from typing import Any

from ..engine.incremental import code_names

# names through which a cell may read any variable while a restore loads, besides those through which code
# may change any (code_names' `dynamic`): listing the namespace, modules that reach it, SpotWarp itself
_READS_ANY = frozenset({"dir", "sys", "pickle", "dill", "spotwarp", "spotwarp_jupyter"})
# `%spotwarp` lines that only look at the session (and the status that reports the loading)
_LOOKS_ONLY = re.compile(r"^\s*%spotwarp(\s+(status|list|on|off|widget))?\s*$")
# the line of a cell that starts a restore (the rest of the cell is what may need its variables)
_RESTORE_LINE = re.compile(r"^\s*(%spotwarp\s+restore\b|.*\bspotwarp\.restore\s*\()")


def looks_only(raw_cell: str) -> bool:
    """True for a cell of nothing but `%spotwarp status`-like lines (it never waits for a restore)."""
    lines = [ln for ln in raw_cell.splitlines() if ln.strip() and not ln.strip().startswith("#")]
    return bool(lines) and all(_LOOKS_ONLY.match(ln) for ln in lines)


def after_restore(raw_cell: str) -> str:
    """The lines of a cell after the (last) line that starts a restore: what runs once it returns."""
    lines = raw_cell.splitlines()
    starts = [i for i, ln in enumerate(lines) if _RESTORE_LINE.match(ln)]
    return "\n".join(lines[starts[-1] + 1:]) if starts else ""


def may_touch(code: str, namespace: dict[str, Any], pending: set[str]) -> bool:
    """True when running `code` (Python after IPython's transforms) may read or rebind a `pending` name, or any."""
    return code_names.may_touch(code, namespace, pending, reads_any=_READS_ANY)
