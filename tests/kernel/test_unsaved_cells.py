"""Edits not saved are not lost: the snapshot holds the cells the kernel ran (JupyterLab's cell ids), and the
notebook restored on a new host holds every cell that produced the restored state, as it ran."""

from __future__ import annotations

import json
from pathlib import Path

from spotwarp_jupyter.engine.manifests import newest_kernel_records
from spotwarp_jupyter.service import VIA_CLI, Project

from engines import make_engine

ON_DISK = {"cells": [
    {"cell_type": "code", "execution_count": None, "id": "setup", "metadata": {}, "outputs": [],
     "source": "%load_ext spotwarp\nlr = 0.1"},
    {"cell_type": "markdown", "id": "note", "metadata": {}, "source": "Training"},
    {"cell_type": "code", "execution_count": 1, "id": "train", "metadata": {}, "outputs": [
        {"output_type": "stream", "name": "stdout", "text": "old\n"}], "source": "steps = 10"},
], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}



def test_a_new_host_gets_the_cells_that_ran_not_only_the_saved_ones(start_kernel, store_url, tmp_path):
    ws_a = tmp_path / "ws-a"
    ws_a.mkdir()
    (ws_a / "train.ipynb").write_text(json.dumps(ON_DISK))  # saved before the edits below
    k = start_kernel("host-a", JPY_SESSION_NAME="train.ipynb")
    k.run_cell("setup", "%load_ext spotwarp\nlr = 0.1")
    k.run_cell("train", "steps = 20  # edited, run, not saved")
    k.run_cell("eval", "score = steps * lr  # a new cell, never saved")
    k.run("%spotwarp snapshot")
    engine = make_engine(store_url)
    # the server's final snapshot: the notebook file as it is on disk, and the kernel's newest record
    engine.snapshot_project(str(ws_a), newest_kernel_records(engine.manifests()), "final")

    ws_b = tmp_path / "ws-b"
    Project(engine, str(ws_b)).restore("latest", via=VIA_CLI, files_only=True)
    cells = json.loads((ws_b / "train.ipynb").read_text())["cells"]
    assert [c["id"] for c in cells] == ["setup", "note", "train", "eval"]
    assert cells[2]["source"] == "steps = 20  # edited, run, not saved" and cells[2]["outputs"] == []
    assert cells[3]["source"] == "score = steps * lr  # a new cell, never saved" and cells[3]["cell_type"] == "code"
    assert cells[0]["source"] == "%load_ext spotwarp\nlr = 0.1" and cells[1]["source"] == "Training"
    assert not list(Path(ws_b).glob("*.spotwarp-cells"))


def test_a_damaged_or_linked_notebook_is_left_as_it_is(tmp_path):
    from spotwarp_jupyter.service.run_cells import bring_back_run_cells

    ws, outside = tmp_path / "ws", tmp_path / "outside.ipynb"
    ws.mkdir()
    (ws / "broken.ipynb").write_text("{not json")
    outside.write_text(json.dumps(ON_DISK))
    (ws / "linked.ipynb").symlink_to(outside)
    record = {"cells": [{"id": "new", "source": "x = 1"}]}
    # a notebook with no file is rebuilt from its cells; never one outside the workspace
    assert bring_back_run_cells(str(ws), {"broken.ipynb": record, "linked.ipynb": record, "gone.ipynb": record,
                                          "../outside.ipynb": record}) == ["gone.ipynb"]
    assert [c["source"] for c in json.loads((ws / "gone.ipynb").read_text())["cells"]] == ["x = 1"]
    assert (ws / "broken.ipynb").read_text() == "{not json"
    assert json.loads(outside.read_text()) == ON_DISK
