"""The headlab command line: thin wrappers that call the library and format its results.

One module per command group, each command a wrapper over one library call:

    info        info, models        what headlab runs with; the models it can load or fetch
    serve       serve               the explainer page and its API
    shapes      shapes              every tensor's shape, parameters, FLOPs of one layer
    heads       heads               what each head does: one probe, or many prompts
    syntax      syntax              each dependency relation's best head against a parse
    circuit     circuit             the induction circuit; each label's evidence (heads --evidence)
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
from headlab.cli.common import console

app = typer.Typer(
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


# in the order `headlab --help` lists them
app.command()(info.info)
app.command()(serve.serve)
app.command()(shapes.shapes)
app.command()(info.models)
app.command()(heads.heads)
app.command("syntax")(syntax.syntax_command)
app.command()(circuit.circuit)
app.command("compare")(compare.compare_command)
app.command()(generate.generate)
app.command("train")(experiment.train_command)
app.command("experiment")(experiment.experiment_command)
app.command()(static.static)

__all__ = ["app"]
