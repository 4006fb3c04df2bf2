"""The documentation's figures: every table of measured numbers, rendered from its results file.

    python scripts/docs/figures.py --write README.md      # refresh the figures written in a file
    python scripts/docs/figures.py --check README.md docs  # exit 1 when one disagrees

A results file is JSON, named by a source:

    experiments/NAME   src/headlab/experiments/results/NAME.json  (headlab experiment NAME --ship)
    bench/NAME         benchmarks/results/NAME.json                (``python benchmarks/....py``)
    data/NAME          docs/data/NAME.json                         (``python scripts/docs/data.py``)
    model/card         src/headlab/weights/card.json               (``headlab train default``)

A page asks for a table or one number with a marker, ``SOURCE#NAME`` naming the results file and
what to take from it:

    <!-- figure: experiments/induction#seeds -->       a table (scripts/docs/tables.py, or
                                                      a benchmark's ``#table``), expanded when
                                                      the site builds
    <!-- value: experiments/induction#final.repeated_loss:.2f -->   one number: a dotted path
                                                      into the JSON and a format (or ``len``)

Pages under docs/ carry the bare markers; the mkdocs hook expands them, so the site always shows
what the results files hold. A file that is read outside the site (README.md) carries the
rendered figure between the marker and ``<!-- /figure -->`` (or ``<!-- /value -->``): ``--write``
refreshes it and ``--check`` (run by tests/unit/test_docs.py) fails when it is stale.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from functools import cache
from pathlib import Path
from typing import Any

from tables import BENCH_TABLES, DATA_TABLES, EXPERIMENT_TABLES, Table, verdicts

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = {
    "experiments": ROOT / "src/headlab/experiments/results",
    "bench": ROOT / "benchmarks/results",
    "data": ROOT / "docs/data",
    "model": ROOT / "src/headlab/weights",
}
FIGURE = re.compile(
    r"<!-- figure: (?P<ref>[\w./-]+#[\w.-]+) -->"
    r"(?:\n(?P<body>(?:(?!<!-- figure:).)*?)<!-- /figure -->)?",
    re.S,
)
VALUE = re.compile(
    r"<!-- value: (?P<ref>[\w./-]+#[\w.%-]+)(?::(?P<fmt>[^ ]+))? -->"
    r"(?:(?P<body>[^<\n]*)<!-- /value -->)?"
)


# code blocks and inline code: a marker shown as code is not expanded
FENCE = re.compile(r"(^```.*?^```[^\n]*$|`[^`\n]+`)", re.S | re.M)


class FigureError(ValueError):
    """A marker names a results file, a table or a path that does not exist."""


def source_path(source: str) -> Path:
    """The results file a source names: ``experiments/induction`` → .../results/induction.json."""
    kind, _, name = source.partition("/")
    if kind not in FOLDERS or not re.fullmatch(r"[\w.-]+", name):
        raise FigureError(
            f"unknown source {source!r}: use {', '.join(FOLDERS)} and a name, e.g. bench/shapes"
        )
    return FOLDERS[kind] / f"{name}.json"


@cache
def load(source: str) -> dict[str, Any]:
    """The results file's JSON (read once per build)."""
    path = source_path(source)
    if not path.is_file():
        raise FigureError(f"{source}: no results file {path.relative_to(ROOT)}")
    return json.loads(path.read_text(encoding="utf-8"))


def lookup(data: Any, path: str) -> Any:
    """``a.b.0.c`` into nested dicts and lists; a key with dots in it (``"0.2"``, a head) is
    found too. ``FigureError`` names the missing step."""
    steps = path.split(".")
    while steps:
        step = steps.pop(0)
        if isinstance(data, dict):
            while step not in data and steps:  # a dotted key: take the next part along
                step = f"{step}.{steps.pop(0)}"
        try:
            data = data[int(step)] if isinstance(data, list) else data[step]
        except (KeyError, IndexError, ValueError, TypeError):
            raise FigureError(f"no {step!r} in {path!r}") from None
    return data


def caption(source: str, command: str) -> str:
    """The line under a table: its file, command and date, and what it ran on."""
    data, path = load(source), source_path(source).relative_to(ROOT)
    when = f", {data['date']}" if data.get("date") else ""
    return f"*From `{path}`: `{command}`{when}. {ran_on(data)}.*"


# what a caption names of a file's "versions" (headlab.provenance), where it was installed
CAPTION_VERSIONS = {
    "python": "Python",
    "torch": "torch",
    "numba": "numba",
    "transformers": "transformers",
}


def ran_on(data: dict[str, Any]) -> str:
    """``Ran on Python 3.11.7, torch 2.13.0+cpu, …, lock dev 3bffd5ddebd7`` from a results file's
    ``versions``; a file written before they were recorded says so, with the few its machine or
    its own fields named (Python, torch)."""
    found = data.get("versions")
    if isinstance(found, dict):
        installed = {k: v for k, v in found.items() if v != "not installed"}
        named = [
            f"{label} {installed[k]}" for k, label in CAPTION_VERSIONS.items() if k in installed
        ]
        lock = str(found.get("lock", "none: not recorded"))
        lock = f"no lock: {lock[6:]}" if lock.startswith("none: ") else f"lock {lock}"
        return f"Ran on {', '.join([*named, lock])}"
    machine = data.get("machine") if isinstance(data.get("machine"), dict) else {}
    python, torch = machine.get("python"), machine.get("torch", data.get("torch"))
    known = [f"{label} {v}" for label, v in (("Python", python), ("torch", torch)) if v]
    return "Versions not recorded" + (f" beyond {' and '.join(known)}" if known else "")


