"""Train an induction model from the page and watch it as server-sent events.

``POST /api/live/induction`` starts a seeded run of the live recipe and answers with an event
stream (``text/event-stream``) that lasts as long as the run: ``run`` (its id, knobs and
recipe), then the watched run's events (:mod:`headlab.training.watch`, each as its
``to_dict()``): ``start``, ``step``, ``eval``, ``phase_change`` (once, when first detected),
``verdict``, then ``done``, ``stopped`` or ``error``. The knobs a request may set, and their
ranges, are :data:`headlab.server.live.LIVE_KNOBS`, served by ``GET /api/live`` (``threads``:
"auto" or a count; the ``run`` event says how many the run trains on and why, and ``done`` or
``stopped`` its wall time, steps and a sentence saying both). One
run trains at a time: a second request gets 409 with the running run's id. Closing the stream
(a closed tab, a dropped connection) stops the run; so does ``DELETE /api/live/runs/{id}``.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import asdict
from typing import Any, get_args

from fastapi import APIRouter, HTTPException, Request
from fastapi import Path as PathParam
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import Field, ValidationInfo, field_validator

from headlab.experiments import induction as ind
from headlab.files import finite
from headlab.server.live import AUTO, LIVE_KNOBS, Busy, Knobs, LiveRun, LiveRuns
from headlab.server.schemas import ALWAYS, Strict, json_integer, json_problems
from headlab.training.watch import Event

router = APIRouter(tags=["live"])
RUN_ID = r"^[0-9a-f]{1,32}$"
POLL_SECONDS = 1.0  # how often a quiet stream checks that its client is still there


def _knob(name: str) -> Any:
    """The request field of one knob; the schema states its values (the validator checks)."""
    knob = LIVE_KNOBS[name]
    if knob.choices:
        values: dict[str, Any] = {"enum": [value for value, _ in knob.choices]}
    else:
        values = {"minimum": knob.low, "maximum": knob.high}
    return Field(knob.default, description=knob.help, json_schema_extra=values)


class LiveRequest(Strict):
    """The reader's knobs (:data:`~headlab.server.live.LIVE_KNOBS`); everything else is the
    live recipe (``GET /api/live``)."""

    seed: int = _knob("seed")
    n_layers: int = _knob("n_layers")
    n_heads: int = _knob("n_heads")
    threads: int | str = _knob("threads")

    @field_validator("seed", "n_layers", "n_heads", mode="before")
    @classmethod
    def _json_integers(cls, value: Any) -> Any:
        return json_integer(value)  # true is not 1, "3" is not 3

    @field_validator("threads", mode="before")
    @classmethod
    def _threads(cls, value: Any) -> Any:
        """ "auto" or a count on offer, checked here whatever its JSON type (2.0 is 2; true,
        "2" and 1.5 are refused naming the choices)."""
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        problem = LIVE_KNOBS["threads"].problem(value)
        if problem is not None:
            raise ValueError(f"{problem}, not {json.dumps(value, default=str)}")
        return value

    @field_validator("seed", "n_layers", "n_heads")
    @classmethod
    def _allowed(cls, value: int, info: ValidationInfo) -> int:
        problem = LIVE_KNOBS[str(info.field_name)].problem(value)
        if problem is not None:
            raise ValueError(f"{problem}, not {value}")
        return value


def _runs(request: Request) -> LiveRuns:
    runs: LiveRuns = request.app.state.live
    return runs


@router.get("/live")
def live_status(request: Request) -> dict[str, Any]:
    """The running run's id (or null), the live recipe, the knobs a request may set and what
    "auto" threads would be now (``auto``: threads, why, cores, load)."""
    runs = _runs(request)
    return {
        "running": runs.running(),
        "recipe": asdict(ind.LIVE),
        "knobs": {name: knob.describe() for name, knob in LIVE_KNOBS.items()},
        "max_seconds": runs.max_seconds,
        "auto": runs.threads_now(AUTO).describe(),
    }


class EventStream(StreamingResponse):
    """Server-sent events (the schema documents the live route's answer as this type)."""

    media_type = "text/event-stream"


# every event the stream sends: `run` (this route's), then the watched run's, by their names
EVENT_NAMES = ["run", *(kind.name for kind in get_args(Event))]
EVENTS_DOC = {
    "description": "the run's server-sent events, as they happen: `run`, then `start`, `step`, "
    "`eval`, `phase_change` (once), `verdict`, and one of `done`, `stopped` or `error`",
    "content": {
        "text/event-stream": {
            "schema": {  # OpenAPI 3.1: the schema of each event
                "type": "object",
                "required": ["event", "data"],
                "properties": {
                    "event": {"type": "string", "enum": EVENT_NAMES},
                    "data": {
                        "type": "string",
                        "contentMediaType": "application/json",
                        "description": "the event as a JSON object, its `event` field its name",
                    },
                },
            }
        }
    },
}


@router.post(
    "/live/induction",
    response_model=None,
    response_class=EventStream,
    responses={200: EVENTS_DOC, **json_problems(*ALWAYS, 404, 409)},
)
async def train_live(body: LiveRequest, request: Request) -> StreamingResponse | JSONResponse:
    """Start a run and stream its progress; 409 while another run trains."""
    runs = _runs(request)
    try:
        run = runs.start(Knobs(**body.model_dump()), asyncio.get_running_loop())
    except Busy as busy:
        return JSONResponse(
            status_code=409,
            content={
                "detail": f"busy: run {busy.run_id} is training; one run at a time. Wait for "
                f"it to finish or cancel it with DELETE /api/live/runs/{busy.run_id}",
                "run_id": busy.run_id,
            },
        )
    headers = {"cache-control": "no-cache", "x-accel-buffering": "no"}
    return EventStream(_stream(run, request), headers=headers)


@router.delete("/live/runs/{run_id}")
def cancel_live(request: Request, run_id: str = PathParam(pattern=RUN_ID)) -> dict[str, Any]:
    """Cancel a training run; 404 naming the running run (if any) when ``run_id`` is not it."""
    runs = _runs(request)
    if not runs.cancel(run_id):
        running = runs.running()
        now = f"run {running} is training" if running else "no run is training"
        raise HTTPException(404, f"no run {run_id!r} is training ({now})")
    return {"cancelled": run_id}


async def _stream(run: LiveRun, request: Request) -> AsyncIterator[str]:
    """The run's events as SSE frames; leaving (the client gone) cancels the run."""
    try:
        yield _frame("run", run.describe())
        while True:
            try:
                event = await asyncio.wait_for(run.events.get(), POLL_SECONDS)
            except TimeoutError:
                if await request.is_disconnected():
                    return
                yield ": still training\n\n"  # an SSE comment: keeps the connection honest
                continue
            if event is None:
                return
            yield _frame(event.name, event.to_dict())
    finally:
        run.cancel("the client went away")


def _frame(name: str, data: dict[str, Any]) -> str:
    return f"event: {name}\ndata: {json.dumps(finite(data), default=float)}\n\n"
