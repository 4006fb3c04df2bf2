"""Widget 2: every head's attention pattern on a probe, each head's scores and label.

``POST /api/heads`` answers patterns and scores together from one run of
:func:`headlab.heads.analyse` (the page asks once per run); ``POST /api/attention`` answers the
patterns alone, from the same probe.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, HTTPException, Request, Response

from headlab.server.fastjson import json_response
from headlab.server.progress import Job
from headlab.server.schemas import (
    MAX_TOKENS,
    NEEDLE,
    AttentionResponse,
    CircuitRequest,
    CircuitResponse,
    HeadsRequest,
    HeadsResponse,
    ProbeInfo,
    TextRequest,
    probe_infos,
)
from headlab.server.settings import MAX_WEIGHTS
from headlab.shapes.layout import attention_layout

router = APIRouter(tags=["heads"])


def token_limit(model: Any, runs: int = 1) -> int:
    """The most tokens one request may run on ``model``: :func:`headlab.zoo.token_budget`
    under the server's settings (HEADLAB_MAX_TOKENS, and at most MAX_WEIGHTS weights in an
    answer that holds the patterns of ``runs`` runs)."""
    from headlab.zoo import token_budget

    return token_budget(model.config, MAX_TOKENS, MAX_WEIGHTS // runs)


def load_probe(request: Request, req: TextRequest, runs: int = 1) -> tuple[Any, Any]:
    """``(model, probe)`` for the request: its model from the server's store and the probe
    :func:`headlab.measure.build_probe` makes within :func:`token_limit` (422 with the reason
    for a bad probe or text)."""
    from headlab import measure

    model, tokenizer = request.app.state.models.get(req.model)
    limit = token_limit(model, runs)
    try:
        probe = measure.build_probe(
            req.probe_name(), tokenizer, limit, model.config.vocab_size, req.text
        )
    except ValueError as exc:
        raise HTTPException(422, str(exc)) from None
    return model, probe


@router.get("/probes")
def probes() -> list[ProbeInfo]:
    """The probes the head analysis can run (headlab.measure.PROBES): each one's name, whether
    it reads a text, and what it is (the page offers these)."""
    return probe_infos()


@router.post("/attention", response_model=AttentionResponse)
def attention(req: TextRequest, request: Request) -> Response:
    """Tokens and per-layer, per-head attention weights of ``model`` on the probe."""
    from headlab.heads import averaged_pattern
    from headlab.measure import run_patterns

    model, probe = load_probe(request, req)
    weights = run_patterns(model, probe.tokens[:1])[:, 0]  # (L, h, n, n)
    return json_response(
        {
            "model": req.model,
            "text": probe.text or " ".join(probe.labels),
            "tokens": probe.labels,
            "ids": probe.tokens[0].tolist(),
            "causal": bool(getattr(model.config, "causal", True)),
            "n_layers": weights.shape[0],
            "n_heads": weights.shape[1],
            **attention_layout(model.config),  # n_kv_heads, kv_group, window, layer_kinds
            "weights": weights.numpy().round(4),
            "averaged": averaged_pattern(weights).numpy().round(4),  # (L, n, n)
        }
    )


@router.post("/heads", response_model=HeadsResponse)
def heads_endpoint(req: HeadsRequest, request: Request) -> Response:
    """Every head's pattern, scores and label, each layer's averaged head, the best head of
    each type the page offers and each layer's sink share: :func:`headlab.heads.baselines.
    label_heads` on the probe (each label above its random-weights floor unless ``floors`` is
    false), in one answer; with ``syntax`` also the syntactic heads (:mod:`headlab.heads.syntax`)
    and, for a text, its parse and each head's top link per word: the syntactic score is shown
    beside the others and takes part in the labels only with ``syntax_labels``; with
    ``evidence`` each label's evidence (:func:`headlab.heads.evidence.evidence`). With
    ``progress_id``, ``GET /api/progress/{id}`` says how far it has got meanwhile; each step's
    time is kept for the next request's expected time (:mod:`headlab.server.progress`)."""
    job = request.app.state.jobs.start(req.progress_id, req.model)
    try:
        body, config = _heads_answer(req, request, job)
    except HTTPException as exc:
        job.finish(failed=str(exc.detail))
        raise
    except BaseException:
        job.finish(failed="the server failed to answer")
        raise
    job.finish()
    request.app.state.timings.record(req.model, config, job.measured())
    return json_response(body)


def _heads_answer(req: HeadsRequest, request: Request, job: Job) -> tuple[dict[str, Any], Any]:
    """/api/heads's answer and the model's config, each step reported to ``job``."""
    from headlab.heads.baselines import FloorsDoNotFit

    if req.model not in request.app.state.models.loaded_names():
        job.step("model", 0, 1)
    model, probe, retrieval, needles = heads_probe(request, req, job)
    found = None
    if req.wants_syntax():
        if req.model not in request.app.state.syntax_tables:
            job.step("syntax", 0, 1)
        found = syntax_table(request, req.model)
    margins = found["report"].margins() if found and found.get("report") else None
    ruled = req.syntax_labels and margins is not None
    extra: dict[str, Any] = {"needles": needles} if needles else {}
    plan_job(request, req, job, model, probe)
    try:
        report = _labelled(req, model, probe, margins, ruled, retrieval, extra, job)
    except FloorsDoNotFit as exc:
        way_out = (
            'leave out "evidence": true (evidence needs the floors)'
            if req.evidence
            else 'send "floors": false (the labels then say they are unchecked against chance)'
        )
        raise HTTPException(422, f"{exc.sizes()}: {way_out}") from None
    body = {**report.to_dict(patterns=True), "syntax_labels": ruled, **extra}
    if found is not None:
        body["syntax"] = syntax_body(request, req.model, found, probe, report.patterns)
    answer = {
        "model": req.model,
        "text": probe.text or " ".join(probe.labels),
        "causal": bool(getattr(model.config, "causal", True)),
        "n_layers": int(model.config.n_layers),
        "n_heads": int(model.config.n_heads),
        **attention_layout(model.config),  # kv_group, window, layer_kinds
        **body,
    }
    return answer, model.config


def plan_job(request: Request, req: HeadsRequest, job: Job, model: Any, probe: Any) -> None:
    """Give ``job`` the steps /api/heads will run on ``probe`` and their expected times: the
    random-weights floors and the composition scores take none where they are cached (warmed
    when the server started: :mod:`headlab.server.warm`)."""
    from headlab.heads.baselines import floors_cached
    from headlab.heads.composition import composition_cached
    from headlab.server.progress import plan_steps

    names = ["floors", "scores"] if req.floors else ["scores"]
    if req.evidence:
        names = ["shuffled", "floors", "scores", "composition"]
        names += ["ablation"] if model.config.causal else []
    cached = {"floors"} if "floors" in names and floors_cached(model, probe) else set()
    if req.evidence and composition_cached(model):
        cached.add("composition")
    kept = request.app.state.timings.read(req.model, model.config)
    steps, note = plan_steps(names, cached, kept, model, probe.n)
    job.plan(steps, probe.n, note)


def _labelled(
    req: HeadsRequest,
    model: Any,
    probe: Any,
    margins: Any,
    ruled: bool,
    retrieval: Any,
    extra: dict[str, Any],
    job: Job,
) -> Any:
    """The labelled report /api/heads answers with; with ``evidence`` each label's evidence
    goes into ``extra``."""
    from headlab.heads.baselines import BASELINE_SEEDS, label_heads

    if not req.evidence:
        L, S = model.config.n_layers, len(BASELINE_SEEDS)

        def counted(done: int, total: int) -> None:
            # label_heads counts the random models' layers first (none when the floors are
            # cached), then the model's own
            floors = total - L
            if floors > 0 and done <= floors:
                job.step("floors", done // L, S)
            else:
                job.step("scores", done - floors, L)

        job.step("floors" if req.floors else "scores", 0, S if req.floors else L)
        return label_heads(
            model,
            probe,
            syntactic=margins,
            label_syntactic=ruled,
            floors=req.floors,
            retrieval=retrieval,
            progress=counted,
        )
    # labels then need their margins over random weights too
    from headlab.heads.evidence import evidence

    L, h = model.config.n_layers, model.config.n_heads
    for l, i in req.exact if isinstance(req.exact, list) else []:
        if not (0 <= l < L and 0 <= i < h):
            raise HTTPException(
                422,
                f"exact: head [{l}, {i}] is not in this model's "
                f"layers 0..{L - 1} and heads 0..{h - 1}",
            )
    backed = evidence(
        model,
        probe,
        keep=None,
        syntactic=margins,
        label_syntactic=ruled,
        exact=req.exact,
        progress=job.step,
    )
    extra["evidence"] = backed.to_dict()
    return backed.report


def heads_probe(
    request: Request, req: HeadsRequest, job: Job | None = None
) -> tuple[Any, Any, Any, list[dict]]:
    """``(model, probe, retrieval scores, needles)`` for /api/heads: with probe "needle" the
    needle-in-a-haystack probes, sized to the server's token budget, and each head's retrieval
    score and each needle's answer (:func:`headlab.heads.retrieval.needle_analysis`, as
    ``headlab heads --probe needle``); else :func:`load_probe`'s, None and []."""
    if req.probe != NEEDLE:
        return (*load_probe(request, req), None, [])
    from headlab.heads.retrieval import DIGITS, needle_analysis

    if req.text is not None:
        raise HTTPException(
            422, "probe 'needle' takes no text; leave the text out or use probe 'text'"
        )
    model, tokenizer = request.app.state.models.get(req.model)
    if job is not None:
        job.step("needles", 0, 1)
    # the needles' context fits the token budget, with room for the answer as the CLI leaves it
    positions = min(model.config.max_len, token_limit(model) + 2 * DIGITS)
    try:
        probe, retrieval, needles = needle_analysis(model, tokenizer, seed=0, max_len=positions)
    except ValueError as exc:
        raise HTTPException(422, str(exc)) from None
    return model, probe, retrieval, needles


CIRCUIT_PROBE = "random-repeat"  # the circuit's probe, named in its answer: the page says so


@router.post("/circuit", response_model=CircuitResponse)
def circuit_endpoint(req: CircuitRequest, request: Request) -> dict[str, Any]:
    """The induction circuit of ``model`` on repeated random tokens, as ``headlab circuit
    --json`` answers it (:func:`headlab.heads.circuit.induction_circuit`); the last few kept
    per model, seed and ablation, since the answer is the same each time and takes seconds."""
    from headlab.heads.baselines import FloorsDoNotFit
    from headlab.heads.circuit import NEEDS_FLOORS, induction_circuit
    from headlab.measure import build_probe

    def compute() -> dict[str, Any]:
        model, tokenizer = request.app.state.models.get(req.model)
        c = model.config
        try:
            probe = build_probe(CIRCUIT_PROBE, tokenizer, c.max_len, c.vocab_size, seed=req.seed)
            found = induction_circuit(model, probe, req.ablation)
        except FloorsDoNotFit as exc:
            raise HTTPException(422, f"{exc.sizes()}: {NEEDS_FLOORS}") from None
        except ValueError as exc:
            raise HTTPException(422, str(exc)) from None
        return {"model": req.model, "probe": CIRCUIT_PROBE, **found.to_dict()}

    circuit: dict[str, Any] = request.app.state.circuits.get(
        (req.model, req.seed, req.ablation), compute
    )
    return circuit


def syntax_table(request: Request, name: str) -> dict[str, Any]:
    """The model's syntactic heads on the evaluation text, computed once per model and kept:
    ``{"report", "nlp"}``, or ``{"note"}`` saying why they are unavailable. The table takes
    about 30 s for SmolLM2: requests that ask while it is computed wait for that one result
    (three at once each computed it, 80 s apiece)."""
    from headlab.heads import syntax

    state = request.app.state
    found: dict[str, Any] | None = state.syntax_tables.get(name)
    if found is not None:
        return found
    try:
        table: dict[str, Any] = state.syntax_flights.run(
            name, lambda: _compute_syntax_table(request, name)
        )
    except syntax.ParserUnavailable as exc:
        return {"note": str(exc)}
    return table


def _compute_syntax_table(request: Request, name: str) -> dict[str, Any]:
    """Compute and keep the table of :func:`syntax_table` (unless it was kept just now)."""
    from headlab.heads import syntax

    tables: dict[str, dict[str, Any]] = request.app.state.syntax_tables
    if name in tables:
        return tables[name]
    nlp = syntax.load_parser()
    model, tokenizer = request.app.state.models.get(name)
    sentences = syntax.parse_sentences(nlp, syntax.evaluation_text())
    tables[name] = {"nlp": nlp, "report": syntax.analyse_syntax(model, tokenizer, sentences, name)}
    return tables[name]


def syntax_body(request: Request, name: str, found: dict, probe: Any, patterns: Any) -> dict:
    """The answer's ``syntax`` field: the table, and the probe text's parse and top links."""
    from headlab.heads import syntax

    if "report" not in found:
        return {"available": False, "note": found["note"], "relations": []}
    relations = [{**r, "meaning": syntax.meaning(r["relation"])} for r in found["report"].best()]
    body = {"available": True, "relations": relations, "note": ""}
    if not probe.text:
        body["note"] = "repeated random tokens are no sentence: there is nothing to parse"
        return body
    _, tokenizer = request.app.state.models.get(name)
    body.update(syntax.text_view(found["nlp"], tokenizer, probe.text, patterns))
    return body
