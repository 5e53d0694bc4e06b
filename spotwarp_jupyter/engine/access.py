"""Which variables executed code could have touched since the last committed snapshot.

Each cell's code is read before it runs (its syntax tree): every name it loads, stores or deletes is
touched, and so, at every snapshot, is every global name read or written by any function, lambda or
method the notebook has defined (they can run from anywhere: a call, a callback, a torch hook).
Code that reaches variables by other routes (`exec`, `eval`, `globals()`, `vars()`, frames, IPython's
output history, `sys.modules`, magics other than `%spotwarp`) makes the next snapshot a full one. Before
any cell is seen (no hook attached) every snapshot is full. See docs/incremental.md.
"""

from __future__ import annotations

import ast
import re
import symtable
import threading
from dataclasses import dataclass
from typing import Union

_DYNAMIC_NAMES = frozenset({
    "exec", "eval", "globals", "vars", "locals", "get_ipython", "__import__", "compile", "breakpoint",
    "__builtins__", "__main__",
})
_HISTORY_NAMES = frozenset({"Out", "In", "_oh", "_ih", "_dh", "_", "__", "___"})  # IPython's output history
_DYNAMIC_ATTRS = frozenset({"f_globals", "f_locals", "f_back", "__globals__", "modules", "user_ns",
                            "user_global_ns", "tb_frame"})
_HISTORY = re.compile(r"_i{0,3}\d+$|_i{1,3}$")
_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)


@dataclass(frozen=True)
class CellAccess:
    """What one piece of code can touch: names now, names whenever its functions run, and why not provable."""

    names: frozenset[str]
    deferred: frozenset[str]
    dynamic: str | None = None  # why the code's module-level part may reach any variable
    deferred_dynamic: str | None = None  # why its functions may, whenever they run


@dataclass(frozen=True)
class Mark:
    """Where a snapshot started in the tracker's log (see AccessTracker.begin / committed)."""

    index: int
    carry: tuple[CellAccess, ...]


def _is_spotwarp_magic(node: ast.Call) -> bool:
    """`get_ipython().run_line_magic('spotwarp', ...)`: what `%spotwarp ...` becomes (it rebinds nothing)."""
    func = node.func
    return (isinstance(func, ast.Attribute) and func.attr == "run_line_magic"
            and isinstance(func.value, ast.Call) and isinstance(func.value.func, ast.Name)
            and func.value.func.id == "get_ipython" and bool(node.args)
            and isinstance(node.args[0], ast.Constant) and node.args[0].value == "spotwarp")


class _Scanner(ast.NodeVisitor):
    def __init__(self) -> None:
        self.names: set[str] = set()
        self.inner: set[str] = set()
        self.dynamic: str | None = None
        self.deferred_dynamic: str | None = None
        self.depth = 0

    def _flag(self, why: str) -> None:
        if self.depth:
            self.deferred_dynamic = self.deferred_dynamic or why
        else:
            self.dynamic = self.dynamic or why

    def generic_visit(self, node: ast.AST) -> None:
        inner = isinstance(node, _FUNCTIONS)
        self.depth += inner
        try:
            super().generic_visit(node)
        finally:
            self.depth -= inner

    def visit_Call(self, node: ast.Call) -> None:
        if _is_spotwarp_magic(node):
            for arg in node.args:
                self.visit(arg)
            return
        self.generic_visit(node)

    def visit_Name(self, node: ast.Name) -> None:
        (self.inner if self.depth else self.names).add(node.id)
        history = node.id in _HISTORY_NAMES or _HISTORY.match(node.id)
        if node.id in _DYNAMIC_NAMES or (history and isinstance(node.ctx, ast.Load)):
            self._flag(f"code uses {node.id}")

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if node.attr in _DYNAMIC_ATTRS:
            self._flag(f"code uses .{node.attr}")
        self.generic_visit(node)

    def visit_Constant(self, node: ast.Constant) -> None:
        if node.value == "__main__":
            self._flag("code names __main__")

    def visit_Global(self, node: ast.Global) -> None:
        (self.inner if self.depth else self.names).update(node.names)

    def _imports(self, node: ast.Import | ast.ImportFrom) -> None:
        modules = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
        if any(m.split(".")[0] == "__main__" for m in modules):
            self._flag("code imports __main__")
        for alias in node.names:
            bound = alias.asname or alias.name.split(".")[0]
            if bound == "*":
                self._flag("code uses import *")
            (self.inner if self.depth else self.names).add(bound)

    visit_Import = visit_ImportFrom = _imports

    def _defines(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) -> None:
        (self.inner if self.depth else self.names).add(node.name)
        self.generic_visit(node)

    visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = _defines

    def _binds(self, node: ast.AST) -> None:
        """Names bound by a plain string, not a Name node: `except E as e`, `case [a, *rest]`, `case {**kw}`."""
        for name in (getattr(node, "name", None), getattr(node, "rest", None)):
            if isinstance(name, str):
                (self.inner if self.depth else self.names).add(name)
        self.generic_visit(node)

    visit_ExceptHandler = visit_MatchAs = visit_MatchStar = visit_MatchMapping = _binds


