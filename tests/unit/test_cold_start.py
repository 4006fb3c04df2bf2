"""The command line starts at once: help, `models`, `shapes --help` and argument errors import
neither torch nor transformers, and `shapes` imports torch alone of the heavy libraries.

The oracle is Python's own import log (``python -X importtime``), read from a fresh process:
which modules a command imported, not how long it took, so a loaded machine cannot fool it.
(benchmarks/bench_cold_start.py measures the times.)
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

SRC = str(Path(__file__).resolve().parents[2] / "src")
HEAVY = ("torch", "transformers", "fastapi", "matplotlib")


def imported(*args: str) -> tuple[set[str], subprocess.CompletedProcess[str]]:
    """The modules ``headlab ARGS`` imports in a fresh interpreter, and the finished process."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([SRC, os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, "-X", "importtime", "-m", "headlab.cli", *args]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, check=False)
    # each line: "import time: <self us> | <cumulative us> | <indent><dotted name>"
    names = {
        line.rsplit("|", 1)[1].strip()
        for line in proc.stderr.splitlines()
        if line.startswith("import time:") and line.count("|") == 2
    }
    return names, proc


def heavy(names: set[str], which: tuple[str, ...] = HEAVY) -> list[str]:
    """The heavy top-level packages among ``names``."""
    return sorted({n.split(".")[0] for n in names} & set(which))


@pytest.mark.parametrize(
    ("args", "code"),
    [
        (["--help"], 0),
        (["models"], 0),
        (["shapes", "--help"], 0),
        (["heads", "--help"], 0),
        # argument errors: an unknown command or option, a value out of range, an unknown
        # preset or dtype, a size refused by the calculator's checks
        (["no-such-command"], 2),
        (["heads", "--no-such-option"], 2),
        (["shapes", "--d-model", "0"], 2),
        (["shapes", "--preset", "gpt5"], 2),
        (["shapes", "--dtype", "int4"], 2),
        (["shapes", "--seq", "16777216", "--batch", "65536"], 2),
    ],
    ids=lambda v: " ".join(v) if isinstance(v, list) else f"exit {v}",
)
def test_help_models_and_argument_errors_import_no_heavy_library(args, code):
    names, proc = imported(*args)
    assert proc.returncode == code, proc.stdout + proc.stderr
    assert "headlab.cli" in names  # the log was read: the command line itself is in it
    assert heavy(names) == [], f"`headlab {' '.join(args)}` imported {heavy(names)}"
    assert "Traceback" not in proc.stderr


def test_shapes_imports_torch_and_nothing_else_heavy():
    """`shapes` runs the real layer on the meta device, so it needs torch; only torch. (That the
    log shows torch here is also what shows the checks above could see it.)"""
    names, proc = imported("shapes", "--d-model", "512", "--heads", "8")
    assert proc.returncode == 0, proc.stderr
    assert "verdict: MHA, h=8, h_kv=8, d_k=64" in proc.stdout
    assert heavy(names) == ["torch"]
