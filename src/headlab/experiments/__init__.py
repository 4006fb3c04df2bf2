"""Experiments: one module each, run by ``headlab experiment NAME``; what they share.

Every experiment module exposes ``run(*, quick=False, seeds=1, seed=0, out=None, ...) -> dict``:
it trains and measures, returns a JSON-able results dict, and when ``out`` is given writes
``out/results.json`` and its PNG figures there. The induction experiment's ``run`` takes more
keywords (``reporter``, ``listener``, ``threads``: the live events the page draws, and the thread
count); its registry entry (:mod:`headlab.experiments.registry`) names them, so the command line
passes each experiment only what it takes. The results of a full run are shipped in
``experiments/results/<name>.json`` (the web page reads them); ``headlab experiment NAME --ship``
regenerates that file. Both files record the versions the run ran on (``"versions"``:
:func:`headlab.provenance.versions`), which the docs' captions quote.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from headlab.files import write_atomic, write_json
from headlab.provenance import versions

RESULTS_DIR = Path(__file__).parent / "results"


def results_path(name: str) -> Path:
    """Where the shipped results of experiment ``name`` live: ``results/<name>.json``."""
    return RESULTS_DIR / f"{name}.json"


def write_results(out: Path | None, results: dict[str, Any]) -> Path | None:
    """Write ``out/results.json``, with the versions it ran on; nothing when ``out`` is None."""
    if out is None:
        return None
    return write_json(Path(out) / "results.json", {"versions": versions(), **results})


def ship_results(name: str, results: dict[str, Any]) -> Path:
    """Copy a full run's results into the package, where the web page reads them, with the date
    they were shipped (the page says which stored run it draws) and the versions they ran on."""
    import datetime

    dated = {"date": datetime.date.today().isoformat(), "versions": versions(), **results}
    return write_json(results_path(name), dated)


def pyplot() -> Any:
    """matplotlib.pyplot on the Agg backend (no display needed), imported only when drawing."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig: Any, out: Path | None, name: str) -> str | None:
    """Save ``fig`` as ``out/name`` (PNG, written atomically) and close it; returns the file
    name, or None."""
    plt = pyplot()
    try:
        if out is None:
            return None
        Path(out).mkdir(parents=True, exist_ok=True)
        png = io.BytesIO()
        fig.savefig(png, format="png", dpi=110, bbox_inches="tight")
        write_atomic(Path(out) / name, png.getvalue())
        return name
    finally:
        plt.close(fig)
