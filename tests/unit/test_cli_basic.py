"""The command line's entry points that exist from the first day: --help and --version."""

from __future__ import annotations

import json
import subprocess
import sys

from typer.testing import CliRunner

import headlab
from headlab.cli import app


def test_version_prints_package_version():
    result = CliRunner().invoke(app, ["--version"])
    assert result.exit_code == 0
    assert result.output.strip() == f"headlab {headlab.__version__}"


def test_help_lists_commands_and_runs_as_console_script():
    proc = subprocess.run(
        [sys.executable, "-m", "headlab.cli", "--help"], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stderr
    assert "Multi-head attention you can run, measure and see" in proc.stdout


def test_only_the_cli_imports_its_reporters_and_recipe_registry():
    """The recipe registry and the terminal reporters sit at the top (headlab.cli.support): no
    library module (nor the server) names them or any module of the CLI, not even in an
    importlib string."""
    import ast
    from pathlib import Path

    root = Path(headlab.__file__).parent
    offenders = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel.startswith("cli/"):
            continue  # the CLI itself
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                names = [node.value.split(":")[0]]
            if any(n == "headlab.cli" or n.startswith("headlab.cli.") for n in names):
                offenders.append(rel)
    assert offenders == []
    from headlab.training import train

    assert not hasattr(train, "RECIPES")


def test_help_loads_no_library_module_beyond_the_package_core():
    """`headlab --help` imports every command group, so their top-level imports stay light: past
    what `import headlab` itself loads, only the CLI's own modules (not even its support module,
    which imports the training loop) and headlab.shapes's torch-free config, presets, figures
    (the closed-form report) and the statement they evaluate, whose LIMITS bound `headlab
    shapes`'s options (as they bound the API's), with the integer helpers they use; no other
    room of the library, and no torch."""
    code = (
        "import json, sys, headlab; core = set(sys.modules); "
        "from typer.main import get_command; from headlab.cli import app; "
        "get_command(app); "
        "print(json.dumps(sorted(m for m in set(sys.modules) - core "
        "if m.startswith(('headlab', 'torch')))))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    shapes = {
        "headlab.shapes",
        "headlab.shapes.config",
        "headlab.shapes.presets",
        "headlab.shapes.figures",
        "headlab.shapes.statement",
        "headlab.shapes.formula",
        "headlab.numbers",
    }
    loaded = set(json.loads(proc.stdout)) - {"headlab.cli"} - shapes
    assert "headlab.cli.common" in loaded
    assert {
        m for m in loaded if not m.startswith("headlab.cli.") or m.endswith(".support")
    } == set()


def test_the_command_list_wraps_each_summary_only_where_the_column_is_full():
    """`headlab --help` lists each command with its docstring's first paragraph, reflowed to the
    column: a summary goes on to the next line only where its next word would not fit, never at
    a line break of the docstring, and says the paragraph word for word."""
    import inspect
    import itertools

    result = CliRunner().invoke(app, ["--help"], env={"COLUMNS": "80"}, terminal_width=80)
    assert result.exit_code == 0
    lines = result.output.splitlines()
    panel = lines[next(i for i, s in enumerate(lines) if "Commands" in s) + 1 :]
    panel = [s for s in panel if s.startswith("│")]
    start = len(panel[0]) - len(panel[0][1:].lstrip().split(" ", 1)[1].lstrip())
    width = len(panel[0]) - 2 - start  # the text column: from `start` to the border's padding
    cells: dict[str, list[str]] = {}
    name = ""
    for row in panel:
        name = row[1:start].strip() or name
        cells.setdefault(name, []).append(row[start:-1].rstrip())
    docs = {
        c.name or c.callback.__name__.replace("_", "-"): c.callback.__doc__ or ""
        for c in app.registered_commands
        if c.callback is not None
    }
    assert set(cells) == set(docs)
    for name, doc in docs.items():
        text = cells[name]
        assert " ".join(text).split() == inspect.cleandoc(doc).split("\n\n")[0].split(), name
        for line, after in itertools.pairwise(text):
            assert len(line) + 1 + len(after.split()[0]) > width, (name, line, after)
