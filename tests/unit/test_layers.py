"""The package's rooms import only from rooms below them (DESIGN.md: attention ← model ← measure ←
heads ← training ← experiments ← site ← server ← cli), never back up, and never through importlib
strings (no module imports by string; a registry imports plainly inside a function).

The imports are read from the source with ``ast`` (lazy imports inside functions count too), so
a new upward import fails here before a reviewer has to find it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "headlab"

# Every room has its own rank, lowest first; a module may import its own room and rooms of a lower
# rank, so an arrow up between two rooms fails here even when they sit near each other.
ORDER = (
    "files",  # ground floor: the one atomic write, finite JSON, torch thread settings
    "provenance",  # what a run ran on: Python, the libraries' versions, the lock (no torch)
    "numbers",  # integer helpers (the head counts that split a width): no torch
    "trace",
    "devices",
    "pypi",
    "corpus",
    "reference",
    "checkpoint",
    "attention",
    "model",
    "shapes",
    "convert",
    "smollm2",
    "gemma3",
    "zoo",
    "generation",
    "measure",
    "ablation",
    "heads",  # targets, scores, labels, evidence, syntax, the report, terminal views
    "head_table",  # the table over many prompts, its JSON and CSV
    "scaling",
    "training",  # the loop, the watched run, tasks
    "default_model",
    "experiments",
    "series",  # head roles across checkpoints: heads on each, the figure (experiments' pyplot)
    "verify",
    "show",  # notebook views and the offline file: heads, shapes; reads the page's scripts
    "site_smollm2",  # SmolLM2's site graph read from the wheel's GGUF blocks (no export)
    "site",  # the static site: the page, the ONNX export; the server's answers handed in
    "server",
    "cli",
    "__init__",  # the package's own __init__ re-exports the core
)
RANKS = {name: rank for rank, name in enumerate(ORDER)}
# modules allowed to import by string: none (the registries and the page's "show the code" route
# import plainly inside functions, which the rank test above reads)
STRING_IMPORTS: set[str] = set()
STRING_IMPORT_CALLS = ("import_module(", "__import__(", "importlib.import_module")


def room(module: str) -> str:
    """'headlab.experiments.prune' → 'experiments'; 'headlab' → '__init__'."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def imports(path: Path) -> set[str]:
    """Every headlab module ``path`` imports, at the top or inside functions."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "headlab":
                found |= {f"headlab.{a.name}" for a in node.names}
            elif node.module.startswith("headlab."):
                found.add(node.module)
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("headlab.")}
    return found


SOURCES = sorted(SRC.rglob("*.py"))


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(SRC)))
def test_no_module_imports_a_higher_room(path: Path) -> None:
    rel = path.relative_to(SRC)
    mine = rel.parts[0].removesuffix(".py") if len(rel.parts) > 1 else rel.stem
    assert mine in RANKS, f"{rel}: new room {mine!r}; give it a rank in RANKS (DESIGN.md)"
    for target in imports(path):
        theirs = room(target)
        if theirs == "__version__":
            continue
        assert theirs in RANKS, f"{rel} imports {target}, a room with no rank in RANKS"
        rank = RANKS[theirs]
        assert rank <= RANKS[mine], f"{rel} ({mine}, rank {RANKS[mine]}) imports {target} ({rank})"


def string_imports(path: Path) -> bool:
    """Whether ``path`` imports a module by a string (importlib, ``__import__``)."""
    text = path.read_text(encoding="utf-8")
    return any(call in text for call in STRING_IMPORT_CALLS)


def test_no_module_imports_by_string() -> None:
    users = {str(p.relative_to(SRC)) for p in SOURCES if string_imports(p)}
    assert not STRING_IMPORTS and users == STRING_IMPORTS, sorted(users)


@pytest.mark.parametrize(
    ("name", "source", "above"),
    [
        ("measure.py", "def f():\n    from headlab.experiments import induction\n", "experiments"),
        # peers of old (issue 23): the shipped model's recipe may not reach up to the experiments
        ("default_model.py", "from headlab.experiments import one_thread\n", "experiments"),
        # issue 44: the static site's builder was the one arrow up, into the server
        ("site.py", "def f():\n    from headlab.server import create_app\n", "server"),
    ],
)
def test_the_rank_table_catches_an_upward_import(
    tmp_path: Path, name: str, source: str, above: str
) -> None:
    """The checker itself: a made-up module importing a room above it is caught."""
    fake = tmp_path / name
    fake.write_text(source, encoding="utf-8")
    found = imports(fake)
    assert found == {f"headlab.{above}"}
    assert RANKS[room(next(iter(found)))] > RANKS[fake.stem]


def test_the_string_import_check_catches_one(tmp_path: Path) -> None:
    fake = tmp_path / "code.py"
    fake.write_text("import importlib\nm = importlib.import_module('headlab.x')\n", "utf-8")
    assert string_imports(fake)
