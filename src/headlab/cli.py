"""The headlab command line: thin wrappers that call the library and format its results."""

from __future__ import annotations

import typer
from rich.console import Console

from headlab import __version__

app = typer.Typer(
    name="headlab",
    help="Multi-head attention you can run, measure and see.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
console = Console()
err_console = Console(stderr=True)


def fail(message: str, code: int = 2) -> typer.Exit:
    """Print a user-facing error (no traceback) and return the Exit to raise."""
    err_console.print(f"[bold red]error:[/] {message}")
    return typer.Exit(code)


def _version(value: bool) -> None:
    if value:
        console.print(f"headlab {__version__}")
        raise typer.Exit()


@app.callback()
def main(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """Multi-head attention you can run, measure and see."""


@app.command()
def info() -> None:
    """Print the versions headlab runs with (torch, Python) and the CPU threads it uses."""
    import platform

    import torch

    console.print(f"headlab {__version__}")
    console.print(f"torch {torch.__version__}, Python {platform.python_version()}")
    console.print(f"threads: {torch.get_num_threads()}")


if __name__ == "__main__":
    app()
