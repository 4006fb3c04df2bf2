"""The experiments' results shipped with the package (``src/headlab/experiments/results``), and
the live look at one needle in a haystack beside the stored retrieval run."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from fastapi import APIRouter, HTTPException, Request
from fastapi import Path as PathParam

import headlab
from headlab.server.schemas import NAME_PATTERN, NeedleRequest, NeedleResponse

router = APIRouter(tags=["experiments"])
RESULTS = Path(headlab.__file__).parent / "experiments" / "results"
# The experiments the page has a section for, in page order.
PAGE_EXPERIMENTS = ("one-vs-many", "head-count", "induction", "prune", "gqa", "retrieval", "sinks")


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


@router.post("/retrieval/needle", response_model=NeedleResponse)
def needle(req: NeedleRequest, request: Request) -> dict[str, Any]:
    """One needle-in-a-haystack probe run now: the model's answer and the heads whose most
    attended token was the needle's digit being written
    (:func:`headlab.heads.retrieval.live_needle`), on SmolLM2 when installed (the model the
    stored run measured), else on the default model."""
    from headlab.heads.retrieval import live_needle

    name = req.model or _needle_model(request)
    model, tokenizer = request.app.state.models.get(name)
    try:
        found = live_needle(model, tokenizer, req.depth, req.seed)
    except ValueError as exc:
        raise HTTPException(422, str(exc)) from None
    return {"model": name, **found}


def _needle_model(request: Request) -> str:
    """smollm2 when the zoo has it here, else default."""
    offered = {r["name"] for r in request.app.state.models.catalogue() if r["available"]}
    return "smollm2" if "smollm2" in offered else "default"