def experiment_command(source: str) -> str:
    data, name = load(source), source.partition("/")[2]
    if data.get("experiment", name) != name and "command" in data:  # another model's run
        return str(data["command"])  # (results/retrieval-gemma3.json: its own --model)
    seeds = len(data.get("seeds", [])) or 1
    return f"headlab experiment {name} --seeds {seeds} --ship"


# --- rendering -----------------------------------------------------------------------------------


def render(ref: str) -> str:
    """The Markdown of ``SOURCE#NAME``: the table and a line naming its file and command."""
    source, _, name = ref.partition("#")
    data, kind = load(source), source.partition("/")[0]
    if kind == "experiments":
        fn = EXPERIMENT_TABLES.get(f"{source.partition('/')[2]}#{name}", verdicts_or_none(name))
        body, command = fn(data) if fn else None, experiment_command(source)
    elif kind == "data":
        fn = DATA_TABLES.get(name)
        body, command = fn(data["output"]) if fn else None, data["command"]
    else:
        fn = BENCH_TABLES.get(name)
        body, command = fn(data) if fn else None, data.get("command", "")
    if body is None:
        raise FigureError(f"{ref}: no table {name!r} for {source}")
    return f"{body}\n\n{caption(source, command)}"


def verdicts_or_none(name: str) -> Table | None:
    return verdicts if name == "verdict" else None


def value(ref: str, fmt: str | None) -> str:
    """One number (or word) from a results file, formatted: ``,`` thousands, ``%`` a share."""
    source, _, path = ref.partition("#")
    data = load(source)
    x = lookup(
        data["output"] if source.startswith("data/") and path[:7] != "output." else data, path
    )
    if fmt == "len":  # how many: seeds, heads
        return str(len(x))
    try:
        return format(x, fmt) if fmt else str(x)
    except (TypeError, ValueError):
        raise FigureError(f"{ref}: cannot format {x!r} as {fmt!r}") from None


def expand(text: str, *, written: bool = False) -> str:
    """Every marker in ``text`` replaced by its figure (the site). With ``written``, only the
    markers that carry a written figure are refreshed, markers kept (README.md); the bare ones are
    still rendered, so a wrong reference fails either way."""

    def figure(m: re.Match[str]) -> str:
        body = render(m["ref"])
        if not written:
            return body
        return (
            m[0] if m["body"] is None else f"<!-- figure: {m['ref']} -->\n{body}\n<!-- /figure -->"
        )

    def number(m: re.Match[str]) -> str:
        body = value(m["ref"], m["fmt"])
        if not written:
            return body
        fmt = f":{m['fmt']}" if m["fmt"] else ""
        return (
            m[0] if m["body"] is None else f"<!-- value: {m['ref']}{fmt} -->{body}<!-- /value -->"
        )

    parts = FENCE.split(text)  # the odd parts are code
    return "".join(
        p if i % 2 else VALUE.sub(number, FIGURE.sub(figure, p)) for i, p in enumerate(parts)
    )


def stale(text: str) -> list[str]:
    """The references whose written figure in ``text`` differs from its results file."""
    out = []
    text = "".join(p for i, p in enumerate(FENCE.split(text)) if i % 2 == 0)
    for m in FIGURE.finditer(text):
        if m["body"] is not None and m["body"] != render(m["ref"]) + "\n":
            out.append(m["ref"])
    for m in VALUE.finditer(text):
        if m["body"] is not None and m["body"] != value(m["ref"], m["fmt"]):
            out.append(m["ref"])
    return out


def markdown_files(paths: list[str]) -> list[Path]:
    out: list[Path] = []
    for p in map(Path, paths):
        out += sorted(p.rglob("*.md")) if p.is_dir() else [p]
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", action="store_true", help="refresh the written figures")
    mode.add_argument("--check", action="store_true", help="exit 1 when a figure is stale")
    parser.add_argument("paths", nargs="+", help="Markdown files or folders")
    args = parser.parse_args(argv)
    bad = 0
    for path in markdown_files(args.paths):
        text = path.read_text(encoding="utf-8")
        try:
            fresh, old = expand(text, written=True), stale(text)
        except FigureError as e:
            print(f"{path}: {e}", file=sys.stderr)
            bad += 1
            continue
        if args.write and fresh != text:
            path.write_text(fresh, encoding="utf-8")
            print(f"refreshed {path}: {', '.join(old)}")
        elif args.check and old:
            print(
                f"{path}: stale figures {', '.join(old)}: run {__file__} --write", file=sys.stderr
            )
            bad += 1
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
