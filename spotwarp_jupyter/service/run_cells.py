"""A restored notebook holds every cell that produced the restored state, as it was run.

The final snapshot takes notebooks as they are on disk, and JupyterLab saves only every 2 minutes: a cell
edited and run since the last save (or a new one) would be missing on the new host, and "re-run the same
cell" impossible. The kernel records the cells it ran (JupyterLab sends each cell's id with its code) in its
kernel record, `cells`: `[{"id", "source"}]`, in the order they were last run (docs/design.md). After the
files of a snapshot are restored, each notebook with such a record gets those cells back: a cell whose id the
file has takes the source that ran; a cell the file lacks goes after the cell run just before it (at the end
when there is none). A notebook the snapshot holds no file of (created after the workspace's last backup, or a
store whose kernel snapshots carry no files) is rebuilt from those cells. The cell running at the snapshot gets
the outputs it had published up to it (`running.outputs`, kernel/outputs.py). Plain JSON (nbformat 4), no Jupyter
imports; the notebook is written atomically, and never through a link or outside the workspace.
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
        if not cells:
            continue
        path = _notebook_path(workspace, notebook)
        if path is None:
            path = _new_notebook_path(workspace, notebook)
            if path is None:
                continue
            document: Any = {"cells": [], "metadata": {"language_info": {"name": "python"}}, "nbformat": 4,
                             "nbformat_minor": 5}
            log.info("SpotWarp: %s is not among the snapshot's files: rebuilt from the %d cells its kernel ran",
                     notebook, len(cells))
        else:
            try:
                with open(path, encoding="utf-8") as f:
                    document = json.load(f)
            except (OSError, ValueError) as exc:
                log.warning("SpotWarp: the cells run in %s not put back: %s", notebook, exc)
                continue
            if not isinstance(document, dict) or not isinstance(document.get("cells"), list):
                continue
        merged = merge_run_cells(document, cells)
        if put_running_outputs(document, record.get("running")) or merged or not os.path.exists(path):
            _write_atomically(path, document)
            changed.append(notebook)
    return changed


def put_running_outputs(document: dict[str, Any], running: Any) -> bool:
    """The outputs the running cell had published up to the snapshot, into that cell; True when that changed it."""
    if not isinstance(running, dict) or not isinstance(running.get("outputs"), list) or not running["outputs"]:
        return False
    index = _index(document["cells"], running.get("id")) if isinstance(running.get("id"), str) else None
    outputs = [o for o in running["outputs"] if isinstance(o, dict) and isinstance(o.get("output_type"), str)]
    if index is None or document["cells"][index].get("outputs") == outputs:
        return False
    document["cells"][index]["outputs"], document["cells"][index]["execution_count"] = outputs, None
    return True


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


def _new_notebook_path(workspace: str, notebook: str) -> str | None:
    """Where a notebook absent from the workspace is rebuilt; None for a name that is no notebook's, or a path
    that exists already or would lead outside the workspace (through a link or `..`)."""
    parts = notebook.split("/")
    if not notebook.endswith(".ipynb") or any(p in ("", ".", "..") for p in parts):
        return None
    root = os.path.realpath(workspace)
    path = os.path.join(root, *parts)
    if os.path.lexists(path):
        return None
    folder = os.path.dirname(path)
    existing = folder
    while not os.path.lexists(existing):
        existing = os.path.dirname(existing)
    real = os.path.realpath(existing)
    if real != root and not real.startswith(root + os.sep):
        return None
    os.makedirs(folder, exist_ok=True)
    real = os.path.realpath(folder)
    return path if real == root or real.startswith(root + os.sep) else None


def _write_atomically(path: str, document: dict[str, Any]) -> None:
    temporary = f"{path}.spotwarp-cells"
    with open(temporary, "w", encoding="utf-8") as f:
        json.dump(document, f, indent=1, ensure_ascii=False)
        f.write("\n")
    os.replace(temporary, path)
