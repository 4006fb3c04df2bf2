"""What ``headlab experiment NAME`` and ``headlab train NAME`` can run, by plain imports.

Each function imports the modules it names when it is called, not when this module is imported,
so ``headlab --help`` stays fast (the experiments import torch and matplotlib).

    experiments()   name → :class:`Experiment`: its summary, its ``run`` and the options it takes
    recipes()       name → a training recipe ``(out, *, quick, seed, resume, reporter) ->
                    TrainResult`` that lives with what it trains (an experiment, the shipped model)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from types import ModuleType

    from headlab.training.train import TrainResult

RunFn = Callable[..., dict[str, Any]]
Recipe = Callable[..., "TrainResult"]


@dataclass(frozen=True)
class Experiment:
    """One experiment: ``run(quick=, seeds=, seed=, out=, **options)`` → its results dict."""

    name: str  # the command's name: ``headlab experiment NAME``
    summary: str  # what it measures, in a line (the first of its module's docstring)
    run: RunFn
    # the keywords ``run`` takes besides quick, seeds, seed and out
    options: frozenset[str] = frozenset()
    models: tuple[str, ...] = ()  # with "model" among the options: the names it takes


def check_model(experiment: Experiment, model: str) -> None:
    """A ValueError naming the valid models when ``experiment`` cannot run on ``model``,
    before anything runs (the experiment's own ``run`` says the same)."""
    if experiment.models and model not in experiment.models:
        valid = ", ".join(experiment.models)
        raise ValueError(f"model {model!r} has no {experiment.name} config; valid: {valid}")


def _entry(name: str, module: ModuleType, options: frozenset[str] = frozenset()) -> Experiment:
    doc = (module.__doc__ or "").strip().splitlines()
    models = tuple(getattr(module, "MODELS", ())) if "model" in options else ()
    return Experiment(name, doc[0] if doc else "", module.run, options, models)


def experiments() -> dict[str, Experiment]:
    """Every experiment by command name, in the order ``headlab experiment list`` shows them."""
    from headlab.experiments import (
        gqa,
        head_count,
        induction,
        one_vs_many,
        prune,
        retrieval,
        sinks,
    )

    live = frozenset({"reporter", "listener", "threads"})  # the page's live events, its threads
    return {
        e.name: e
        for e in (
            _entry("induction", induction, live),
            _entry("one-vs-many", one_vs_many),
            _entry("head-count", head_count),
            _entry("prune", prune),
            _entry("gqa", gqa),
            _entry("sinks", sinks),
            _entry("retrieval", retrieval, frozenset({"model"})),
        )
    }


def recipes() -> dict[str, Recipe]:
    """Every training recipe of ``headlab train NAME`` by name."""
    from headlab import default_model
    from headlab.experiments import induction

    return {"induction": induction.train_recipe, "default": default_model.train_recipe}
