"""Storage owns the store: no module outside engine/storage reaches into a Store's retries or filesystem.

Retries, time bounds, cache bypasses and one-line errors live in `Store`'s public methods; a module that
calls `store._call(...)` or `store.fs` directly makes its own choices about all of them. The check reads
the package's source (AST): an attribute `_call`, `fs` or `_fs` of anything named `store` or `…store`
(`store`, `self.store`, `engine.store`) outside engine/storage is refused.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from spotwarp_jupyter.engine.storage import Layout

PACKAGE = Path(__file__).resolve().parent.parent / "spotwarp_jupyter"
OWNER = "engine/storage/"
PRIVATE = frozenset({"_call", "fs", "_fs"})


def _names_a_store(node: ast.expr) -> bool:
    name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""
    return name.lower().endswith("store")


def reaches_into_a_store(source: str) -> list[str]:
    """`line: expression` for each use of a store's private call or raw filesystem in `source`."""
    found = sorted((node.lineno, node.col_offset, ast.unparse(node)) for node in ast.walk(ast.parse(source))
                   if isinstance(node, ast.Attribute) and node.attr in PRIVATE and _names_a_store(node.value))
    return [f"{line}: {text}" for line, _, text in found]


def test_no_module_outside_storage_calls_the_store_privately():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if not rel.startswith(OWNER):
            found += [f"{rel}:{hit}" for hit in reaches_into_a_store(path.read_text())]
    assert found == [], "use Store's public methods (engine/storage) instead of:\n" + "\n".join(found)


def test_the_check_catches_each_way_in_and_nothing_else():
    source = (
        "store._call('listing', store.fs.ls, folder)\n"
        "self.store.fs.rm(path)\n"
        "engine.store._fs\n"
        "self.fs = Objects()\n"  # a reader's own filesystem, not a store's
        "store.read_record(path)\n"
    )
    assert reaches_into_a_store(source) == ["1: store._call", "1: store.fs", "2: self.store.fs", "3: engine.store._fs"]


def layout_rows(design: str) -> list[tuple[str, str]]:
    """(area name, Layout attribute) of each row of the layout table in docs/design.md."""
    section = design.split("\n## Layout\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^\| `([^/`<]+)[^`]*` \(`([A-Z_]+)`\) \|", section, flags=re.MULTILINE)


def test_the_design_layout_table_has_one_row_per_area_of_layout():
    rows = layout_rows((PACKAGE.parent / "docs" / "design.md").read_text())
    assert rows == [(getattr(Layout, attribute), attribute) for _, attribute in rows], rows
    assert [name for name, _ in rows] == list(Layout.ALL)
