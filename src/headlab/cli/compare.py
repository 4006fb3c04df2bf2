"""``headlab compare``: head roles across a series of checkpoints of one architecture, on one
probe (:mod:`headlab.series`): a table of each head's label and score at each checkpoint, the
heads whose label changes, JSON, and a heads × checkpoints figure."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from headlab.cli.common import console, ensure_fetched, err_console, fail, progress_bar, seed_option

MODELS_HELP = (
    "A checkpoint of the series, in order; give it twice or more. A model name from `headlab "
    "models`, a model folder, a checkpoint of `headlab train` (…/checkpoints/step-000400), or a "
    "training run folder (every checkpoint it keeps)."
)


def compare_command(
    models: Annotated[list[str], typer.Option("--model", help=MODELS_HELP)],
    probe: str = typer.Option("random-repeat", help="Built-in probe: random-repeat or repeat."),
    text: str | None = typer.Option(None, help="Your own text as the probe, in place of --probe."),
    tokenizer: str | None = typer.Option(
        None, "--tokenizer", help="A model whose tokenizer serves checkpoints that carry none."
    ),
    score: str = typer.Option("induction", help="The score the table and the figure show."),
    seed: int = seed_option("Seed of the random-repeat probe's tokens:"),
    content: bool = typer.Option(
        False, "--content/--no-content", help="Also score content heads (from the same forward)."
    ),
    png: str | None = typer.Option(None, "--png", help="Write the heads × checkpoints figure."),
    as_json: bool = typer.Option(False, "--json", help="Print the series as JSON."),
) -> None:
    """How each head's label and scores change along a series of checkpoints (one probe)."""
    from headlab.files import check_writable
    from headlab.heads import MUL_TYPES, SCORE_TYPES

    if score not in (*SCORE_TYPES, *MUL_TYPES):
        raise fail(f"--score {score!r}: valid scores are {', '.join((*SCORE_TYPES, *MUL_TYPES))}")
    problem = None if png is None else check_writable(png, try_it=True)
    if problem is not None:
        raise fail(f"--png {problem}")
    series = _series(models, probe, text, tokenizer, seed, content)
    if as_json:
        import json

        typer.echo(json.dumps(series.to_dict(), ensure_ascii=False))
    else:
        _print_table(series, score)
    if png is not None:
        path = Path(png)
        series.figure(path.parent, score, path.name)
        (err_console if as_json else console).print(f"wrote {path}")


def _series(
    models: list[str],
    probe: str,
    text: str | None,
    tokenizer: str | None,
    seed: int,
    content: bool,
) -> Any:
    """The series of ``models`` analysed on one probe (exit 2 with a sentence on bad input)."""
    from headlab import series, zoo

    for name in [*models, *([tokenizer] if tokenizer else [])]:
        ensure_fetched(name)
    try:
        shared = zoo.load(tokenizer)[1] if tokenizer is not None else None
        members = series.load_series(models, shared)
        built = series.series_probe(members, "text" if text is not None else probe, seed, text)
        with progress_bar() as bar:
            done = lambda i, total: bar(i, total, "checkpoints")  # noqa: E731
            return series.compare(members, built, content=content, progress=done)
    except ValueError as exc:
        raise fail(str(exc)) from None


def _print_table(series: Any, score: str) -> None:
    """One row per head: its label and ``score`` at each checkpoint; changed heads marked."""
    from rich.table import Table

    values, labels, changed = series.scores(score).flatten(1), series.labels(), series.changed()
    table = Table(
        "head",
        *series.names,
        "changed",
        title=f"{score} score and label, {series.probe} probe",
        box=None,
        padding=(0, 1, 0, 0),
    )
    for i, (layer, head) in enumerate(series.heads):
        cells = [f"{labels[c][i]} {values[c, i]:.2f}" for c in range(len(series.names))]
        table.add_row(f"{layer}.{head}", *cells, "yes" if (layer, head) in changed else "")
    console.print(table)
    console.print(
        f"{len(changed)} of {len(series.heads)} heads change label along the series",
        highlight=False,
    )
