"""`python -m benchmarks`: a run's figures are kept whole, and RESULTS.md shows the newest run of each benchmark."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import __main__ as runner

PAGE = "# Results\n\nby hand above\n\n{begin}\nold\n{end}\n\nby hand below\n"


def _kept(folder: Path, name: str, stamp: str, command: str, figures: object) -> None:
    (folder / name).mkdir(parents=True, exist_ok=True)
    (folder / name / f"{stamp}-abc.json").write_text(json.dumps({
        "benchmark": name, "command": command, "commit": "abc", "uncommitted_changes": False,
        "date": "2026-12-07T10:00:00+00:00", "seconds": 1.0, "printed": "| a | b |\n",
        "machine": {"cpus": 2, "cpu": "x", "memory_gib": 1.0, "system": "Linux", "python": "3.11",
                    "load_at_start": [0.5]}, "figures": figures}))


def test_the_figures_are_the_last_json_printed_and_the_table_what_came_before():
    text = 'table\n| a | b |\n{"not": "last"}\nmore\n{\n  "ratio": 1.05,\n  "runs": [1, 2]\n}\n'
    assert runner.split_figures(text) == ('table\n| a | b |\n{"not": "last"}\nmore', {"ratio": 1.05, "runs": [1, 2]})
    assert runner.split_figures("only a table\n") == ("only a table\n", None)


def test_the_newest_run_of_each_benchmark_is_rendered_between_the_markers_only(tmp_path, monkeypatch):
    results, page = tmp_path / "results", tmp_path / "RESULTS.md"
    page.write_text(PAGE.format(begin=runner.BEGIN, end=runner.END))
    _kept(results, "cut", "20261201T000000Z", "python -m benchmarks cut --reps 1", {"ratio": 9.0})
    _kept(results, "cut", "20261207T000000Z", "python -m benchmarks cut --reps 9", {"ratio": 1.0512345, "n": 3})
    _kept(results, "hub", "20261203T000000Z", "python -m benchmarks hub", [{"kept": 6.5}])
    monkeypatch.setattr(runner, "RESULTS", results)
    monkeypatch.setattr(runner, "RENDERED", page)
    runner.render()
    text = page.read_text()
    assert text.startswith("# Results\n\nby hand above\n\n") and text.endswith("\n\nby hand below\n")
    assert "--reps 9" in text and "--reps 1" not in text and "old" not in text
    assert "| ratio | 1.051 |" in text and "| 0.kept | 6.5 |" in text and "| a | b |" in text


def test_a_page_without_the_markers_is_refused_in_one_line(tmp_path, monkeypatch):
    page = tmp_path / "RESULTS.md"
    page.write_text("# Results\n")
    monkeypatch.setattr(runner, "RENDERED", page)
    monkeypatch.setattr(runner, "RESULTS", tmp_path / "results")
    with pytest.raises(SystemExit, match="no <!-- runs: begin"):
        runner.render()
    assert page.read_text() == "# Results\n"
