"""The house's measures of a checkout: modules and lines, modules over 500 lines, functions over
60 lines, and modules that import by string (DESIGN.md's rules; tests/unit/test_layers.py checks
the import order itself).

Run: ``python scripts/house_metrics.py [CHECKOUT]`` (default: this checkout). To compare with an
older commit: ``d=$(mktemp -d); git archive COMMIT src | tar -x -C $d; python
scripts/house_metrics.py $d``.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path


def main(checkout: Path) -> None:
    root = checkout / "src" / "headlab"
    modules = sorted(root.rglob("*.py"))
    sizes = {str(p.relative_to(root)): len(p.read_text().splitlines()) for p in modules}
    long_functions = []
    for p in modules:
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                start = node.decorator_list[0].lineno if node.decorator_list else node.lineno
                if (length := (node.end_lineno or start) - start + 1) > 60:
                    long_functions.append(f"{p.relative_to(root)}:{node.name} ({length})")
    by_string = [
        str(p.relative_to(root))
        for p in modules
        if any(call in p.read_text() for call in ("import_module(", "__import__("))
    ]
    largest = max(sizes, key=sizes.__getitem__)
    print(
        f"modules: {len(sizes)}, lines: {sum(sizes.values())}, largest: {largest} "
        f"({sizes[largest]})"
    )
    print("modules over 500 lines:", {k: v for k, v in sizes.items() if v > 500} or "none")
    print("functions over 60 lines:", long_functions or "none")
    print("modules importing by string:", by_string or "none")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parents[1])
