"""The local web explainer: a FastAPI app whose every number comes from the headlab library.

``create_app()`` builds the app (routers per area, Pydantic schemas, models loaded in the lifespan);
``headlab serve`` runs it on uvicorn. The page itself is static HTML, CSS and JavaScript modules in
``static/``, with nothing fetched from outside the machine.
"""

from headlab.server.app import create_app

__all__ = ["create_app"]
