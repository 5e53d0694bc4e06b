"""No module of the package over ~300 lines and no function over ~60 (issue 15): one job each, readable whole.

A module or function kept larger goes in KEPT with a one-line reason.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "spotwarp_jupyter"
MAX_MODULE_LINES = 300
MAX_FUNCTION_LINES = 60
KEPT: dict[str, str] = {}  # "path/in/package.py" or "path.py:function" -> why it stays larger


def _oversized() -> list[str]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        source = path.read_text()
        if len(source.splitlines()) > MAX_MODULE_LINES and rel not in KEPT:
            found.append(f"{rel}: {len(source.splitlines())} lines")
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > MAX_FUNCTION_LINES and f"{rel}:{node.name}" not in KEPT:
                    found.append(f"{rel}:{node.lineno} {node.name}: {length} lines")
    return found


def test_no_module_or_function_is_oversized():
    assert _oversized() == []
