"""Regenerate docs/data/*.json: the command-line answers the documentation's head tables quote.

    python scripts/docs/data.py                  # every file whose model loads here
    python scripts/docs/data.py heads-minilm     # one

Each file is ``{"command", "date", "versions", "output"}``: the command exactly as a user types
it, what it ran on (:func:`headlab.provenance.versions`: Python, torch, ..., the lock; the
commands run in this interpreter) and its ``--json`` answer. The pages render their tables from
``output`` (scripts/docs/figures.py), and tests/unit/test_docs.py reruns the default model's
commands and compares, so a table cannot drift from what the command prints.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
from pathlib import Path

from headlab.files import write_json
from headlab.provenance import versions

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "docs/data"
COMMANDS = {
    "heads-default": "headlab heads --model default --json",
    "heads-default-random": "headlab heads --model default --probe random-repeat --json",
    "heads-default-needle": "headlab heads --model default --probe needle --json",
    "heads-minilm": "headlab heads --model minilm --json",
    "syntax-minilm": "headlab syntax --model minilm --json",
    "syntax-default": "headlab syntax --model default --json",
    "heads-smollm2": "headlab heads --model smollm2 --json",
    "heads-smollm2-random": "headlab heads --model smollm2 --probe random-repeat --json",
}


def run(command: str) -> dict:
    """``command``'s JSON answer, run by this interpreter (``python -m headlab.cli``)."""
    argv = [sys.executable, "-m", "headlab.cli", *command.split()[1:]]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    done = subprocess.run(argv, capture_output=True, text=True, env=env, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{command}: exit {done.returncode}: {done.stderr.strip()[-500:]}")
    return json.loads(done.stdout)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", choices=[[], *COMMANDS], help="default: all")
    names = parser.parse_args(argv).names or list(COMMANDS)
    stamp = {"date": datetime.date.today().isoformat(), "versions": versions()}
    for name in names:
        try:
            output = run(COMMANDS[name])
        except RuntimeError as e:
            print(f"skipped {name}: {e}", file=sys.stderr)
            continue
        write_json(DATA / f"{name}.json", {"command": COMMANDS[name], **stamp, "output": output})
        print(f"wrote docs/data/{name}.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
