"""Which names a piece of code can touch: read, bind, delete or mutate, now or when its functions run.

One analysis for two questions: which variables a cell may have changed since the last snapshot
(access.py, for incremental snapshots) and which variables a cell may use while a restore still loads
them (kernel/arrivals.py). A cell's syntax tree gives the names it uses at module level and, through
the symbol table, the globals of the functions it defines; notebook functions and classes already in
the namespace add the globals their code uses (`reachable_names`). Code that can reach variables by
other routes (`exec`, `globals()`, frames, IPython's output history...) is reported as `dynamic`.
"""

from __future__ import annotations

import ast
import dis
import functools
import io
import re
import symtable
import tokenize
import types
from dataclasses import dataclass
from typing import Any, Iterable, Union

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



_DEPTH = 4  # calls deep through notebook functions and methods


def token_names(code: str) -> set[str] | None:
    """Every identifier in `code`, read token by token; None when it does not even tokenize."""
    try:
        return {t.string for t in tokenize.generate_tokens(io.StringIO(code).readline) if t.type == tokenize.NAME}
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return None


def _code_objects(value: Any) -> Iterable[types.CodeType]:
    """The code a notebook-defined function, class or instance can run (read from its type: an instance's own
    `__class__` may be a property that raises)."""
    if issubclass(type(value), types.FunctionType):
        yield value.__code__
        return
    cls = value if issubclass(type(value), type) else type(value)
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


def notebook_code_names(namespace: dict[str, Any]) -> tuple[set[str], str | None]:
    """Global names any function or class bound in `namespace` can use when it runs, wherever it was defined
    (a cell no hook saw, such as the one that loaded SpotWarp), and why one of them may reach every variable."""
    names: set[str] = set()
    why = None
    for value in list(namespace.values()):
        if issubclass(type(value), types.FunctionType) and value.__globals__ is not namespace:
            continue  # a library's function: its globals are its module's
        try:
            for code in _code_objects(value):
                names |= _global_names(code)
                why = why or _dynamic_code(code)
        except Exception:  # noqa: BLE001 - code that cannot be read may use any name
            why = why or "a notebook object's code could not be read"
    return names, why


_NAME_OPS = frozenset({"LOAD_GLOBAL", "STORE_GLOBAL", "DELETE_GLOBAL", "LOAD_NAME", "STORE_NAME", "DELETE_NAME"})
_ATTR_OPS = frozenset({"LOAD_ATTR", "LOAD_METHOD", "STORE_ATTR", "DELETE_ATTR"})


@functools.lru_cache(maxsize=4096)
def _dynamic_code(code: types.CodeType) -> str | None:
    """Why compiled code may reach any variable (as the cell scanner judges source), or None: `eval` read as
    a global counts, `model.eval()` does not."""
    for instruction in dis.get_instructions(code):
        if instruction.opname in _NAME_OPS and instruction.argval in _DYNAMIC_NAMES:
            return f"a notebook function uses {instruction.argval}"
        if instruction.opname in _ATTR_OPS and instruction.argval in _DYNAMIC_ATTRS:
            return f"a notebook function uses .{instruction.argval}"
    if "__main__" in code.co_consts:
        return "a notebook function names __main__"
    return next((why for const in code.co_consts if isinstance(const, types.CodeType)
                 for why in [_dynamic_code(const)] if why), None)


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


def may_touch(code: str, namespace: dict[str, Any], pending: set[str], reads_any: frozenset[str] = frozenset()) -> bool:
    """True when running `code` may read or rebind one of the `pending` names, or reach any variable.

    `reads_any`: names through which the caller counts code as reaching every variable, besides `dynamic` ones.
    Code that does not parse (the tail of a cell) is judged by its tokens; code that does not tokenize may touch anything.
    """
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError, RecursionError):
        tokens = token_names(code)
        if tokens is None:
            return True
        names = tokens
    else:
        access = scan(tree)
        if access.dynamic or access.deferred_dynamic:
            return True
        names = set(access.names | access.deferred)
    names = reachable_names(names, namespace)
    return bool(names & pending) or bool(names & reads_any)
