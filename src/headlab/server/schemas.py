"""Pydantic schemas of the API: what each endpoint accepts and answers.

Every size a request can set is bounded, so no request can make the server allocate without limit;
model and experiment names are plain identifiers, never file paths.
"""

from __future__ import annotations

import functools
import json
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, field_validator, model_validator

from headlab.measure import PROBE_INFO, PROBES
from headlab.server import settings
from headlab.shapes import DTYPE_NAMES, DTYPES, LIMITS
from headlab.shapes.statement import REQUEST_DEFAULTS

# A name is a short identifier (letters, digits, - _ .), never a path: no "/" or "..".
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}$"
PROGRESS_ID = r"^[0-9a-f]{8,32}$"  # a request's progress id: the page makes one up per run
# Settings (headlab.server.settings): HEADLAB_MAX_TEXT_CHARS, HEADLAB_MAX_TOKENS. Above 128
# tokens the per-head weights (layers · h · n²) stop being a page-sized answer.
MAX_TEXT_CHARS = settings.max_text_chars()
MAX_TOKENS = settings.max_tokens()


# What each probe of headlab.measure.PROBES (the one vocabulary of probe names) runs, in words the
# page shows, and whether it reads the request's text (headlab.measure.build_probe enforces that).
# /api/heads also takes "needle", as `headlab heads --probe needle` does: needle-in-a-haystack
# probes whose answers give each head a retrieval score (headlab.heads.retrieval.needle_analysis),
# the one probe whose labels include "retrieval"; it yields no single sequence for /api/attention.
NEEDLE = "needle"
HEAD_PROBE_INFO: dict[str, tuple[bool, str]] = {
    **PROBE_INFO,
    NEEDLE: (
        False,
        "needle in a haystack (a secret number hidden in Hamlet at five depths, "
        "the model asked for it: Wu et al. 2024's retrieval heads; /api/heads only)",
    ),
}
HEAD_PROBES = tuple(HEAD_PROBE_INFO)
if TYPE_CHECKING:
    ProbeName = str
    HeadProbeName = str
    Dtype = str
else:  # the one vocabulary of each, so the schema lists them as an enum
    ProbeName = Literal[PROBES]  # headlab.measure.PROBES
    HeadProbeName = Literal[HEAD_PROBES]  # those and "needle"
    Dtype = Literal[tuple(DTYPES)]  # headlab.shapes.DTYPES, aliases included


class Strict(BaseModel):
    """A request body: unknown fields are refused."""

    model_config = ConfigDict(extra="forbid")


def json_integer(value: Any) -> Any:
    # lax parsing would read true as 1 and "8" as 8; a JSON integer (8 or 8.0) is what is meant
    if isinstance(value, bool | str):
        raise ValueError(f"should be a JSON number, not {json.dumps(value)}")
    return value


class ErrorItem(BaseModel):
    loc: list[str | int] = Field(description="where the problem is, e.g. ['body', 'd_model']")
    msg: str
    type: str


class Problem(BaseModel):
    """Every error answer: one readable sentence, and for a 422 the problems one by one."""

    detail: str = Field(description="what is wrong and what would be valid")
    errors: list[ErrorItem] = Field(default_factory=list)


# the error answers of the API, for the OpenAPI schema: every route may give 400, 408, 413, 422
ERROR_DESCRIPTIONS = {
    400: "a missing, repeated or foreign Host header",
    404: "no such name (an experiment, a code link, a run, or a model not offered here); "
    "`detail` lists the valid ones",
    408: "the request's body did not arrive within the server's client timeout",
    409: "another live training run is in progress; `detail` says which",
    413: "a request body over the server's limit (64 KiB by default)",
    422: "an invalid request; `detail` says what is wrong and what would be valid",
    503: "the model could not be loaded",
}


ALWAYS = (400, 408, 413, 422)  # the statuses the middleware may answer any request with


def error_responses(*extra: int) -> dict[int | str, dict[str, Any]]:
    """The ``responses`` of a router: 400, 408, 413, 422 and the ``extra`` statuses, as
    Problems."""
    return {
        code: {"model": Problem, "description": ERROR_DESCRIPTIONS[code]}
        for code in sorted({*ALWAYS, *extra})
    }


def json_problems(*codes: int) -> dict[int | str, dict[str, Any]]:
    """The error answers of a route whose own answer is not JSON (the live event stream): each a
    Problem in ``application/json``, spelled out, since a ``model`` would be documented in the
    route's own media type."""
    problem = {"application/json": {"schema": {"$ref": "#/components/schemas/Problem"}}}
    return {code: {"description": ERROR_DESCRIPTIONS[code], "content": problem} for code in codes}


