"""Widget 1: every tensor's shape, the parameters, FLOPs and KV cache of one layer."""

from __future__ import annotations

import functools
from dataclasses import asdict
from typing import Any

import orjson
from fastapi import APIRouter, Response

from headlab.server.fastjson import OPTIONS
from headlab.server.schemas import ShapeLimits, ShapesRequest, shape_limits

router = APIRouter(tags=["shapes"])


@router.post("/shapes", response_model=dict[str, Any])
def shapes(req: ShapesRequest) -> Response:
    """The ShapeReport of ``headlab.shapes.trace_shapes`` for this configuration.

    An invalid configuration (h not dividing d_model, h_kv not dividing h, sizes too large) is
    answered with ``valid: false`` and its ``problems``, plus the head counts that would be valid.
    """
    # A plain def: FastAPI runs it in a worker thread. A warm trace takes about a millisecond,
    # but the first one (torch's meta kernels warming up) took 1.4 s, which on the event loop
    # held every other request back.
    key = tuple(sorted(req.model_dump().items()))
    return Response(_report_json(key), media_type="application/json")


@functools.lru_cache(maxsize=256)
def _report_json(key: tuple[tuple[str, Any], ...]) -> bytes:
    """The encoded report and the head counts that would be valid (the widget's choices); the
    widget asks for the same few sizes again and again as one types."""
    from headlab.shapes import trace_shapes

    report = trace_shapes(**dict(key))
    return orjson.dumps({**report.to_dict(), **report.config.head_counts()}, option=OPTIONS)


@router.get("/shapes/presets")
def presets() -> dict[str, Any]:
    """The published configurations (Transformer base, BERT, GPT-2, Llama, ...): each
    :class:`headlab.shapes.Preset`'s fields, by name."""
    from headlab.shapes import PRESETS

    return {name: asdict(preset) for name, preset in PRESETS.items()}


@router.get("/shapes/limits")
def limits() -> ShapeLimits:
    """The least and most of each size POST /api/shapes takes, and its dtypes (the page's form
    offers these)."""
    return shape_limits()
