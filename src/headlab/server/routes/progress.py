"""How far a long request has got: ``GET /api/progress/{id}`` (:mod:`headlab.server.progress`)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi import Path as PathParam

from headlab.server.schemas import PROGRESS_ID, ProgressResponse

router = APIRouter(tags=["progress"])


@router.get("/progress/{job_id}", response_model=ProgressResponse)
def progress(request: Request, job_id: str = PathParam(pattern=PROGRESS_ID)) -> dict[str, Any]:
    """The steps of the request that sent ``progress_id`` ``job_id``: each with its expected
    seconds and where they come from, the step under way and how far, the seconds so far.
    Before that request has started here (the page asks as it sends it), and after the 64 most
    recent, the state is "waiting" and no step is known."""
    found: dict[str, Any] = request.app.state.jobs.answer(job_id)
    return found