class Health(BaseModel):
    status: Literal["ok"]
    version: str
    models_loaded: list[str]


class ModelInfo(BaseModel):
    name: str
    available: bool
    description: str = ""
    reason: str = ""
    loaded: bool = False


class ModelSizes(BaseModel):
    """One model's attention sizes, read from its config (the shape calculator's presets)."""

    d_model: int
    n_heads: int
    n_kv_heads: int | None = Field(description="null: one per query head (MHA)")
    n_layers: int
    context: int = Field(description="the longest input the model takes")
    bias: bool
    d_k: int | None = Field(None, description="each head's width; null: d_model / h")
    window: int | None = Field(None, description="keys a local layer's query sees; null: all")
    local_layers: list[int] = Field(
        [], description="the layers with that window (the others are global)"
    )


def _lo(name: str) -> int:
    return LIMITS[name][0]


def _hi(name: str) -> int:
    return LIMITS[name][1]


def _size(name: str, description: str) -> Any:
    """A size of a shape request: its limits and its value when left out are the shape
    statement's (headlab.shapes.statement, which the static site reads too; which sizes may be
    null is the statement's as well, and a test holds this schema to it)."""
    return Field(REQUEST_DEFAULTS[name], ge=_lo(name), le=_hi(name), description=description)


class ShapesRequest(Strict):
    """The arguments of ``headlab.shapes.trace_shapes``; shapes are traced on the meta device."""

    d_model: int = _size("d_model", "model width")
    n_heads: int = _size("n_heads", "query heads h")
    seq_len: int = _size("seq_len", "tokens n")
    batch: int = _size("batch", "batch B")
    n_kv_heads: int | None = _size("n_kv_heads", "key/value heads h_kv")
    bias: StrictBool = REQUEST_DEFAULTS["bias"]
    dtype: Dtype = REQUEST_DEFAULTS["dtype"]
    cache_len: int = _size("cache_len", "positions already in the KV cache")
    d_k: int | None = _size("d_k", "each head's width; null: d_model / h")

    @field_validator(
        "d_model", "n_heads", "seq_len", "batch", "n_kv_heads", "cache_len", "d_k", mode="before"
    )
    @classmethod
    def _json_integers(cls, value: Any) -> Any:
        return json_integer(value)


class ShapeLimits(BaseModel):
    """What the shape calculator may be asked (POST /api/shapes), for the page's form."""

    sizes: dict[str, list[int]] = Field(description="each size's [least, most]")
    dtypes: list[str] = Field(description="one name per dtype (bf16, fp16, … are also taken)")


def shape_limits() -> ShapeLimits:
    """The calculator's sizes and dtypes, from :data:`headlab.shapes.LIMITS` and DTYPE_NAMES."""
    return ShapeLimits(sizes={k: list(v) for k, v in LIMITS.items()}, dtypes=list(DTYPE_NAMES))


def _probes(takes_text: bool, names: tuple[str, ...] = PROBES) -> list[str]:
    return [name for name in names if HEAD_PROBE_INFO[name][0] == takes_text]


def _probe_is(names: list[str]) -> dict[str, Any]:
    return {"properties": {"probe": {"enum": names}}, "required": ["probe"]}


class ProbeInfo(BaseModel):
    """A probe the head analysis can run (``probe`` of /api/heads and /api/attention)."""

    name: str = Field(description="a name of headlab.measure.PROBES, or 'needle' (/api/heads only)")
    takes_text: bool = Field(description="true: the request must carry a text; false: none")
    description: str


def probe_infos() -> list[ProbeInfo]:
    """Every probe /api/heads takes: :data:`headlab.measure.PROBES` in order, then "needle"."""
    return [
        ProbeInfo(name=n, takes_text=HEAD_PROBE_INFO[n][0], description=HEAD_PROBE_INFO[n][1])
        for n in HEAD_PROBES
    ]


