"""The GET answers a static copy of the page stores: every route the page reads, answered once
by the real app (the default model only), for :func:`headlab.site.build`, which the command
line hands them to (the site builder sits below the server and never imports it)."""

from __future__ import annotations

from typing import Any

# the GET routes the page reads, answered once at build time by the real app
GET_ROUTES = (
    "health",
    "models",
    "models/sizes",
    "probes",
    "shapes/presets",
    "shapes/limits",
    "experiments",
    "live",
)


def page_answers() -> dict[str, Any]:
    """Every GET answer the page reads, as the file the site stores it in → its JSON:
    ``api/<route>.json`` for each route (:data:`GET_ROUTES`, each shipped experiment, each
    linked piece of code) and ``openapi.json``, the schema the page reads its input limits
    from, at the site's root as on the server."""
    from fastapi.testclient import TestClient

    from headlab.server.app import create_app
    from headlab.server.routes.code import linked
    from headlab.server.routes.experiments import shipped

    routes = [*GET_ROUTES, *(f"experiments/{name}" for name in shipped())]
    routes += [f"code/{name}" for name in linked()]
    answers: dict[str, Any] = {}
    with TestClient(create_app(preload=("default",))) as client:
        for route in routes:
            response = client.get(f"/api/{route}")
            response.raise_for_status()
            answers[f"api/{route}.json"] = response.json()
        answers["openapi.json"] = client.get("/openapi.json").json()
    return answers
