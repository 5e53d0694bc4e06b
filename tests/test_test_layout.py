"""Test modules import no other test module: what several share lives in tests/support/, found by name."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def _imports_of_tests() -> list[str]:
    found = []
    for path in sorted(TESTS.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            for name in names:
                if name.split(".")[0] == "tests" or name.split(".")[-1].startswith("test_") or name == "conftest":
                    found.append(f"{path.relative_to(TESTS)}:{node.lineno} imports {name}")
    return found


def test_no_test_module_imports_another():
    assert _imports_of_tests() == []