def _text_rules(names: tuple[str, ...], *more: dict[str, Any]) -> ConfigDict:
    """A request's config: unknown fields refused, and the schema saying what the probes of
    ``names`` enforce (headlab.measure.build_probe): one that reads no text takes none, one that
    reads a text needs it; then the ``more`` rules across fields."""
    return ConfigDict(
        extra="forbid",
        json_schema_extra={
            "allOf": [
                {
                    "if": _probe_is(_probes(False, names)),
                    "then": {"properties": {"text": {"type": "null"}}},
                },
                {
                    "if": _probe_is(_probes(True, names)),
                    "then": {"required": ["text"], "properties": {"text": {"type": "string"}}},
                },
                *more,
            ]
        },
    )


def token_limits(runs: int = 1) -> dict[str, int]:
    """The most tokens a text may have on each model this machine offers (a model's context,
    the server's HEADLAB_MAX_TOKENS, and room for every head's weights in ``runs`` runs of it:
    headlab.zoo.token_budget, as the routes apply it), by model name."""
    from headlab import zoo

    limits = {}
    for info in zoo.list_models():
        try:
            config = zoo.model_config(info.name) if info.available else None
        except (ValueError, OSError, ImportError):
            config = None  # a config that cannot be read: the model is refused when asked
        if config is not None:
            limits[info.name] = zoo.token_budget(config, MAX_TOKENS, settings.MAX_WEIGHTS // runs)
    return limits


def _state_token_limits(schema: dict[str, Any], runs: int = 1) -> None:
    """The text's schema: ``x-max-tokens``, each model's :func:`token_limits`, also in words (a
    JSON schema counts characters, not tokens, so the numbers are stated beside ``maxLength``)."""
    limits = token_limits(runs)
    schema["x-max-tokens"] = limits
    said = ", ".join(f"{name} {n}" for name, n in limits.items())
    both = f"; the answer holds the patterns of {runs} runs" if runs > 1 else ""
    schema["description"] += f" (x-max-tokens, by model{both}: {said})"


def text_field(runs: int = 1) -> Any:
    """A request's ``text``, its token limit stated for an answer holding ``runs`` runs'
    patterns (:func:`token_limits`)."""
    return Field(
        None,
        min_length=1,
        max_length=MAX_TEXT_CHARS,
        description="text to run; omitted = the built-in sentence with a repeat. At most the "
        "model's token limit as its tokenizer splits the text, the start token included",
        json_schema_extra=functools.partial(_state_token_limits, runs=runs),
    )


EXACT_NEEDS_EVIDENCE = (
    'exact picks the heads that evidence ablates exactly: add "evidence": true or leave exact out'
)
EVIDENCE_NEEDS_FLOORS = (
    "floors: evidence checks every label against its random-weights floor; leave out "
    '"floors": false or "evidence": true'
)
EVIDENCE_NOT_ON_NEEDLES = (
    "evidence backs the pattern probes' labels; the needle probe's are tested by masking "
    '(`headlab experiment retrieval`): leave out "evidence": true or pick another probe'
)
# the same rules as JSON schema (HeadsRequest checks them): exact only with evidence, and
# evidence only with the floors and a pattern probe
_EVIDENCE = {"properties": {"evidence": {"const": True}}, "required": ["evidence"]}
_EXACT = {"properties": {"exact": {"not": {"type": "null"}}}, "required": ["exact"]}
_WITH_EVIDENCE = {"floors": {"const": True}, "probe": {"not": {"const": NEEDLE}}}
EVIDENCE_RULES = (
    {"if": _EXACT, "then": _EVIDENCE},
    {"if": _EVIDENCE, "then": {"properties": _WITH_EVIDENCE}},
)


def _probe_help(names: tuple[str, ...]) -> str:
    return "; ".join(f"'{n}': {HEAD_PROBE_INFO[n][1]}" for n in names) + (
        ". Omitted: the first of these that fits, 'text' when a text is given, else 'repeat' "
        "(headlab.measure.build_probe, the names `headlab heads --probe` takes; GET /api/probes "
        "lists them)"
    )


class TextRequest(Strict):
    model_config = _text_rules(PROBES)

    model: str = Field("default", pattern=NAME_PATTERN, description="a name from /api/models")
    text: str | None = text_field()
    probe: ProbeName | None = Field(None, description=_probe_help(PROBES))

    def probe_name(self) -> str:
        """``probe``, or when omitted the first probe of PROBES that fits the request: one that
        reads a text when a text is given, else one that reads none."""
        return self.probe or _probes(takes_text=self.text is not None)[0]


class HeadsRequest(TextRequest):
    model_config = _text_rules(HEAD_PROBES, *EVIDENCE_RULES)

    probe: HeadProbeName | None = Field(None, description=_probe_help(HEAD_PROBES))
    syntax: StrictBool = Field(
        False,
        description="also score syntactic heads on the shipped evaluation text and parse the "
        "text (headlab.heads.syntax; needs headlab[syntax]); the answer's 'syntax' field says when "
        "that is unavailable. Each head's scores then include 'syntactic', shown beside the "
        "others: the labels stay those of the same request without syntax",
    )
    evidence: StrictBool = Field(
        False,
        description="also back every label (headlab.heads.evidence): each score beside its "
        "random-weight and shuffled-token baselines, labels that need their margin over random "
        "weights, every head mean-ablated alone, composition scores, and a sentence per head; "
        "costs 6 more analyses and one partial forward per layer",
    )
    exact: StrictBool | list[tuple[int, int]] | None = Field(
        None,
        description="with evidence: true ablates every head exactly; a list of [layer, head] "
        "ablates those exactly beside the first-order estimate of every head "
        "(headlab.heads.attribution); null: exact where that costs no more than the estimate",
    )
    floors: StrictBool = Field(
        True,
        description="true (the default): a label needs its score at or above its threshold "
        "and its layer's random-weights floor (the same architecture with random weights, "
        "mean + 3 sd; headlab.heads.baselines.label_heads), each head then carrying 'floor', "
        "'margin' and 'below_floor'; false: thresholds alone, the labels unchecked against "
        "chance ('labels_gated' false). evidence checks labels against the floors always",
    )
    syntax_labels: StrictBool = Field(
        False,
        description="label the heads with the syntactic score too (implies syntax=true): a "
        "head whose syntactic margin passes its threshold by the widest share may be labelled "
        "'syntactic', so other heads' labels can change",
    )
    progress_id: str | None = Field(
        None,
        pattern=PROGRESS_ID,
        description="an id the client makes up (8 to 32 lowercase hex digits): while the "
        "request runs, GET /api/progress/{id} answers its steps, the one under way and the "
        "time it is expected to take (headlab.server.progress)",
    )

    def wants_syntax(self) -> bool:
        """Whether the answer carries the syntactic scores (syntax_labels implies syntax)."""
        return self.syntax or self.syntax_labels

    @model_validator(mode="after")
    def _evidence_fits(self) -> HeadsRequest:
        """The fields evidence needs or rules out, as :data:`EVIDENCE_RULES` state them."""
        if self.exact is not None and not self.evidence:
            raise ValueError(EXACT_NEEDS_EVIDENCE)
        if self.evidence and not self.floors:
            raise ValueError(EVIDENCE_NEEDS_FLOORS)
        if self.evidence and self.probe == NEEDLE:
            raise ValueError(EVIDENCE_NOT_ON_NEEDLES)
        return self


class ProgressStep(BaseModel):
    step: str = Field(description="the step's name (headlab.server.progress.LABELS)")
    label: str = Field(description="what it is, in words")
    expected_s: float | None = Field(description="seconds it is expected to take; null: unknown")
    basis: Literal["measured", "estimate", "cached"] = Field(
        description="measured: by the last run here, scaled to the tokens; estimate: from the "
        "model's size; cached: its result is kept, so it takes no time"
    )
    state: Literal["waiting", "running", "done"]
    seconds: float | None = Field(description="its wall time, once done")


class ProgressResponse(BaseModel):
    """A request's progress (``progress_id`` of POST /api/heads)."""

    id: str
    model: str
    step: str | None = Field(description="the step under way; null before the first and at the end")
    label: str | None = Field(description="the step under way, in words")
    done: int = Field(description="how much of the step is done (heads, random models …)")
    total: int = Field(description="… of how much (0: not counted)")
    elapsed_s: float = Field(description="seconds since the request started")
    expected_s: float | None = Field(description="seconds the planned steps should take in all")
    expected: str = Field(description="where the expected time comes from, in words")
    tokens: int = Field(description="the probe's tokens (0 until the probe is built)")
    steps: list[ProgressStep]
    state: Literal["waiting", "running", "finished", "failed"] = Field(
        description="waiting: no request with this id has started here (yet, or it is one of "
        "the older ones forgotten); running; finished; failed"
    )
    failed: str | None = Field(description="why the request failed, if it did")


class CircuitRequest(Strict):
    model: str = Field("default", pattern=NAME_PATTERN, description="a name from /api/models")
    seed: int = Field(0, ge=0, le=2**31 - 1, description="seed of the repeated random tokens")
    ablation: Literal["mean", "zero"] = Field(
        "mean", description="how a feeder head is ablated (headlab.heads.effects.Mode)"
    )

    @field_validator("seed", mode="before")
    @classmethod
    def _json_integer(cls, value: Any) -> Any:
        return json_integer(value)


class CircuitResponse(BaseModel):
    """``headlab circuit --json``: :meth:`headlab.heads.circuit.Circuit.to_dict` and the model."""

    model: str
    probe: str = Field(description="the probe the nodes' scores and labels were measured on")
    previous: list[dict[str, Any]] = Field(description="{head: [layer, head], score} per node")
    induction: list[dict[str, Any]] = Field(description="{head: [layer, head], score} per node")
    edges: list[dict[str, Any]] = Field(
        description="every previous-token → induction pair: k_composition, above_baseline, "
        "induction_score {clean, ablated}, confirmed_by_ablation, drawn"
    )
    k_floor: float = Field(description="K-composition's random-matrix floor (mean + 3 sd)")
    ablation: str
    forwards: int
    seconds: dict[str, float]


class ModelOnText(BaseModel):
    """What every answer about a model run on a probe starts with: the model and the tokens."""

    model: str
    text: str
    tokens: list[str] = Field(description="display label of each token")
    ids: list[int]
    causal: bool
    n_layers: int
    n_heads: int
    n_kv_heads: int = Field(description="key/value heads, each read by n_heads / n_kv_heads")
    kv_group: list[int] = Field([], description="per query head, the K/V head it reads")
    window: int | None = Field(None, description="keys a local layer's query sees; null: none")
    layer_kinds: list[str] = Field([], description='per layer "local" (the window) or "global"')


class AttentionResponse(ModelOnText):
    weights: list[list[list[list[float]]]] = Field(
        description="[layer][head][query i][key j], each row sums to 1"
    )
    averaged: list[list[list[float]]] = Field(
        description="[layer][i][j]: the mean of the layer's heads (what one average would see)"
    )


class HeadInfo(BaseModel):
    layer: int
    head: int = Field(description="head index; -1 for a layer's averaged head")
    label: str
    offset: int = Field(0, description="relative offset of the positional score")
    scores: dict[str, float]
    rest: float | None = Field(
        None, description="where the head rests on the rows its label's score leaves out"
    )
    relation: str | None = Field(None, description="the relation of the syntactic score")
    floor: float | None = Field(
        None, description="the random-weights floor of the score its label rests on (gated)"
    )
    margin: float | None = Field(None, description="that score minus its floor")
    below_floor: str | None = Field(
        None, description="the label its threshold alone gives, where the floor took it away"
    )


class HeadsResponse(ModelOnText):
    probe: str
    heads: list[HeadInfo]
    averaged: list[HeadInfo] = Field(description="per layer, the mean of its heads, scored alike")
    best: dict[str, Any] = Field(description="per head type, the model's best head and its score")
    thresholds: dict[str, float] = Field(default_factory=dict)
    needs: dict[str, dict[str, Any]] = Field(
        default_factory=dict,
        description="score type → the plain score ('score') that must reach 'min' too for the "
        "type to pass: induction_active, the share of the attention a head does not rest on "
        "the first token, needs an induction score of at least 0.25",
    )
    labels_gated: bool = Field(
        False, description="whether each label also needed its random-weights floor"
    )
    floors: dict[str, dict[str, float]] | None = Field(
        None, description="layer → score type → the random-weights floor (mean + 3 sd)"
    )
    sinks: dict[str, Any] = Field(
        default_factory=dict,
        description="Gu et al. 2024: per layer, the share of heads whose mean weight on the "
        "first token exceeds the threshold",
    )
    syntax: dict[str, Any] | None = Field(
        None,
        description="with syntax=true: 'available', 'note', the best head per relation on the "
        "evaluation text, and the text's words, parser arcs and each head's top link per word",
    )
    evidence: dict[str, Any] | None = Field(
        None,
        description="with evidence=true: per head its scores' baselines, ablation effects, "
        "strongest compositions and the sentence backing its label ('heads'), the "
        "composition baseline and top pairs, and what the evidence cost (forwards, seconds)",
    )
    syntax_labels: bool = Field(
        False, description="whether the labels took the syntactic score into account"
    )
    needles: list[dict[str, Any]] | None = Field(
        None,
        description="probe 'needle': per needle its length, depth and seed, whether the model "
        "answered the number, its answer's and the number's token ids and the number's span "
        "(headlab.heads.retrieval.needle_analysis, as `headlab heads --probe needle --json`)",
    )
    weights: list[list[list[list[float]]]] = Field(
        description="[layer][head][query i][key j] on the probe's first sequence"
    )
    averaged_weights: list[list[list[float]]] = Field(
        description="[layer][i][j]: the mean of the layer's heads on that sequence"
    )


class CodeResponse(BaseModel):
    name: str
    path: str = Field(description="file inside the repository")
    line: int
    source: str


class NeedleRequest(Strict):
    """One needle in a haystack, run live (:func:`headlab.heads.retrieval.live_needle`)."""

    model: str | None = Field(
        None,
        pattern=NAME_PATTERN,
        description="a name from /api/models; omitted: smollm2 when installed, else default",
    )
    depth: float = Field(0.5, ge=0.0, le=1.0, description="where the needle sits, 0 = first")
    seed: int = Field(0, ge=0, le=2**31 - 1, description="picks the number and the haystack")

    @field_validator("seed", mode="before")
    @classmethod
    def _json_integer(cls, value: Any) -> Any:
        return json_integer(value)


class NeedleResponse(BaseModel):
    """The needle, the model's answer, and the heads that copied it (Wu et al. 2024's score)."""

    model: str
    length: int = Field(description="context tokens, needle and question included")
    depth: float
    seed: int
    needle: str = Field(description="the fact's text, which the model should repeat")
    question: str
    generated: str = Field(description="what the model wrote, greedily")
    answered: bool = Field(description="true when it wrote the number whole")
    top_heads: list[dict[str, Any]] = Field(
        description="{layer, head, score}: the heads with the highest retrieval score on this "
        "probe (score > 0 only)"
    )
    heads: int = Field(description="heads in the model")
    above_threshold: int = Field(description="heads at or above 0.1 on this one probe")


# a layer or head number, and at most MAX_OFF of them: bounded so that the largest body the
# schema allows, the longest text beside it, stays under the body limit (settings.max_body_bytes)
Count = Annotated[int, Field(ge=0, le=4095)]
MAX_OFF = 1024


SWITCH_RUNS = 2  # a switch-off answer holds the patterns of two runs: intact and switched off


class SwitchOffRequest(TextRequest):
    """A set of heads to switch off on a probe (:func:`headlab.heads.switch.switch_off`)."""

    text: str | None = text_field(SWITCH_RUNS)
    off: list[tuple[Count, Count]] = Field(
        min_length=1,
        max_length=MAX_OFF,
        description="the [layer, head] pairs switched off together, each counted from 0 and "
        "within the model's layers and heads (a head it lacks is a 422 that names them)",
    )
    mode: Literal["mean", "zero"] = Field(
        "mean",
        description="mean: each head's output replaced by its average over the text in the "
        "intact run; zero: by zeros (headlab.heads.effects.Mode)",
    )

    @field_validator("off", mode="before")
    @classmethod
    def _json_integers(cls, value: Any) -> Any:
        if not isinstance(value, list):
            return value
        return [[json_integer(x) for x in p] if isinstance(p, list) else p for p in value]


class SwitchedRun(BaseModel):
    """One run of the probe: intact, or with the heads switched off."""

    predictions: list[list[dict[str, Any]]] = Field(
        description="per position, the 5 likeliest next tokens: {id, token, p}, likeliest first"
    )
    losses: list[float] = Field(description="per position but the last, the next-token loss")
    induction: list[list[float]] = Field(description="[layer][head]: each head's induction score")
    weights: list[list[list[list[float]]]] = Field(
        description="[layer][head][query i][key j], each row sums to 1"
    )


class SwitchOffResponse(ModelOnText):
    """``headlab heads --off … --json``: the probe run intact and with the heads switched off."""

    probe: str
    mode: str
    off: list[list[int]] = Field(description="the heads switched off, sorted, as [layer, head]")
    sequences: int = Field(description="the probe's sequences: the losses are over all of them")
    loss: dict[str, dict[str, float] | None] = Field(
        description="'repeat' (the rows whose token occurred before; null when none does) and "
        "'all' (every row), over every sequence: the mean next-token loss 'intact', 'off', "
        "their difference 'rise', and how many 'rows' it is over"
    )
    repeat_rows: list[bool] = Field(
        description="per loss row of the first sequence, whether it counts as the repeat"
    )
    intact: SwitchedRun
    switched_off: SwitchedRun
