"""Which variables a cell may touch: the names in its code and in the notebook code it can call.

Used while a restore still loads large variables: a cell that may touch one of them waits for it;
any other cell runs at once. When in doubt (code that does not parse, magics, `globals()`,
`eval`), the answer is "every name".
"""

from __future__ import annotations

import io
import re
import tokenize
import types
from typing import Any, Iterable

# names through which code can reach any variable: a cell using them waits for everything
_ANY_NAME = frozenset({"globals", "vars", "locals", "dir", "eval", "exec", "get_ipython", "__import__",
                       "__main__", "sys", "pickle", "dill", "spotwarp", "spotwarp_jupyter"})
# `%spotwarp` lines that only look at the session (and the status that reports the loading)
_LOOKS_ONLY = re.compile(r"^\s*%spotwarp(\s+(status|list|on|off|widget))?\s*$")
# the line of a cell that starts a restore (the rest of the cell is what may need its variables)
_RESTORE_LINE = re.compile(r"^\s*(%spotwarp\s+restore\b|.*\bspotwarp\.restore\s*\()")
_DEPTH = 4


def looks_only(raw_cell: str) -> bool:
    """True for a cell of nothing but `%spotwarp status`-like lines (it never waits for a restore)."""
    lines = [ln for ln in raw_cell.splitlines() if ln.strip() and not ln.strip().startswith("#")]
    return bool(lines) and all(_LOOKS_ONLY.match(ln) for ln in lines)


def after_restore(raw_cell: str) -> str:
    """The lines of a cell after the (last) line that starts a restore: what runs once it returns."""
    lines = raw_cell.splitlines()
    starts = [i for i, ln in enumerate(lines) if _RESTORE_LINE.match(ln)]
    return "\n".join(lines[starts[-1] + 1:]) if starts else ""


def code_names(code: str) -> set[str] | None:
    """Every identifier in `code` (Python after IPython's transforms); None when it does not tokenize."""
    try:
        return {t.string for t in tokenize.generate_tokens(io.StringIO(code).readline) if t.type == tokenize.NAME}
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return None


def _code_objects(value: Any) -> Iterable[types.CodeType]:
    """The code a notebook-defined function, class or instance can run."""
    if isinstance(value, types.FunctionType):
        yield value.__code__
        return
    cls = value if isinstance(value, type) else type(value)
    if getattr(cls, "__module__", None) != "__main__":
        return
    for klass in cls.__mro__:
        if getattr(klass, "__module__", None) != "__main__":
            continue
        for member in vars(klass).values():
            for fn in (member, getattr(member, "__func__", None), getattr(member, "fget", None),
                       getattr(member, "fset", None)):
                if isinstance(fn, types.FunctionType):
                    yield fn.__code__


def _global_names(code: types.CodeType) -> set[str]:
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _global_names(const)
    return names


def reachable_names(names: set[str], namespace: dict[str, Any]) -> set[str]:
    """`names` plus the global names notebook code they refer to can use, a few calls deep."""
    seen = set(names)
    frontier = set(names)
    for _ in range(_DEPTH):
        found: set[str] = set()
        for name in frontier:
            value = namespace.get(name)
            if value is None:
                continue
            for code in _code_objects(value):
                found |= _global_names(code)
        frontier = found - seen
        seen |= frontier
        if not frontier:
            break
    return seen


def may_touch(code: str, namespace: dict[str, Any], pending: set[str]) -> bool:
    """True when running `code` may read or rebind one of the `pending` names (or any name at all)."""
    names = code_names(code)
    if names is None:
        return True
    names = reachable_names(names, namespace)
    return bool(names & pending) or bool(names & _ANY_NAME)
