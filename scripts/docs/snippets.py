"""Run a Markdown page's Python examples and compare what they print with what the page says.

    python scripts/docs/snippets.py docs/tutorial.md README.md

A ```python block followed (after blank lines only) by a ```text block is an example and its
output. All the examples of a page run in order in one fresh interpreter (PYTHONPATH=src), as a
reader would type them into one session; each block's printed lines are compared with its text
block, trailing spaces ignored. tests/unit/test_docs.py runs it on the tutorial and the README.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = re.compile(r"```python\n(?P<code>.*?)```\n\s*```text\n(?P<out>.*?)```", re.S)
SEPARATOR = "----- headlab example -----"


@dataclass(frozen=True)
class Example:
    code: str
    expected: str
    got: str

    @property
    def ok(self) -> bool:
        return _lines(self.expected) == _lines(self.got)


def _lines(text: str) -> list[str]:
    return [line.rstrip() for line in text.strip("\n").splitlines()]


def examples(markdown: str) -> list[tuple[str, str]]:
    """The page's (code, expected output) pairs, in order."""
    return [(m["code"], m["out"]) for m in EXAMPLE.finditer(markdown)]


def run(markdown: str, timeout: float = 600) -> list[Example]:
    """Run every example of ``markdown`` in one interpreter; each with what it printed."""
    pairs = examples(markdown)
    script = "\n".join(f"{code}\nprint({SEPARATOR!r})" for code, _ in pairs)
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=timeout,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"the examples failed:\n{done.stderr[-3000:]}")
    outputs = done.stdout.split(SEPARATOR + "\n")
    return [
        Example(code, expected, got) for (code, expected), got in zip(pairs, outputs, strict=False)
    ]


def main(paths: list[str]) -> int:
    bad = 0
    for path in paths:
        for ex in run(Path(path).read_text(encoding="utf-8")):
            if not ex.ok:
                bad += 1
                print(f"{path}: example\n{ex.code}\nprinted\n{ex.got}\nnot\n{ex.expected}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
