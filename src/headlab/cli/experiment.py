"""``headlab train`` and ``headlab experiment``: a training recipe with checkpoints, and an
experiment's results, figures and summary."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer
from rich.table import Table

from headlab.cli.common import SEED_MAX, SEEDS_MAX, console, err_console, fail
from headlab.cli.common import seed_option as _seed_option


def train_command(
    recipe: str = typer.Argument(..., help="What to train: a recipe name (e.g. induction)."),
    quick: bool = typer.Option(False, "--quick", help="A short run (tests, a first look)."),
    resume: bool = typer.Option(False, "--resume", help="Continue the run in --out exactly."),
    out: str | None = typer.Option(None, "--out", help="Run directory (default runs/RECIPE)."),
    seed: int = _seed_option("Seed for the weights and the data:"),
    verify: bool = typer.Option(
        False, "--verify", help="default only: compare the rebuild with the shipped model."
    ),
) -> None:
    """Train a model from a recipe, with checkpoints; Ctrl-C saves one, --resume continues."""
    from headlab.checkpoint import CheckpointError
    from headlab.cli.support import make_reporter
    from headlab.corpus import CorpusUnavailable
    from headlab.experiments.registry import recipes

    known = recipes()
    if recipe not in known:
        raise fail(f"unknown recipe {recipe!r}; valid recipes: {', '.join(sorted(known))}")
    if verify and (recipe != "default" or quick or seed != 0):
        raise fail(
            "--verify rebuilds the shipped model: use it as `headlab train default --verify`"
        )
    run_dir = _out_dir(out, recipe)
    try:
        reporter = make_reporter()
        result = known[recipe](run_dir, quick=quick, seed=seed, resume=resume, reporter=reporter)
    except (CheckpointError, FloatingPointError, CorpusUnavailable) as e:
        raise fail(str(e)) from None
    if result.interrupted:
        err_console.print(
            f"interrupted at step {result.step}; checkpoint saved in {run_dir}. Continue with: "
            f"headlab train {recipe} --resume --out {run_dir}" + (" --quick" if quick else "")
        )
        raise typer.Exit(130)
    console.print(
        f"trained {recipe!r}: step {result.step} in {result.wall_seconds:.1f} s; run in {run_dir}"
    )
    if verify:
        from headlab.verify import verify_default_run

        _report_verification(verify_default_run(run_dir))


def _report_verification(v: Any) -> None:
    """Every check of a :class:`headlab.verify.Verification`, its verdict; exit 1 if it fails."""
    table = Table("check", "shipped", "rebuilt", "rule", "holds", title=f"verifying {v.what}")
    for c in v.checks:
        shown = [f"{x:.4g}" if isinstance(x, float) else str(x) for x in (c.shipped, c.rebuilt)]
        table.add_row(c.name, *shown, c.rule, "yes" if c.ok else "[bold red]NO[/]")
    console.print(table)
    console.print(v.verdict(), highlight=False)
    if not v.ok:
        raise typer.Exit(1)


QUICK_HELP = (
    "A smaller version: for induction the recipe of the page's live runs, for the others a "
    "short run (a first look, and the tests)."
)
SEEDS_HELP = f"How many seeds (seed, seed+1, ...), 1..{SEEDS_MAX}."
VERIFY_HELP = "induction only: rerun the shipped seeds and compare."
THREADS_HELP = (
    "induction only: torch CPU threads (default 1; a run repeats bit for bit only on the same "
    "count, and the page's live runs use `headlab serve --live-threads`, 2 on two cores)."
)


MODEL_HELP = "retrieval only: smollm2 (the default) or gemma3 (its own sweep, shipped apart)."


def _check_model(experiment: Any, model: str) -> None:
    """Exit 2, before anything runs, when --model is not for ``experiment`` or names a model it
    has no config for."""
    from headlab.experiments.registry import check_model

    if "model" not in experiment.options:
        raise fail(
            f"--model is for the retrieval experiment; {experiment.name} runs its own models"
        )
    try:
        check_model(experiment, model)
    except ValueError as exc:
        raise fail(str(exc)) from None


def experiment_command(
    name: str = typer.Argument(..., help="Experiment name, or 'list' to see them all."),
    quick: bool = typer.Option(False, "--quick", help=QUICK_HELP),
    seeds: int = typer.Option(1, "--seeds", min=1, max=SEEDS_MAX, help=SEEDS_HELP),
    seed: int = _seed_option("The first seed:"),
    out: str | None = typer.Option(None, "--out", help="Output directory (default runs/NAME)."),
    ship: bool = typer.Option(False, "--ship", help="Also store the results for the web page."),
    verify: bool = typer.Option(False, "--verify", help=VERIFY_HELP),
    threads: int | None = typer.Option(None, "--threads", min=1, max=256, help=THREADS_HELP),
    as_json: bool = typer.Option(False, "--json", help="Print the results as JSON."),
    model: str | None = typer.Option(None, "--model", help=MODEL_HELP),
) -> None:
    """Run an experiment: results.json and PNG figures in --out, a summary here."""
    from headlab.experiments import ship_results
    from headlab.experiments.registry import experiments

    known = experiments()
    if name == "list":
        _print_experiments(known)
        return
    if name not in known:
        raise fail(f"unknown experiment {name!r}; valid: {', '.join(known)} (or 'list')")
    experiment = known[name]
    if seed + seeds - 1 > SEED_MAX:
        raise fail(f"--seed {seed} with --seeds {seeds} runs seeds past 2**63-1; lower --seed")
    if ship and quick:
        raise fail("--ship stores a full run for the web page; run it without --quick")
    if verify:
        seed, seeds = _verify_seeds(name, quick or ship, threads)
    if threads is not None and "threads" not in experiment.options:
        raise fail(f"--threads is for the induction experiment; {name} runs on one thread")
    if model is not None:
        _check_model(experiment, model)
    out_dir = _out_dir(out, name)
    err_console.print(f"running {name}{' (quick)' if quick else ''}, {seeds} seed(s) from {seed}")
    extra = _run_progress(experiment.options) | ({} if threads is None else {"threads": threads})
    extra |= {} if model is None else {"model": model}
    try:
        results = experiment.run(quick=quick, seeds=seeds, seed=seed, out=out_dir, **extra)
    except KeyboardInterrupt:
        raise fail("interrupted; nothing was written", code=130) from None
    except ValueError as exc:  # an option the experiment refuses (--model: which it takes)
        raise fail(str(exc)) from None
    if as_json:
        import json

        typer.echo(json.dumps(results, ensure_ascii=False))
    else:
        _print_summary(name, results)
        console.print(f"results and figures in {out_dir}")
    if ship:  # another model's run beside the page's own: results/NAME-MODEL.json
        stored = name if model is None else f"{name}-{model}"
        console.print(f"shipped as {ship_results(stored, results)}")
    if verify:
        from headlab.verify import verify_induction_results

        _report_verification(verify_induction_results(results))


def _print_experiments(known: dict[str, Any]) -> None:
    """`headlab experiment list`: each experiment and what it measures."""
    table = Table("experiment", "what it measures")
    for e in known.values():
        table.add_row(e.name, e.summary)
    console.print(table)


def _verify_seeds(name: str, not_a_rerun: bool, threads: int | None) -> tuple[int, int]:
    """--verify reruns the shipped induction run as it was made: its seeds, on one thread."""
    if name != "induction" or not_a_rerun:
        raise fail(
            "--verify reruns the shipped induction run: `headlab experiment induction --verify`"
        )
    if threads not in (None, 1):
        raise fail("--verify reruns the shipped run on one thread, as it was made; drop --threads")
    return _shipped_seeds(name)


def _shipped_seeds(name: str) -> tuple[int, int]:
    """(first seed, count) of the shipped run of experiment ``name``."""
    import json

    from headlab.experiments import results_path

    shipped = [s["seed"] for s in json.loads(results_path(name).read_text())["seeds"]]
    return min(shipped), len(shipped)


def _run_progress(options: frozenset[str]) -> dict[str, Any]:
    """A progress bar and progress lines for experiments whose run takes them (the induction
    experiment: the events its live panel on the page draws, printed)."""
    from headlab.cli.support import make_reporter

    kwargs: dict[str, Any] = {}
    if "reporter" in options:
        kwargs["reporter"] = make_reporter()
    if "listener" in options:
        kwargs["listener"] = _print_event
    return kwargs


def _print_event(event: Any) -> None:
    """A line every 100 steps (losses, the best heads the event names), one when the phase change
    is first detected, and the verdict of each model: the watched run's events, formatted."""
    from headlab.training.watch import Evaluation, PhaseChange, Verdict

    if isinstance(event, Evaluation) and event.step % 100 == 0:
        ind, prev = event.best_induction, event.best_prev_token
        err_console.print(
            f"step {event.step:>5}  loss first copy {event.record['first_copy_loss']:.3f}, "
            f"repeated {event.record['repeated_loss']:.3f}  best induction {ind.head} "
            f"{ind.score:.3f}  best previous-token {prev.head} {prev.score:.3f}",
            highlight=False,
            soft_wrap=True,
        )
    elif isinstance(event, PhaseChange):
        lo, hi = event.phase_change["window"]
        err_console.print(
            f"phase change detected at step {event.step}: window {lo}–{hi}",
            highlight=False,
            soft_wrap=True,
        )
    elif isinstance(event, Verdict):
        err_console.print(
            f"{event.n_layers} layer(s): {event.text}",
            highlight=False,
            soft_wrap=True,
        )


def _out_dir(out: str | None, name: str) -> Path:
    """``--out``, or runs/NAME, checked before any work (exit 2 with the reason)."""
    from headlab.cli.support import out_dir_problem

    problem = out_dir_problem(out if out is not None else Path("runs") / name)
    if problem is not None:
        raise fail(problem)
    return Path(out) if out is not None else Path("runs") / name


def _print_summary(name: str, results: dict) -> None:
    """The scalar results (numbers, words, short lists) as a table; histories stay in the file."""
    table = Table("result", "value", title=f"experiment {name}")
    for key, value in results.items():
        if isinstance(value, float):
            table.add_row(key, f"{value:.4g}")
        elif isinstance(value, int | str | bool) or value is None:
            table.add_row(key, str(value))
        elif isinstance(value, list) and len(value) <= 8 and all(isinstance(v, str) for v in value):
            table.add_row(key, ", ".join(value) or "(none)")
    console.print(table)
