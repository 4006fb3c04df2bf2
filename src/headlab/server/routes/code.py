"""The source of the library functions the page's sections link to, by name (never by path)."""

from __future__ import annotations

import importlib
import inspect
from pathlib import Path

from fastapi import APIRouter, HTTPException

import headlab
from headlab.server.schemas import CodeResponse

router = APIRouter(tags=["code"])
# Only these names can be asked for: the functions the page explains.
LINKED = (
    "headlab.attention.attention",
    "headlab.attention.MultiHeadAttention.forward",
    "headlab.attention.split_heads",
    "headlab.attention.merge_heads",
    "headlab.attention.repeat_kv",
    "headlab.attention.check_config",
    "headlab.attention.KVCache",
    "headlab.shapes.trace_shapes",
    "headlab.heads.previous_token_score",
    "headlab.heads.induction_score",
    "headlab.heads.analyse",
    "headlab.experiments.induction.study",
    "headlab.model.Block",
    "headlab.model.Block.forward",
    "headlab.model.Transformer.forward",
    "headlab.ablation",
)
ROOT = Path(headlab.__file__).parent.parent.parent


def _resolve(name: str) -> object:
    parts = name.split(".")
    for cut in range(len(parts), 1, -1):
        try:
            obj: object = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr)
        return obj
    raise ImportError(name)


@router.get("/code/{name}")
def code(name: str) -> CodeResponse:
    """The source of one linked function or class, with its file and first line."""
    if name not in LINKED:
        raise HTTPException(404, f"{name!r} is not one of the linked names: {', '.join(LINKED)}")
    try:
        obj = _resolve(name)
        lines, first = inspect.getsourcelines(obj)  # type: ignore[arg-type]
        path = Path(inspect.getsourcefile(obj) or "")  # type: ignore[arg-type]
    except (ImportError, AttributeError, OSError, TypeError):
        raise HTTPException(404, f"{name} is not written yet in this version of headlab") from None
    try:
        shown = str(path.resolve().relative_to(ROOT))
    except ValueError:
        shown = path.name
    return CodeResponse(name=name, path=shown, line=max(first, 1), source="".join(lines))
