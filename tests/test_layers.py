"""The package's rooms import only from rooms below them (DESIGN.md: attention ← model ← measure ←
heads ← experiments ← cli/server), never back up, and not through importlib strings either.

The imports are read from the source with ``ast`` (lazy imports inside functions count too), so
a new upward import fails here before a reviewer has to find it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "headlab"

# rank of each room; a module may import modules of its own rank or lower
RANKS = {
    "trace": 0,
    "checkpoint": 0,
    "corpus": 0,
    "reference": 0,
    "pypi": 0,
    "devices": 0,
    "attention": 1,
    "model": 2,
    "shapes": 2,
    "convert": 3,
    "measure": 3,
    "smollm2": 3,
    "generation": 3,
    "tasks": 4,
    "train": 4,
    "ablation": 4,
    "heads": 4,
    "zoo": 4,
    "heads_render": 5,
    "scaling": 5,
    "syntax": 5,
    "verify": 6,
    "default_model": 6,
    "experiments": 6,
    "cli_support": 7,
    "show": 7,  # notebook views and the offline file: heads, shapes; reads the page's scripts
    "server": 7,
    "cli": 8,
    "__init__": 8,  # the package's own __init__ re-exports the core
}
# the only modules that may import by string: the experiment registry (its own submodules)
# and the page's "show the code" route, which resolves names from an allow-list
STRING_IMPORTS = {"experiments/__init__.py", "server/routes/code.py"}


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


def test_only_the_registries_import_by_string() -> None:
    users = {
        str(p.relative_to(SRC))
        for p in SOURCES
        if "import_module(" in p.read_text(encoding="utf-8")
        or "__import__(" in p.read_text(encoding="utf-8")
    }
    assert users <= STRING_IMPORTS, users - STRING_IMPORTS


def test_the_rank_table_catches_an_upward_import(tmp_path: Path) -> None:
    """The checker itself: a made-up measure module importing the experiments is caught."""
    fake = tmp_path / "measure.py"
    fake.write_text("def f():\n    from headlab.experiments import induction\n", encoding="utf-8")
    found = imports(fake)
    assert found == {"headlab.experiments"}
    assert RANKS[room(next(iter(found)))] > RANKS["measure"]
