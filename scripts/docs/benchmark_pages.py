"""The benchmarks page's body: every script in benchmarks/ with what it measures, its command, and
its results file (benchmarks/results/NAME.json, benchmarks/record.py's convention) rendered with
the machine it ran on (and, in the table's caption, the versions); a script with no results file
yet says how to produce one.

A results file belongs to ``benchmarks/bench_NAME.py`` (or ``NAME.py``), or to the script its
``"script"`` field names; a results file with no script is listed too.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path
from typing import Any

import figures
import tables

BENCH = figures.ROOT / "benchmarks"


def summary(script: Path) -> str:
    """The first paragraph of a script's docstring, read without running it."""
    doc = ast.get_docstring(ast.parse(script.read_text(encoding="utf-8"))) or ""
    return " ".join(doc.split("\n\n")[0].split())


def results_for(script: Path, files: dict[str, dict[str, Any]]) -> list[str]:
    """The results files (names) that belong to ``script``."""
    stem = script.stem.removeprefix("bench_")
    names = (stem, script.stem, script.name)
    return sorted(n for n, d in files.items() if d.get("script", n) in names)


def section(name: str, data: dict[str, Any]) -> list[str]:
    lines = [f"Machine: {tables.machine_line(data)}.", ""]
    if "table" in data:
        return [*lines, figures.render(f"bench/{name}#table"), ""]
    when = f", {data['date']}" if data.get("date") else ""
    return [
        *lines,
        f"*`benchmarks/results/{name}.json`: `{data.get('command', '?')}`{when}; "
        f"it holds no `table` to show. {figures.ran_on(data)}.*",
        "",
    ]


def not_measured(script: Path) -> str:
    """What to run for a script with no results file, true to whether it writes one."""
    run = f"`python benchmarks/{script.name}`"
    if "path_for(" in script.read_text(encoding="utf-8"):
        stem = script.stem.removeprefix("bench_")
        return f"Not measured yet: run {run} to produce `benchmarks/results/{stem}.json`."
    return f"This script prints its figures ({run}) but writes no results file yet."


def benchmarks_section() -> str:
    """Markdown: a section per benchmark script, then any results file without a script."""
    files = {
        p.stem: json.loads(p.read_text(encoding="utf-8"))
        for p in sorted((BENCH / "results").glob("*.json"))
    }
    lines: list[str] = []
    claimed: set[str] = set()
    for script in sorted(BENCH.glob("*.py")):
        if script.name == "record.py":
            continue
        lines += [f"### `{script.name}`", "", summary(script), ""]
        mine = results_for(script, files)
        claimed.update(mine)
        for name in mine:
            lines += section(name, files[name])
        if not mine:
            lines += [not_measured(script), ""]
    for name in sorted(set(files) - claimed):
        lines += [f"### `{name}.json`", "", *section(name, files[name])]
    return "\n".join(lines)
