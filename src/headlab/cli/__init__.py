"""The headlab command line: thin wrappers that call the library and format its results.

One module per command group, each command a wrapper over one library call:

    info        info, models        what headlab runs with; the models it can load or fetch
    serve       serve               the explainer page and its API
    shapes      shapes              every tensor's shape, parameters, FLOPs of one layer
    heads       heads               what each head does: one probe, or many prompts
    syntax      syntax              each dependency relation's best head against a parse
    circuit     circuit             the induction circuit; each label's evidence (heads --evidence)
    switch      (heads --off)       a set of heads switched off, beside the intact run
    compare     compare             head roles along a series of checkpoints
    static      static              the explainer as a static site, the model in the browser
    generate    generate            continue a prompt, optionally labelling the heads
    experiment  train, experiment   training recipes and experiments
    common      the consoles, ``fail``, shared options and progress bars
    support     the terminal reporters, the recipe registry, the checks on --out

Only this package imports its modules; torch and the library load inside the commands, so
``headlab --help`` stays fast.
"""

from __future__ import annotations

import contextlib
import errno
import inspect
import os
import sys
from collections.abc import Callable
from typing import Any, NoReturn

import typer

from headlab import __version__
from headlab.cli import (
    circuit,
    compare,
    experiment,
    generate,
    heads,
    info,
    serve,
    shapes,
    static,
    syntax,
)
from headlab.cli.common import console, fail

# what writing the output answers when it cannot be written: a full disk (`> /dev/full`), a full
# quota, a file over its size limit, a reader that closed the pipe (`| head`)
OUTPUT_LOST = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EPIPE)


class Headlab(typer.Typer):
    """typer's app, where output that cannot be written ends the run with one sentence on
    stderr and exit 1 instead of a traceback (a closed pipe ends it quietly, as other commands
    do), whichever command wrote it. Output still buffered at the end is written before the
    run ends, so that its failure is seen here too, not by the interpreter at exit."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        try:
            try:
                return super().__call__(*args, **kwargs)
            finally:
                if sys.stdout is not None:  # None when started with stdout closed (>&-)
                    sys.stdout.flush()
        except OSError as exc:
            if exc.errno not in OUTPUT_LOST:
                raise
            _output_lost(exc)


def _output_lost(exc: OSError) -> NoReturn:
    """Say why the output was lost (not for a closed pipe: its reader wants no more), point
    stdout at the null device so that the interpreter's last flush has nothing to fail, and exit
    1."""
    with contextlib.suppress(OSError, ValueError):
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, sys.stdout.fileno())
    if exc.errno != errno.EPIPE:
        with contextlib.suppress(OSError):  # stderr may be on the full disk too
            fail(f"could not write the output: {exc.strerror or exc}")
    raise SystemExit(1)


app = Headlab(
    name="headlab",
    help="Multi-head attention you can run, measure and see.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


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


def _command(fn: Callable[..., None], name: str | None = None) -> None:
    """Register ``fn`` as a command; the list in ``headlab --help`` shows its docstring's first
    paragraph as one paragraph (typer's rich mode would keep the docstring's line breaks there,
    cutting lines mid-sentence)."""
    first = inspect.cleandoc(fn.__doc__ or "").split("\n\n")[0]
    app.command(name, short_help=" ".join(first.split()))(fn)


# in the order `headlab --help` lists them
_command(info.info)
_command(serve.serve)
_command(shapes.shapes)
_command(info.models)
_command(heads.heads)
_command(syntax.syntax_command, "syntax")
_command(circuit.circuit)
_command(compare.compare_command, "compare")
_command(generate.generate)
_command(experiment.train_command, "train")
_command(experiment.experiment_command, "experiment")
_command(static.static)

__all__ = ["app"]
