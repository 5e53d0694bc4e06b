"""No function of the package over ~60 lines: each readable whole.

Modules have no size cap: a module is as long as its concept needs, and one concept is never
cut into fragments to meet a number. A function kept larger goes in KEPT with a one-line reason.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "spotwarp_jupyter"
MAX_FUNCTION_LINES = 60
KEPT: dict[str, str] = {}  # "path/in/package.py:function" -> why it stays larger


def _oversized() -> list[str]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > MAX_FUNCTION_LINES and f"{rel}:{node.name}" not in KEPT:
                    found.append(f"{rel}:{node.lineno} {node.name}: {length} lines")
    return found


def test_no_function_is_oversized():
    assert _oversized() == []
