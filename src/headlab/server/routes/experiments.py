"""The experiments' results shipped with the package (``src/headlab/experiments/results``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from fastapi import APIRouter, HTTPException
from fastapi import Path as PathParam

import headlab
from headlab.server.schemas import NAME_PATTERN

router = APIRouter(tags=["experiments"])
RESULTS = Path(headlab.__file__).parent / "experiments" / "results"
# The experiments the page has a section for, in page order.
PAGE_EXPERIMENTS = ("one-vs-many", "head-count", "induction", "prune", "gqa")


def shipped() -> dict[str, Path]:
    """Name → results file, for every results JSON shipped in the package.

    Names are the command's (``one-vs-many``), whether the file says ``one_vs_many`` or not.
    """
    if not RESULTS.is_dir():
        return {}
    return {p.stem.replace("_", "-"): p for p in sorted(RESULTS.glob("*.json"))}


@router.get("/experiments")
def list_experiments() -> dict[str, Any]:
    """Which experiments have shipped results, and which the page expects but are not there yet."""
    have = shipped()
    return {
        "available": sorted(have),
        "missing": [name for name in PAGE_EXPERIMENTS if name not in have],
        "regenerate": "headlab experiment NAME --ship",
    }


@router.get("/experiments/{name}")
def experiment(name: str = PathParam(pattern=NAME_PATTERN)) -> dict[str, Any]:
    """The results JSON of one experiment, as its run wrote it."""
    have = shipped()
    if name not in have:
        raise HTTPException(
            404,
            f"no shipped results for experiment {name!r}; available: "
            f"{', '.join(sorted(have)) or 'none yet'}",
        )
    data: dict[str, Any] = json.loads(have[name].read_text())
    return data
