"""The FastAPI application: routers per area, models loaded in the lifespan, the static page.

Run it with ``headlab serve`` (uvicorn). Build one for tests with ``create_app(preload=())`` and use
it through ``fastapi.testclient.TestClient`` inside a ``with`` block, so the lifespan runs.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse
from fastapi.staticfiles import StaticFiles
from starlette.middleware.gzip import GZipMiddleware

from headlab import __version__
from headlab.server import settings
from headlab.server.live import MAX_SECONDS, LiveRuns
from headlab.server.progress import Jobs, Timings
from headlab.server.routes import (
    attention,
    code,
    experiments,
    health,
    live,
    progress,
    shapes,
    switch,
)
from headlab.server.schemas import error_responses
from headlab.server.security import BodyLimit, HeadAsGet, HostCheck, SecurityHeaders
from headlab.server.store import ModelStore, Recent, SingleFlight
from headlab.server.warm import Warmer, available_models

STATIC = Path(__file__).parent / "static"
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1", "[::1]")
# the Host that Starlette's TestClient sends: answered by an app built for tests, never by
# `headlab serve`, which passes the hosts it serves (server/cli.py: allowed_hosts)
TEST_HOSTS = (*LOOPBACK_HOSTS, "testserver")
CIRCUITS_KEPT = 8  # circuits kept for asking again; each new one costs seconds of CPU


def create_app(
    preload: Sequence[str] = ("default",),
    allowed_hosts: Sequence[str] = TEST_HOSTS,
    max_loaded: int = 2,
    live_seconds: float = MAX_SECONDS,
    live_threads: int | None = None,
    warm: Sequence[str] | None = (),
) -> FastAPI:
    """The explainer's app. ``preload`` names models loaded at startup (missing ones are skipped
    and reported by ``/api/models``); at most ``max_loaded`` models stay in memory at once; a
    live training run is stopped after ``live_seconds``; a run whose reader left threads on
    "auto" trains on ``live_threads`` torch threads (default :func:`settings.live_threads`;
    None: chosen per run from the machine's load). ``warm`` names the models whose one-time
    figures (composition scores, the page's random-weights floors) a background thread
    computes and keeps on disk after startup, never holding it back (:mod:`headlab.server.
    warm`); None: every model available here (``headlab serve``); () none (tests)."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        app.state.models = ModelStore(max_loaded=max_loaded)
        app.state.models.preload(preload)
        # each model's syntax table (routes/attention.py), computed once by one request
        app.state.syntax_tables, app.state.syntax_flights = {}, SingleFlight()
        # POST /api/circuit's answers, per (model, seed, ablation): the last few asked
        app.state.circuits = Recent(max_kept=CIRCUITS_KEPT)
        # long requests' progress (GET /api/progress/{id}) and each step's time on this machine
        app.state.jobs, app.state.timings = Jobs(), Timings()
        threads = settings.live_threads() if live_threads is None else live_threads
        app.state.live = LiveRuns(max_seconds=live_seconds, threads=threads)
        # torch's optimizers import torch._dynamo when first built (about 3 s on a 2-core
        # machine): import it at startup, so the first live run starts at once
        import torch._dynamo  # noqa: F401

        # the scores' compiled loops: loaded (compiled, the first time on an install) here,
        # so the first analysis does not wait on them; without Numba the scores' PyTorch
        # definition runs instead
        from headlab.heads import fast

        fast.available()

        names = available_models(app.state.models) if warm is None else list(warm)
        app.state.warm = Warmer(app.state.models, app.state.timings, names)
        app.state.warm.start()
        yield
        app.state.warm.stop()
        app.state.live.shutdown()
        app.state.models.clear()

    app = FastAPI(
        title="headlab",
        version=__version__,
        summary="Multi-head attention you can run, measure and see.",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
    )
    for router, extra in (
        (health.router, ()),
        (shapes.router, ()),
        (attention.router, (404, 503)),
        (switch.router, (404, 503)),
        (experiments.router, (404,)),
        (code.router, (404,)),
        (live.router, (404, 409)),
        (progress.router, ()),
    ):
        app.include_router(router, prefix="/api", responses=error_responses(*extra))
    app.add_exception_handler(RequestValidationError, _readable_422)  # type: ignore[arg-type]
    _add_pages(app)
    # the last added runs first: security headers on every answer, then hosts, HEAD as GET,
    # body size, gzip
    app.add_middleware(GZipMiddleware, minimum_size=4096, compresslevel=1)
    app.add_middleware(
        BodyLimit, limit=settings.max_body_bytes(), timeout=settings.client_timeout()
    )
    app.add_middleware(HeadAsGet)
    app.add_middleware(HostCheck, allowed_hosts=list(allowed_hosts))
    app.add_middleware(SecurityHeaders)
    return app


def _add_pages(app: FastAPI) -> None:
    app.mount("/static", StaticFiles(directory=STATIC), name="static")
    swagger = _swagger_dir()
    if swagger is not None:
        app.mount("/docs-assets", StaticFiles(directory=swagger), name="docs-assets")

    @app.get("/", include_in_schema=False)
    def index() -> FileResponse:
        return FileResponse(STATIC / "index.html", headers={"cache-control": "no-cache"})

    @app.get("/docs", include_in_schema=False)
    def docs() -> HTMLResponse:
        return HTMLResponse(_docs_html(swagger is not None))


def _swagger_dir() -> Path | None:
    """Swagger UI's files from the fastapi-offline package, if installed (no CDN)."""
    try:
        import fastapi_offline
    except ImportError:
        return None
    return Path(fastapi_offline.__file__).parent / "static"


def _docs_html(have_swagger: bool) -> str:
    if not have_swagger:
        return (
            "<!doctype html><title>headlab API</title><h1>headlab API</h1>"
            '<p>The OpenAPI schema is at <a href="/openapi.json">/openapi.json</a>. '
            "Install <code>fastapi-offline</code> for the interactive page.</p>"
        )
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8"><title>headlab API</title>'
        '<link rel="icon" href="data:,"><link rel="stylesheet" href="/docs-assets/swagger-ui.css">'
        "</head><body>"
        '<div id="swagger-ui"></div><script src="/docs-assets/swagger-ui-bundle.js"></script>'
        '<script src="/static/js/docs-init.js"></script></body></html>'
    )


async def _readable_422(request: Request, exc: RequestValidationError) -> JSONResponse:
    """422 with one sentence per problem ("body.d_model: ...") besides Pydantic's details."""
    lines = []
    for err in exc.errors():
        if err.get("type") == "json_invalid":
            lines.append("body is not valid JSON; send a JSON object of the fields in /docs")
            continue
        where = ".".join(str(p) for p in err.get("loc", ()) if p != "body") or "body"
        # a validator's own sentence, without Pydantic's "Value error, " before it
        msg = str(err.get("msg", "invalid")).removeprefix("Value error, ")
        lines.append(f"{where}: {msg}")
    errors = [{k: v for k, v in e.items() if k in ("loc", "msg", "type")} for e in exc.errors()]
    return JSONResponse(status_code=422, content={"detail": "; ".join(lines), "errors": errors})
