"""The experiments' figures for the site, drawn by each experiment's own figure code from its
shipped results file (src/headlab/experiments/results/NAME.json), never copied in.

``draw_all()`` returns ``{"results/figures/NAME-FIGURE.png": png bytes}``. The induction
experiment's pattern figure needs the trained model, which the results file does not hold; its
loss and score figures are drawn.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from headlab.experiments import results_path

Draw = Callable[[dict[str, Any], Path], Any]


def drawers() -> dict[str, list[Draw]]:
    """Each experiment's figure functions (imported here: they bring torch and matplotlib)."""
    from headlab.experiments import gqa, head_count, induction_figures, one_vs_many, prune

    return {
        "induction": [induction_figures._loss_figure, induction_figures._scores_figure],
        "one-vs-many": [one_vs_many._figures],
        "head-count": [head_count._figure],
        "prune": [prune._figure],
        "gqa": [gqa._figures],
    }


def draw_all() -> dict[str, bytes]:
    """Every figure, drawn into a temporary folder and read back."""
    out: dict[str, bytes] = {}
    for name, draws in drawers().items():
        results = json.loads(results_path(name).read_text(encoding="utf-8"))
        with tempfile.TemporaryDirectory() as tmp:
            for draw in draws:
                draw(results, Path(tmp))
            for png in sorted(Path(tmp).glob("*.png")):
                out[f"results/figures/{name}-{png.name}"] = png.read_bytes()
    return out
