"""Widget 2: every head's attention pattern on a text, and each head's scores and label."""

from __future__ import annotations

from typing import Any

import torch
from fastapi import APIRouter, HTTPException, Request, Response

from headlab.server.fastjson import json_response
from headlab.server.schemas import (
    MAX_TOKENS,
    AttentionResponse,
    HeadInfo,
    HeadsResponse,
    TextRequest,
)
from headlab.trace import Trace

router = APIRouter(tags=["heads"])


def default_text() -> str:
    """The built-in probe: a sentence with a repeat (from ``headlab.probes``)."""
    from headlab.probes import REPEAT_SENTENCE

    return REPEAT_SENTENCE


def token_limit(model: Any) -> int:
    """The most tokens one request may run: the model's context, and the server's own cap."""
    max_len = getattr(getattr(model, "config", None), "max_len", MAX_TOKENS)
    return int(min(max_len, MAX_TOKENS))


def encode(request: Request, req: TextRequest) -> tuple[Any, Any, str, list[int], Any]:
    """(model, tokenizer, text, ids, probe): the request's text and its ids (probe None: the
    caller builds one if it needs it), or the repeated-random-tokens probe (a
    :class:`headlab.probes.Probe`) and its first sequence; refuses text over the limit (422)."""
    from headlab import probes

    model, tokenizer = request.app.state.models.get(req.model)
    limit = token_limit(model)
    if req.probe == "random-repeat":
        if req.text is not None:
            raise HTTPException(422, "leave text out with probe 'random-repeat' (or use 'text')")
        probe = probes.random_repeat_probe(tokenizer, model.config.vocab_size, limit)
        return model, tokenizer, " ".join(probe.labels), probe.tokens[0].tolist(), probe
    text = req.text if req.text is not None else default_text()
    if not text.strip():
        raise HTTPException(422, "text is empty; type a sentence (a repeat shows induction heads)")
    ids = list(tokenizer.encode(text))
    if len(ids) > limit:
        raise HTTPException(
            422, f"text is {len(ids)} tokens; model {req.model!r} accepts at most {limit} here"
        )
    if not ids:
        raise HTTPException(422, "text has no tokens for this model's tokenizer")
    return model, tokenizer, text, ids, None


def run_weights(model: Any, ids: list[int]) -> torch.Tensor:
    """Every head's weights on one sequence: (n_layers, h, n, n), float32."""
    trace = Trace(only=("weights",))
    with torch.inference_mode():
        model(torch.tensor([ids], dtype=torch.long), trace=trace)
    n_layers = model.config.n_layers
    return torch.stack([trace[f"blocks.{i}.attn.weights"][0] for i in range(n_layers)]).float()


@router.post("/attention", response_model=AttentionResponse)
def attention(req: TextRequest, request: Request) -> Response:
    """Tokens and per-layer, per-head attention weights of ``model`` on ``text``."""
    model, tokenizer, text, ids, _probe = encode(request, req)
    weights = run_weights(model, ids)  # (L, h, n, n)
    return json_response(
        {
            "model": req.model,
            "text": text,
            "tokens": list(tokenizer.token_strings(ids)),
            "ids": ids,
            "causal": bool(getattr(model.config, "causal", True)),
            "n_layers": weights.shape[0],
            "n_heads": weights.shape[1],
            "weights": weights.numpy().round(4),
            "averaged": weights.mean(dim=1).numpy().round(4),  # (L, n, n)
        }
    )


# The page's head types → the score that picks the best head of that type (headlab.heads).
PAGE_TYPES = {
    "previous-token": "previous",
    "positional": "positional",
    "induction": "induction",
    "content": "content",
}


def best_heads(rows: list[dict[str, Any]], thresholds: dict[str, float]) -> dict[str, Any]:
    """For each page head type, the head with the highest score of that type."""
    best = {}
    for page_type, score_name in PAGE_TYPES.items():
        scored = [row for row in rows if score_name in row["scores"]]
        if scored:
            row = max(scored, key=lambda r: r["scores"][score_name])
            score = row["scores"][score_name]
            best[page_type] = {
                "layer": row["layer"],
                "head": row["head"],
                "score": score,
                "passes_threshold": score >= thresholds.get(score_name, 0.0),
            }
    return best


@router.post("/heads")
def heads_endpoint(req: TextRequest, request: Request) -> HeadsResponse:
    """Every head's scores for each head type and its label (``headlab.heads.score_heads`` on
    the text as a probe), and the best head of each type the page offers."""
    from headlab import heads, probes

    model, tokenizer, text, _ids, probe = encode(request, req)
    if probe is None:
        probe = probes.text_probe(tokenizer, text, token_limit(model))
    report = heads.score_heads(model, probe)  # every sequence of the probe
    rows = [s.to_dict() for s in report.heads]
    return HeadsResponse(
        model=req.model,
        text=text,
        tokens=list(report.tokens),
        heads=[HeadInfo(**row) for row in rows],
        averaged=[HeadInfo(**s.to_dict()) for s in report.averaged],
        best=best_heads(rows, heads.THRESHOLDS),
        thresholds=dict(heads.THRESHOLDS),
    )
