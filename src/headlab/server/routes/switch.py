"""Switch heads off and watch: ``POST /api/switch-off`` runs a probe intact and with a set of
heads switched off together (:func:`headlab.heads.switch.switch_off`), as ``headlab heads --off
… --json`` prints it."""

from __future__ import annotations

from fastapi import APIRouter, HTTPException, Request, Response

from headlab.server.fastjson import json_response
from headlab.server.routes.attention import load_probe
from headlab.server.schemas import SWITCH_RUNS, SwitchOffRequest, SwitchOffResponse
from headlab.shapes.layout import attention_layout

router = APIRouter(tags=["heads"])


@router.post("/switch-off", response_model=SwitchOffResponse)
def switch_off_endpoint(req: SwitchOffRequest, request: Request) -> Response:
    """The probe's next-token predictions, losses, induction scores and every head's pattern,
    intact and with the heads of ``off`` switched off (422 naming a head the model lacks, or a
    model that predicts no next token)."""
    from headlab.heads.switch import switch_off

    model, probe = load_probe(request, req, SWITCH_RUNS)  # both runs' patterns within the cap
    _, tokenizer = request.app.state.models.get(req.model)
    try:
        result = switch_off(model, probe, req.off, req.mode)
    except ValueError as exc:
        raise HTTPException(422, str(exc)) from None
    return json_response(
        {
            "model": req.model,
            "probe": probe.name,
            "text": probe.text or " ".join(probe.labels),
            "tokens": probe.labels,
            "ids": probe.tokens[0].tolist(),
            "causal": bool(model.config.causal),
            "n_layers": int(model.config.n_layers),
            "n_heads": int(model.config.n_heads),
            **attention_layout(model.config),
            **result.to_dict(tokenizer.token_strings),
        }
    )
