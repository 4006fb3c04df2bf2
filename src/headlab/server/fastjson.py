"""JSON answers encoded by orjson straight from NumPy arrays and plain data.

The attention weights are (layers · h · n²) floats; encoding them through FastAPI's generic
encoder takes longer than running the model, so the large answers are built here instead.
"""

from __future__ import annotations

from typing import Any

import orjson
from fastapi import Response

OPTIONS = orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS


def json_response(data: Any, status_code: int = 200) -> Response:
    """A JSON response of ``data`` (dicts, lists, numbers and NumPy arrays)."""
    return Response(orjson.dumps(data, option=OPTIONS), status_code, media_type="application/json")
