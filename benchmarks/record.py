"""Where a benchmark's results go: ``benchmarks/results/<name>.json``, the file the documentation
renders (scripts/docs/figures.py, ``<!-- figure: bench/<name>#table -->``; the benchmarks page lists
every file there).

The convention, for any benchmark (this module is a convenience, not a requirement):

    {
      "command": "python benchmarks/bench_attention.py --rounds 15",   # what was run, exactly
      "date": "2026-12-02",
      "machine": {...} or "a sentence",       # where: CPU, cores, OS, load average
      "versions": {...},                      # on what: Python, torch, numba, ..., the lock
      "table": {"columns": [...], "rows": [[...], ...]},   # what the docs show, formatted
      ...                                     # anything else: the raw measurements
    }

``save(path_for(name), columns, rows, results)`` writes it atomically (headlab.files.write_json);
``versions`` is :func:`headlab.provenance.versions`, the one record of what a run ran on, which
the docs' captions quote. It imports neither torch nor headlab's models, so a cold-start
benchmark can use it too. A benchmark's ``--json PATH`` option defaults to ``path_for(name)``.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import shlex
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"


def _cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine(**extra: Any) -> dict[str, Any]:
    """The machine in a few fields: CPU, cores, OS, the 1-minute load average (the software's
    versions are :func:`headlab.provenance.versions`, saved beside it)."""
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    return {
        "cpu": _cpu(),
        "cores": os.cpu_count(),
        "os": f"{platform.system()} {platform.release()}",
        "load_average": None if load is None else round(load, 2),
        **extra,
    }


def command(argv: list[str] | None = None) -> str:
    """The command line that ran, as a user would type it: ``python benchmarks/x.py --a 1``."""
    argv = sys.argv if argv is None else argv
    script = Path(argv[0]).resolve()
    try:
        shown = script.relative_to(RESULTS.parent.parent)
    except ValueError:
        shown = script
    return shlex.join(["python", str(shown), *argv[1:]])


def path_for(name: str) -> Path:
    """The results file of benchmark ``name``: ``benchmarks/results/<name>.json``."""
    return RESULTS / f"{name}.json"


def save(
    path: str | Path,
    columns: list[str],
    rows: list[list[Any]],
    results: Any = None,
    **machine_extra: Any,
) -> Path:
    """Write the results file ``path`` (command, date, machine, versions, table, results),
    atomically."""
    from headlab.files import write_json
    from headlab.provenance import versions

    record = {
        "command": command(),
        "date": datetime.date.today().isoformat(),
        "machine": machine(**machine_extra),
        "versions": versions(),
        "table": {"columns": columns, "rows": rows},
        "results": results,
    }
    return write_json(path, record)


def count(least: int = 1) -> Callable[[str], int]:
    """An argparse ``type`` for a number of rounds, loads or repeats: a whole number of at
    least ``least``, else argparse's one-line error (exit 2). A median needs one value at
    least; ``--rounds 0`` would otherwise run every contender and fail on the empty median."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < least:
            raise argparse.ArgumentTypeError(f"{value}: give at least {least}")
        return value

    return parse
