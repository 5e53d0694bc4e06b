"""One way to run a benchmark, and one place its figures go.

    python -m benchmarks                       # the benchmarks, a line each
    python -m benchmarks NAME [ARGS...]        # run bench_NAME.py with ARGS; keep its figures; render RESULTS.md
    python -m benchmarks render                # rewrite RESULTS.md's table of runs from benchmarks/results/

A run prints what the benchmark prints, as it comes. Its figures (the JSON the benchmark prints with --json,
where it has that flag), its printed table, the command, the commit, the date and the machine are kept as
benchmarks/results/NAME/<date>-<commit>.json, and the newest run of each benchmark is rendered into the
section of RESULTS.md between its markers. A run that fails keeps nothing.
"""

from __future__ import annotations

import ast
import datetime as dt
import json
import os
import platform
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = HERE / "results"
RENDERED = HERE / "RESULTS.md"
BEGIN, END = "<!-- runs: begin (python -m benchmarks render) -->", "<!-- runs: end -->"


def benchmarks() -> dict[str, Path]:
    """NAME -> script: every bench_NAME.py beside this file."""
    return {p.stem.removeprefix("bench_"): p for p in sorted(HERE.glob("bench_*.py"))}


def summary(script: Path) -> str:
    doc = ast.get_docstring(ast.parse(script.read_text())) or ""
    return doc.strip().splitlines()[0] if doc.strip() else ""


def _git(*args: str) -> str:
    out = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=False)
    return out.stdout.strip() if out.returncode == 0 else ""


def machine() -> dict[str, Any]:
    """What the figures were taken on: they are ratios, but a reader still needs to know the machine."""
    model = ""
    try:
        model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                      if line.startswith("model name")), "")
    except OSError:
        pass
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return {"cpus": os.cpu_count(), "cpu": model, "memory_gib": round(memory / 2**30, 1),
            "system": f"{platform.system()} {platform.release()}", "python": platform.python_version(),
            "load_at_start": [round(x, 2) for x in os.getloadavg()]}


def split_figures(text: str) -> tuple[str, Any]:
    """What the benchmark printed before its figures, and the figures: the last JSON value it printed on lines
    of its own (indented or on one line); (text, None) when it printed none."""
    lines = text.splitlines()
    for i in range(len(lines) - 1, -1, -1):
        if lines[i][:1] in "{[":
            try:
                return "\n".join(lines[:i]), json.loads("\n".join(lines[i:]))
            except ValueError:
                continue
    return text, None


def run(name: str, args: list[str]) -> int:
    scripts = benchmarks()
    if name not in scripts:
        print(f"no benchmark {name!r}: one of {', '.join(scripts)}", file=sys.stderr)
        return 2
    script = scripts[name]
    with_json = '"--json"' in script.read_text() and "--json" not in args
    argv = [sys.executable, str(script), *args, *(["--json"] if with_json else [])]
    started = dt.datetime.now(dt.timezone.utc)
    facts = machine()
    printed = []
    with subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, text=True) as proc:
        for line in proc.stdout:
            sys.stdout.write(line)
            printed.append(line)
    if proc.returncode != 0:
        print(f"benchmark {name} failed (exit {proc.returncode}): nothing kept", file=sys.stderr)
        return proc.returncode
    table, figures = split_figures("".join(printed)) if with_json else ("".join(printed), None)
    commit = _git("rev-parse", "--short=12", "HEAD") or "unknown"
    record = {"benchmark": name, "command": shlex.join(["python", "-m", "benchmarks", name, *args]),
              "commit": commit, "uncommitted_changes": bool(_git("status", "--porcelain", "--", "spotwarp_jupyter", "benchmarks",
                                                                  ":!benchmarks/results", ":!benchmarks/RESULTS.md")),
              "date": started.isoformat(timespec="seconds"),
              "seconds": round((dt.datetime.now(dt.timezone.utc) - started).total_seconds(), 1),
              "machine": facts, "figures": figures, "printed": table}
    path = RESULTS / name / f"{started:%Y%m%dT%H%M%SZ}-{commit}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=2) + "\n")
    print(f"kept {path.relative_to(ROOT)}", file=sys.stderr)
    render()
    return 0


def _newest_runs() -> list[dict[str, Any]]:
    runs = []
    for folder in sorted(p for p in RESULTS.glob("*") if p.is_dir()):
        files = sorted(folder.glob("*.json"))
        if files:
            runs.append(json.loads(files[-1].read_text()))
    return runs


def _flat(value: Any, prefix: str = "") -> list[tuple[str, str]]:
    """Figures as (name, value) rows: nested names joined with dots, numbers to four significant digits."""
    if isinstance(value, dict):
        return [row for k, v in value.items() for row in _flat(v, f"{prefix}.{k}" if prefix else str(k))]
    if isinstance(value, float):
        return [(prefix, f"{value:.4g}")]
    text = json.dumps(value)
    return [(prefix, text if len(text) <= 100 else f"{len(value)} items" if isinstance(value, list) else text[:100])]


def _figures(figures: Any) -> list[str]:
    if figures is None:
        return []
    return _table(_flat(figures if isinstance(figures, dict) else {str(i): f for i, f in enumerate(figures)}))


def _table(rows: list[tuple[str, str]]) -> list[str]:
    return ["| figure | value |", "| --- | --- |", *(f"| {name} | {value} |" for name, value in rows), ""]


def _section(record: dict[str, Any]) -> str:
    m = record["machine"]
    dirty = " with uncommitted changes" if record.get("uncommitted_changes") else ""
    return "\n".join([
        f"### {record['benchmark']}: {record['date'][:10]}",
        "",
        f"`{record['command']}` at commit `{record['commit']}`{dirty}, {record['seconds']} s; {m['cpus']} CPUs "
        f"({m['cpu'] or 'unknown model'}), {m['memory_gib']} GiB, {m['system']}, Python {m['python']}, "
        f"load average {m['load_at_start'][0]} at its start.",
        "",
        *(["```text", record["printed"].rstrip(), "```", ""] if record["printed"].strip() else []),
        *_figures(record.get("figures")),
    ])


def render() -> None:
    """Rewrite RESULTS.md's runs section from the newest kept run of each benchmark (the rest is left as is)."""
    text = RENDERED.read_text()
    if BEGIN not in text or END not in text:
        raise SystemExit(f"{RENDERED.name} has no {BEGIN} ... {END} section to render into")
    runs = _newest_runs()
    body = "\n".join(_section(r) for r in runs) if runs else "No run kept yet.\n"
    head, rest = text.split(BEGIN, 1)
    RENDERED.write_text(head + BEGIN + "\n\n" + body + "\n" + END + rest.split(END, 1)[1])


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        for name, script in benchmarks().items():
            print(f"  {name:<12} {summary(script)}")
        return 0
    if argv[0] == "render":
        render()
        return 0
    return run(argv[0], argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
