"""A restored notebook holds every cell that produced the restored state, as it was run.

The final snapshot takes notebooks as they are on disk, and JupyterLab saves only every 2 minutes: a cell
edited and run since the last save (or a new one) would be missing on the new host, and "re-run the same
cell" impossible. The kernel records the cells it ran (JupyterLab sends each cell's id with its code) in its
kernel record, `cells`: `[{"id", "source"}]`, in the order they were last run (docs/design.md). After the
files of a snapshot are restored, each notebook with such a record gets those cells back: a cell whose id the
file has takes the source that ran; a cell the file lacks goes after the cell run just before it (at the end
when there is none). Plain JSON (nbformat 4), no Jupyter imports; the notebook is rewritten atomically, and
never through a link or outside the workspace.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any, Mapping, Sequence

log = logging.getLogger("spotwarp")


def bring_back_run_cells(workspace: str, kernels: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """Put the cells each notebook's kernel ran into the restored notebook files; the notebooks changed."""
    changed = []
    for notebook, record in sorted(kernels.items()):
        cells = [c for c in record.get("cells") or () if isinstance(c, dict) and isinstance(c.get("id"), str)
                 and isinstance(c.get("source"), str)]
        path = _notebook_path(workspace, notebook)
        if not cells or path is None:
            continue
        try:
            with open(path, encoding="utf-8") as f:
                document = json.load(f)
        except (OSError, ValueError) as exc:
            log.warning("SpotWarp: the cells run in %s not put back: %s", notebook, exc)
            continue
        if not isinstance(document, dict) or not isinstance(document.get("cells"), list):
            continue
        if merge_run_cells(document, cells):
            _write_atomically(path, document)
            changed.append(notebook)
    return changed


def merge_run_cells(document: dict[str, Any], run: Sequence[Mapping[str, str]]) -> bool:
    """Merge the cells that ran into a notebook document (in place); True when anything changed."""
    cells: list[dict[str, Any]] = document["cells"]
    changed = False
    previous: str | None = None
    for cell in run:
        index = _index(cells, cell["id"])
        if index is None:
            at = _index(cells, previous) if previous is not None else None
            cells.insert(len(cells) if at is None else at + 1, {
                "cell_type": "code", "execution_count": None, "id": cell["id"], "metadata": {}, "outputs": [],
                "source": cell["source"]})
            changed = True
        elif _text(cells[index].get("source")) != cell["source"]:
            cells[index]["source"] = cell["source"]
            cells[index]["outputs"], cells[index]["execution_count"] = [], None  # they were another source's
            changed = True
        previous = cell["id"]
    return changed


def _index(cells: list[dict[str, Any]], cell_id: str) -> int | None:
    return next((i for i, c in enumerate(cells) if isinstance(c, dict) and c.get("id") == cell_id), None)


def _text(source: Any) -> str:
    return "".join(source) if isinstance(source, list) else str(source or "")


def _notebook_path(workspace: str, notebook: str) -> str | None:
    """The notebook's file inside the workspace; None for a link, a missing file, or a path leading outside."""
    root = os.path.realpath(workspace)
    path = os.path.join(root, *notebook.split("/"))
    if os.path.islink(path) or not os.path.isfile(path):
        return None
    real = os.path.realpath(path)
    return real if real.startswith(root + os.sep) else None


def _write_atomically(path: str, document: dict[str, Any]) -> None:
    temporary = f"{path}.spotwarp-cells"
    with open(temporary, "w", encoding="utf-8") as f:
        json.dump(document, f, indent=1, ensure_ascii=False)
        f.write("\n")
    os.replace(temporary, path)
