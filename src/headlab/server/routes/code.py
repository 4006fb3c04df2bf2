"""The source of the library functions the page's sections link to, by name (never by path)."""

from __future__ import annotations

import inspect
from pathlib import Path

from fastapi import APIRouter, HTTPException

import headlab
from headlab.server.schemas import CodeResponse

router = APIRouter(tags=["code"])
ROOT = Path(headlab.__file__).parent.parent.parent


def linked() -> dict[str, object]:
    """The only names that can be asked for (the functions the page explains), each mapped to
    what it names, imported plainly when the route is asked."""
    from headlab import ablation
    from headlab.attention import (
        KVCache,
        MultiHeadAttention,
        attention,
        check_config,
        merge_heads,
        repeat_kv,
        split_heads,
    )
    from headlab.experiments.induction import study
    from headlab.heads import analyse, induction_mul_score, induction_score, offset_mass
    from headlab.model import Block, Transformer
    from headlab.shapes import trace_shapes

    return {
        "headlab.attention.attention": attention,
        "headlab.attention.MultiHeadAttention.forward": MultiHeadAttention.forward,
        "headlab.attention.split_heads": split_heads,
        "headlab.attention.merge_heads": merge_heads,
        "headlab.attention.repeat_kv": repeat_kv,
        "headlab.attention.check_config": check_config,
        "headlab.attention.KVCache": KVCache,
        "headlab.shapes.trace_shapes": trace_shapes,
        "headlab.heads.offset_mass": offset_mass,
        "headlab.heads.induction_score": induction_score,
        "headlab.heads.induction_mul_score": induction_mul_score,
        "headlab.heads.analyse": analyse,
        "headlab.experiments.induction.study": study,
        "headlab.model.Block": Block,
        "headlab.model.Block.forward": Block.forward,
        "headlab.model.Transformer.forward": Transformer.forward,
        "headlab.ablation": ablation,
    }


@router.get("/code/{name}")
def code(name: str) -> CodeResponse:
    """The source of one linked function or class, with its file and first line."""
    names = linked()
    if name not in names:
        raise HTTPException(404, f"{name!r} is not one of the linked names: {', '.join(names)}")
    try:
        obj = names[name]
        lines, first = inspect.getsourcelines(obj)  # type: ignore[arg-type]
        path = Path(inspect.getsourcefile(obj) or "")  # type: ignore[arg-type]
    except (OSError, TypeError):
        raise HTTPException(404, f"{name} is not written yet in this version of headlab") from None
    try:
        shown = str(path.resolve().relative_to(ROOT))
    except ValueError:
        shown = path.name
    return CodeResponse(name=name, path=shown, line=max(first, 1), source="".join(lines))
