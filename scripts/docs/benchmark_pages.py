"""The benchmarks page's body: every script in benchmarks/ with what it measures, its command, and
its results file (benchmarks/results/NAME.json, benchmarks/record.py's convention) rendered with
the machine it ran on; a script with no results file yet says how to produce one.

A results file belongs to ``benchmarks/bench_NAME.py`` (or ``NAME.py``), or to the script its
``"script"`` field names; a results file with no script is listed too.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path
from typing import Any

import figures

BENCH = figures.ROOT / "benchmarks"


def summary(script: Path) -> str:
    """The first paragraph of a script's docstring, read without running it."""
    doc = ast.get_docstring(ast.parse(script.read_text(encoding="utf-8"))) or ""
    return " ".join(doc.split("\n\n")[0].split())


def results_for(script: Path, files: dict[str, dict[str, Any]]) -> list[str]:
    """The results files (names) that belong to ``script``."""
    stem = script.stem.removeprefix("bench_")
    return sorted(n for n, d in files.items() if d.get("script", stem) in (stem, script.name) or
                  (n == stem and "script" not in d))  # fmt: skip


def section(name: str, data: dict[str, Any]) -> list[str]:
    lines = [f"**Measured** {data.get('date', '')} with `{data.get('command', '?')}` on: "
             f"{figures.machine_line(data)}.", ""]  # fmt: skip
    if "table" in data:
        lines += [figures.render(f"bench/{name}#table"), ""]
    else:
        lines += [f"`benchmarks/results/{name}.json` holds no `table` to show.", ""]
    return lines


def benchmarks_section() -> str:
    """Markdown: a section per benchmark script, then any results file without a script."""
    files = {p.stem: json.loads(p.read_text(encoding="utf-8"))
             for p in sorted((BENCH / "results").glob("*.json"))}  # fmt: skip
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
            stem = script.stem.removeprefix("bench_")
            lines += [f"Not measured yet: run `python benchmarks/{script.name}` to produce "
                      f"`benchmarks/results/{stem}.json`.", ""]  # fmt: skip
    for name in sorted(set(files) - claimed):
        lines += [f"### `{name}.json`", "", *section(name, files[name])]
    return "\n".join(lines)
