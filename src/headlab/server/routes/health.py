"""Health and the list of models a user can pick."""

from __future__ import annotations

from fastapi import APIRouter, Request

from headlab import __version__
from headlab.server.schemas import Health, ModelInfo, ModelSizes

router = APIRouter(tags=["health"])


@router.get("/health")
def health(request: Request) -> Health:
    """The server is up; which models are in memory."""
    return Health(
        status="ok", version=__version__, models_loaded=request.app.state.models.loaded_names()
    )


@router.get("/models")
def models(request: Request) -> list[ModelInfo]:
    """Every model the zoo knows on this machine: available or not, and why not."""
    return [ModelInfo(**row) for row in request.app.state.models.catalogue()]


@router.get("/models/sizes")
def model_sizes(request: Request) -> dict[str, ModelSizes]:
    """Each available model's attention sizes, from its config: d_model, h, h_kv, layers,
    context and biases (the shape calculator offers them as "this model's" presets)."""
    return {name: ModelSizes(**row) for name, row in request.app.state.models.sizes().items()}
