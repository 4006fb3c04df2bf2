"""The command line's entry points that exist from the first day: --help and --version."""

from __future__ import annotations

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
