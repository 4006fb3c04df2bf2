"""Experiments: one module each, run by ``headlab experiment NAME``.

Every experiment module exposes ``run(*, quick=False, seeds=1, seed=0, out=None) -> dict``: it
trains and measures, returns a JSON-able results dict, and when ``out`` is given writes
``out/results.json`` and its PNG figures there. The results of a full run are shipped in
``experiments/results/<name>.json`` (the web page reads them); ``headlab experiment NAME --ship``
regenerates that file.

The registry maps command names to ``"module:function"`` and imports a module only when its
experiment is asked for, so ``headlab --help`` stays fast and one broken experiment cannot stop
the others from running.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from headlab.files import finite, one_thread, torch_threads, write_json

__all__ = ["finite", "one_thread", "torch_threads"]

RunFn = Callable[..., dict[str, Any]]

RESULTS_DIR = Path(__file__).parent / "results"

# command name -> "module:function"
_REGISTRY: dict[str, str] = {
    "induction": "headlab.experiments.induction:run",
    "one-vs-many": "headlab.experiments.one_vs_many:run",
    "head-count": "headlab.experiments.head_count:run",
    "prune": "headlab.experiments.prune:run",
    "gqa": "headlab.experiments.gqa:run",
}


class _Registry(Mapping[str, RunFn]):
    """``EXPERIMENTS[name]`` imports the experiment's module and returns its run function."""

    def __getitem__(self, name: str) -> RunFn:
        if name not in _REGISTRY:
            raise KeyError(
                f"unknown experiment {name!r}; valid experiments: {', '.join(sorted(_REGISTRY))}"
            )
        module, func = _REGISTRY[name].split(":")
        run: RunFn = getattr(importlib.import_module(module), func)
        return run

    def __iter__(self) -> Iterator[str]:
        return iter(_REGISTRY)

    def __len__(self) -> int:
        return len(_REGISTRY)


EXPERIMENTS: Mapping[str, RunFn] = _Registry()


def describe() -> list[tuple[str, str]]:
    """(name, one-line summary) for every experiment; an experiment that fails to import says so."""
    rows = []
    for name in _REGISTRY:
        try:
            module = importlib.import_module(_REGISTRY[name].split(":")[0])
            doc = (module.__doc__ or "").strip().splitlines()
            rows.append((name, doc[0] if doc else ""))
        except Exception as e:  # listing must survive one broken module
            rows.append((name, f"(unavailable: {type(e).__name__}: {e})"))
    return rows


def results_path(name: str) -> Path:
    """Where the shipped results of experiment ``name`` live: ``results/<name>.json``."""
    return RESULTS_DIR / f"{name}.json"


def write_json_atomic(path: Path, data: Any) -> Path:
    """``data`` as finite JSON through the one writer (:func:`headlab.files.write_json`)."""
    return write_json(path, data)


def write_results(out: Path | None, results: dict[str, Any]) -> Path | None:
    """Write ``out/results.json``; nothing when ``out`` is None."""
    return None if out is None else write_json_atomic(Path(out) / "results.json", results)


def ship_results(name: str, results: dict[str, Any]) -> Path:
    """Copy a full run's results into the package, where the web page reads them, with the date
    they were shipped (the page says which stored run it draws)."""
    import datetime

    dated = {"date": datetime.date.today().isoformat(), **results}
    return write_json_atomic(results_path(name), dated)


def pyplot() -> Any:
    """matplotlib.pyplot on the Agg backend (no display needed), imported only when drawing."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig: Any, out: Path | None, name: str) -> str | None:
    """Save ``fig`` as ``out/name`` (PNG) and close it; returns the file name, or None."""
    plt = pyplot()
    try:
        if out is None:
            return None
        Path(out).mkdir(parents=True, exist_ok=True)
        fig.savefig(Path(out) / name, dpi=110, bbox_inches="tight")
        return name
    finally:
        plt.close(fig)