def _function_globals(tree: ast.Module) -> set[str] | None:
    """Global names read or written inside the code's functions (exact scopes, from the symbol table)."""
    try:
        table = symtable.symtable(ast.unparse(tree), "<cell>", "exec")
    except (SyntaxError, ValueError, RecursionError):
        return None
    found: set[str] = set()
    stack = list(table.get_children())
    while stack:
        scope = stack.pop()
        stack.extend(scope.get_children())
        if isinstance(scope, symtable.Function):
            found.update(scope.get_globals())
        else:  # a class body inside a function, or at module level: its free reads resolve to globals
            found.update(s.get_name() for s in scope.get_symbols() if s.is_global() or not s.is_local())
    return found


def scan(code: Union[str, ast.Module]) -> CellAccess:
    """What `code` (source, or the syntax tree IPython is about to run) can touch."""
    try:
        tree = ast.parse(code) if isinstance(code, str) else code
    except SyntaxError:
        return CellAccess(frozenset(), frozenset())  # it will not run
    scanner = _Scanner()
    scanner.visit(tree)
    deferred = _function_globals(tree)
    if deferred is None:  # no symbol table: every name inside a function counts
        deferred = scanner.inner
    # every name anywhere in the cell counts now: decorators and defaults run at `def` time, outside the function
    names = scanner.names | scanner.inner
    return CellAccess(frozenset(names), frozenset(deferred), scanner.dynamic, scanner.deferred_dynamic)


# what the cell that loaded SpotWarp does after a snapshot began counts at the next one: it was never seen
_UNTRACKED = CellAccess(frozenset(), frozenset(), "the cell that loaded SpotWarp ran on after the last snapshot")


class AccessTracker:
    """The names touched since the last committed snapshot, from every cell seen (thread-safe)."""

    def __init__(self) -> None:
        self.hooked = False  # a hook passes each cell's code to `note` from now on
        self.attached = False  # True once every cell's code reaches `note` (a whole cell has run since hooking)
        self.untracked_cell = False  # the cell that installed the hook runs on, unseen by it
        self._log: list[CellAccess] = []
        self._deferred: set[str] = set()
        self._deferred_dynamic: str | None = None
        self._running: list[CellAccess] = []  # the cell running now (and code it ran through IPython, %time)
        self._lock = threading.Lock()

    def note(self, code: Union[str, ast.Module]) -> CellAccess:
        """A cell (or code run like one) is about to execute."""
        try:
            access = scan(code)
        except Exception as exc:  # noqa: BLE001 - unreadable code counts as touching everything
            access = CellAccess(frozenset(), frozenset(), f"code not understood ({type(exc).__name__})")
        with self._lock:
            self._log.append(access)
            self._deferred |= access.deferred
            self._deferred_dynamic = self._deferred_dynamic or access.deferred_dynamic
            self._running.append(access)
        return access

    def finished(self) -> None:
        """The running cell has finished."""
        with self._lock:
            self._running = []
            self.untracked_cell = False

    def begin(self) -> tuple[Mark, frozenset[str], str | None]:
        """At a snapshot's start: (mark, names touched since the last commit, why every name counts, or None)."""
        with self._lock:
            touched = set(self._deferred)
            why = None if self.attached else "cell code is not tracked in this process"
            why = why or (f"a notebook function: {self._deferred_dynamic}" if self._deferred_dynamic else None)
            for access in self._log:
                touched |= access.names
                why = why or access.dynamic
            carry = tuple(self._running) + ((_UNTRACKED,) if self.untracked_cell else ())
            return Mark(len(self._log), carry), frozenset(touched), why

    def committed(self, mark: Mark) -> None:
        """The snapshot begun at `mark` is committed: forget what it covered (a cell still running stays)."""
        with self._lock:
            self._log = list(mark.carry) + self._log[mark.index:]
