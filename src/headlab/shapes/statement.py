"""The shape table, stated once: every size, shape, parameter, FLOP, byte, check and sentence of
the shape report, as constants and ``name = expression`` lines that Python evaluates here and the
static site's browser evaluates from the same JSON (``static/offline/shape-statement.json``,
written by :func:`headlab.site.build` from :func:`exported`).

The expressions are Python's syntax (the language: :mod:`headlab.shapes.formula`). A caller gives
``config`` (the fields of :class:`~headlab.shapes.ShapeConfig` as a dict, dtype under its one
name) and ``valid``, ``problems`` and ``source``; the report's parts are then read by name
(``stages``, ``params``, ``kv_cache``, ``summary``, ``report``...). The traced report
(:func:`~headlab.shapes.trace_shapes`) gives what it measured on the real layer instead
(``stages``, ``param_tensors``, the cache bytes), and everything else follows from those.

Shape legend (as in attention.py): B batch, n query positions, s key positions (cache_len + n),
d_model width, h query heads, h_kv key/value heads, d_k each head's width (d_model // h unless
given; the layer's values are as wide as its keys, so d_v = d_k throughout).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

from headlab.shapes.formula import Fn, Scope, Tree, compile_definitions, evaluator, literal

# dtype names a user may type → the one name of the dtype the layer is run in
DTYPE_ALIASES: dict[str, str] = {
    "float32": "float32",
    "fp32": "float32",
    "float16": "float16",
    "fp16": "float16",
    "half": "float16",
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
    "float64": "float64",
    "fp64": "float64",
}

# bytes per element of each dtype, under its one name (torch's ``itemsize``; a test holds them)
ITEMSIZE: dict[str, int] = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8}

# a tensor above this many elements gets a warning: no single accelerator holds it
LARGE_ELEMENTS = 2**40

# above this the configuration is refused: byte counts (8 bytes per element) would pass 2**53,
# where JSON numbers stop being exact in a browser, and nothing could ever run it
MAX_ELEMENTS = 2**50

# above this the configuration is refused too: a FLOP count must fit a 64-bit integer (JSON
# encoders and the page's numbers); 2**62 is about a million times a GPT-3 layer at 131k tokens
MAX_FLOPS = 2**62

# each size a request may ask for (the CLI's options, the API's schema, the static site's port):
# the least, the most, and whether null may stand for it (then h for n_kv_heads, d_model // h
# for d_k)
FIELDS: dict[str, dict[str, Any]] = {
    "d_model": {"least": 1, "most": 2**20, "nullable": False},
    "n_heads": {"least": 1, "most": 2**16, "nullable": False},
    "n_kv_heads": {"least": 1, "most": 2**16, "nullable": True},
    "seq_len": {"least": 1, "most": 2**24, "nullable": False},
    "batch": {"least": 1, "most": 2**16, "nullable": False},
    "cache_len": {"least": 0, "most": 2**24, "nullable": False},
    "d_k": {"least": 1, "most": 2**20, "nullable": True},
}

# what POST /api/shapes (and its port) takes for a field left out, in ShapeConfig's order
REQUEST_DEFAULTS: dict[str, Any] = {
    "d_model": 512,
    "n_heads": 8,
    "seq_len": 10,
    "batch": 1,
    "n_kv_heads": None,
    "bias": True,
    "dtype": "float32",
    "cache_len": 0,
    "d_k": None,
}

# stage name in the trace → (what it is, symbolic shape for MHA without a cache), in the order the
# layer computes them; a report names h_kv only for GQA/MQA and s only with a cache ("same" below)
STAGES: dict[str, tuple[str, str]] = {
    "x": ("input X", "B×n×d_model"),
    "q_proj": ("Q = X·W_Q", "B×n×h·d_k"),
    "k_proj": ("K = X·W_K", "B×n×h_kv·d_k"),
    "v_proj": ("V = X·W_V", "B×n×h_kv·d_k"),
    "q": ("Q split into heads", "B×h×n×d_k"),
    "k": ("K split into heads", "B×h_kv×n×d_k"),
    "v": ("V split into heads", "B×h_kv×n×d_k"),
    "k_all": ("K, cached + new", "B×h_kv×s×d_k"),
    "v_all": ("V, cached + new", "B×h_kv×s×d_k"),
    "k_rep": ("K expanded to h heads", "B×h×s×d_k"),
    "v_rep": ("V expanded to h heads", "B×h×s×d_k"),
    "scores": ("scores QKᵀ/√d_k", "B×h×n×s"),
    "weights": ("weights A = softmax", "B×h×n×s"),
    "head_out": ("head outputs A·V", "B×h×n×d_k"),
    "merged": ("heads merged", "B×n×h·d_k"),
    "out": ("Y = merged·W_O", "B×n×d_model"),
}

# the stages whose size grows with n·s: the attention pattern itself
N2_STAGES = ("scores", "weights")

# the products whose FLOPs grow with n·s: QKᵀ and A·V
N2_PRODUCTS = ("scores", "head_out")

# each parameter as nn.Linear holds it: (symbolic shape, (out, in) for a weight; is it a bias)
PARAMS: dict[str, tuple[str, bool]] = {
    "W_Q.weight": ("h·d_k×d_model", False),
    "W_Q.bias": ("h·d_k", True),
    "W_K.weight": ("h_kv·d_k×d_model", False),
    "W_K.bias": ("h_kv·d_k", True),
    "W_V.weight": ("h_kv·d_k×d_model", False),
    "W_V.bias": ("h_kv·d_k", True),
    "W_O.weight": ("d_model×h·d_k", False),
    "W_O.bias": ("d_model", True),
}
MATRICES = ("W_Q", "W_K", "W_V", "W_O")

CONSTANTS: dict[str, Any] = {
    "DTYPE_ALIASES": DTYPE_ALIASES,
    "ITEMSIZE": ITEMSIZE,
    "LARGE_ELEMENTS": LARGE_ELEMENTS,
    "MAX_ELEMENTS": MAX_ELEMENTS,
    "MAX_FLOPS": MAX_FLOPS,
    "FIELDS": FIELDS,
    "REQUEST_DEFAULTS": REQUEST_DEFAULTS,
    "STAGES": STAGES,
    "N2_STAGES": N2_STAGES,
    "N2_PRODUCTS": N2_PRODUCTS,
    "PARAMS": PARAMS,
    "MATRICES": MATRICES,
}

DEFINITIONS = """
# ---- the legend's sizes, from the request (config) ------------------------------------------
B = config.batch
n = config.seq_len
s = config.cache_len + config.seq_len  # key positions: cached + new
d_model = config.d_model
h = config.n_heads
h_kv = config.n_heads if config.n_kv_heads is None else config.n_kv_heads
# each head's width: the one given (Gemma 3: 256 at d_model 640 with 4 heads, so h·d_k need not
# be d_model), else d_model // h (0 while h is not a positive integer)
d_k = (
    config.d_k if config.d_k is not None
    else config.d_model // config.n_heads if is_int(config.n_heads) and config.n_heads > 0
    else 0
)
sizes = {"B": B, "n": n, "s": s, "d_model": d_model, "h": h, "h_kv": h_kv, "d_k": d_k}
kind = "MHA" if h_kv == h else "MQA" if h_kv == 1 else "GQA"
heads_fill_width = h * d_k == d_model
itemsize = ITEMSIZE[config.dtype] if config.dtype in ITEMSIZE else 0

# ---- what a request may say (the static site checks each field with these) ------------------
accepts = lambda field, value: (
    (value is None and FIELDS[field].nullable)
    or (is_int(value) and FIELDS[field].least <= value and value <= FIELDS[field].most)
    if field in FIELDS
    else is_bool(value) if field == "bias"
    else value in [name for name in DTYPE_ALIASES] if field == "dtype"
    else False
)
refused = lambda field, got: (
    f"{field}: must be a whole number from {FIELDS[field].least} to {FIELDS[field].most}"
    + (" or null" if FIELDS[field].nullable else "") + f", got {got}"
    if field in FIELDS
    else f"bias: must be true or false, got {got}" if field == "bias"
    else f"dtype: must be one of {join(DTYPE_ALIASES, ', ')}, got {got}" if field == "dtype"
    else f"{field}: not a field of the shape calculator; its fields: {join(REQUEST_DEFAULTS, ', ')}"
)
# the configuration a request asks for: each field given, else its default; dtype by its one name
config_of = lambda body: {
    field: (
        (DTYPE_ALIASES[body[field]] if field == "dtype" else body[field]) if field in body
        else REQUEST_DEFAULTS[field]
    )
    for field in REQUEST_DEFAULTS
}

# ---- the head counts that would be valid, and what is wrong with a size ---------------------
head_counts = {"valid_head_counts": divisors(d_model), "valid_kv_head_counts": divisors(h)}
nearest = lambda value, of: (
    [d for d in divisors(of) if d < value][-1:] + [d for d in divisors(of) if d > value][:1]
)
short = lambda values: (
    join(values, ", ") if len(values) <= 16
    else join(values[:8], ", ") + ", …, " + join(values[-8:], ", ")
)
largest = max(
    B * n * d_model, B * h * n * s, d_model * d_model, B * h * s * d_k, h * d_k * d_model,
    B * n * h * d_k,
)
layer_flops = sum(stage_flops[name] for name in stage_flops)
# a given head width need not split d_model
width_problems = [
    f"d_model={d_model} is not divisible by n_heads={h}, so the heads cannot split the width "
    f"evenly; nearest valid head counts: {join(nearest(h, d_model), ' or ')} "
    f"(any divisor of {d_model}: {short(divisors(d_model))})"
] if config.d_k is None and d_model % h else []
# (a head count over d_model without a given d_k is already reported above)
group_problems = [
    f"n_heads={h} is not divisible by n_kv_heads={h_kv}, so the query heads cannot share K/V "
    f"heads in equal groups; nearest valid K/V head counts: {join(nearest(h_kv, h), ' or ')} "
    f"(any divisor of {h}: {short(divisors(h))})"
] if (h <= d_model or config.d_k is not None) and h % h_kv else []
size_problems = (
    [
        f"the largest tensor would hold {largest:,} elements (about 2**{log2(largest):.0f}), "
        "over the limit of 2**50; choose smaller sizes"
    ] if largest > MAX_ELEMENTS
    else width_problems + group_problems if width_problems + group_problems
    else [
        f"the layer would take {layer_flops:,} FLOPs (about 2**{log2(layer_flops):.0f}), over "
        "the limit of 2**62; choose a smaller batch, sequence or width"
    ] if layer_flops > MAX_FLOPS
    else []
)

# ---- every tensor of the forward pass ---------------------------------------------------------
# FLOPs of the matrix product that makes a stage: a multiply-add counts 2 (Kaplan et al. 2020,
# and torch.utils.flop_counter); the bias adds, the 1/√d_k scale and the softmax are left out
stage_flops = {
    "q_proj": 2 * B * n * d_model * h * d_k,
    "k_proj": 2 * B * n * d_model * h_kv * d_k,
    "v_proj": 2 * B * n * d_model * h_kv * d_k,
    "scores": 2 * B * h * n * s * d_k,
    "head_out": 2 * B * h * n * s * d_k,
    "out": 2 * B * n * h * d_k * d_model,
}
# the stages the layer records only sometimes: the cached keys and values with a cache, the
# expanded ones where K/V heads are shared (h_kv < h); every other stage always
recorded = {
    "k_all": config.cache_len > 0,
    "v_all": config.cache_len > 0,
    "k_rep": h_kv != h,
    "v_rep": h_kv != h,
}
# a symbolic shape names h_kv only where it differs from h, and s only where a cache makes it
# differ from n
same = {"h_kv": "h" if h_kv == h else "h_kv", "s": "n" if config.cache_len == 0 else "s"}
stage = lambda name, shape, dtype, item: {
    "name": name,
    "label": STAGES[name][0],
    "symbolic": rename(STAGES[name][1], same),
    "shape": shape,
    "dtype": dtype,
    "elements": prod(shape),
    "bytes": prod(shape) * item,
    "flops": stage_flops[name] if name in stage_flops else 0,
    "n2": name in N2_STAGES,
}
stages = [
    stage(name, dims(STAGES[name][1]), config.dtype, itemsize)
    for name in STAGES
    if (recorded[name] if name in recorded else True)
] if valid else []
stage_named = lambda name: [st for st in stages if st.name == name][0]
shape_preserving = (
    valid
    and stage_named("x").shape == stage_named("out").shape
    and stage_named("x").dtype == stage_named("out").dtype
)

# ---- parameters: nn.Linear's (out, in) weights and (out,) biases -----------------------------
param = lambda name, shape: {
    "name": name, "symbolic": rename(PARAMS[name][0], same), "shape": shape, "count": prod(shape),
}
param_tensors = [
    param(name, dims(PARAMS[name][0])) for name in PARAMS if config.bias or not PARAMS[name][1]
] if valid else []
params = {
    **{
        m: sum(p.count for p in param_tensors if p.name in [m + ".weight", m + ".bias"])
        for m in MATRICES
    },
    "total": sum(p.count for p in param_tensors),
}

# ---- FLOPs, memory, the KV cache --------------------------------------------------------------
flops_total = sum(st.flops for st in stages)
flops_n2 = sum(st.flops for st in stages if st.name in N2_PRODUCTS)
flops = {
    "total": flops_total,
    "n2": flops_n2,
    "n2_share": flops_n2 / flops_total if flops_total else 0.0,
    **{st.name: st.flops for st in stages if st.flops},
}
memory = {
    "n2_bytes": sum(st.bytes for st in stages if st.n2),
    "activation_bytes": sum(st.bytes for st in stages),
    "param_bytes": params.total * itemsize,
}
# one layer's cache holds keys and values, (B, heads, s, d_k) each; against MHA (h K/V heads)
# and MQA (one) of the same size. A StreamingLLM position (headlab.model.streaming.SinkCache)
# also keeps its keys before rotary: three buffers per kept position and sequence
kv_bytes = lambda heads: 2 * B * heads * s * d_k * itemsize
cache_bytes = kv_bytes(h_kv)
mha_cache_bytes = kv_bytes(h)
mqa_cache_bytes = kv_bytes(1)
sink_slot_bytes = 3 * h_kv * d_k * itemsize
kv_tokens = B * s
kv_cache = {
    "bytes": cache_bytes,
    "bytes_per_token": cache_bytes // kv_tokens,
    "tokens": kv_tokens,
    "mha_bytes": mha_cache_bytes,
    "mha_bytes_per_token": mha_cache_bytes // kv_tokens,
    "ratio_vs_mha": mha_cache_bytes / cache_bytes,
    "mqa_bytes": mqa_cache_bytes,
    "mqa_bytes_per_token": mqa_cache_bytes // kv_tokens,
    "sink_bytes_per_token": sink_slot_bytes,
} if valid else {}

# ---- the report in words -----------------------------------------------------------------------
# bytes in binary units for people: 40960 → "40.0 KiB"
format_bytes = lambda n: (
    f"{n:,.0f} B" if abs(n) < 2**10
    else f"{n / 2**10:,.1f} KiB" if abs(n) < 2**20
    else f"{n / 2**20:,.1f} MiB" if abs(n) < 2**30
    else f"{n / 2**30:,.1f} GiB" if abs(n) < 2**40
    else f"{n / 2**40:,.1f} TiB" if abs(n) < 2**50
    else f"{n / 2**50:,.1f} PiB"
)
too_big = [st for st in stages if st.elements > LARGE_ELEMENTS]
warnings = [
    f"{join([st.name for st in too_big], ', ')} would hold over 2**40 elements each (up to "
    f"{max([st.bytes for st in too_big]):,} bytes): no single accelerator holds that; fused "
    "kernels (FlashAttention, SDPA) never store the n·s pattern, and real runs split the batch "
    "or the sequence"
] if too_big else []
maps = (
    "h·d_k = d_model back to d_model" if heads_fill_width
    else f"h·d_k = {h * d_k:,} back to d_model = {d_model:,}"
)
verdict = f"{kind}, h={h}, h_kv={h_kv}, d_k={d_k}; " + (
    f"shape-preserving: B×n×d_model in and out (W_O maps {maps}), so the output adds onto the "
    "residual stream and blocks stack" if shape_preserving
    else "NOT shape-preserving"
) if valid else ""
kv_sentence = (
    f"KV cache: {format_bytes(kv_cache.bytes_per_token)} per token, "
    f"{format_bytes(kv_cache.bytes)} for {kv_cache.tokens:,} tokens (B·s); "
) + (
    f"plain MHA would hold {format_bytes(kv_cache.mha_bytes)}, {kv_cache.ratio_vs_mha:g}× as much"
    if kv_cache.ratio_vs_mha != 1
    else "this is MHA: every head keeps its own keys and values"
)
summary = [
    "parameters: " + join([f"{m} {params[m]:,}" for m in params], ", ")
    + (" (= 4·d_model² + 4·d_model)" if kind == "MHA" and config.bias and heads_fill_width else ""),
    f"FLOPs: {flops.total:,}; {flops.n2_share:.1%} of them in QKᵀ and A·V, the n·s part "
    "(a multiply-add counts 2; bias, scale and softmax are not counted)",
    f"attention pattern (scores + weights): {format_bytes(memory.n2_bytes)}; "
    f"all activations {format_bytes(memory.activation_bytes)}",
    kv_sentence,
] + [f"warning: {w}" for w in warnings] + [f"verdict: {verdict}"] if valid else problems

# ---- the report as JSON (ShapeReport.to_dict, POST /api/shapes) ------------------------------
report = {
    "valid": valid,
    "problems": problems,
    "warnings": warnings,
    "config": {**config, "kind": kind, "sizes": sizes},
    "stages": stages,
    "params": params,
    "param_tensors": param_tensors,
    "flops": flops,
    "memory": memory,
    "kv_cache_bytes": kv_cache.bytes if "bytes" in kv_cache else 0,
    "kv_cache": kv_cache,
    "shape_preserving": shape_preserving,
    "verdict": verdict,
    "summary": summary,
    "source": source,
}
"""


@functools.cache
def definitions() -> dict[str, Tree]:
    """:data:`DEFINITIONS`, compiled (once per process)."""
    return compile_definitions(DEFINITIONS)


@functools.cache
def _compiled() -> dict[str, Fn]:
    return {name: evaluator(tree) for name, tree in definitions().items()}


@functools.cache
def _constants() -> Scope:
    return Scope({}, _plain(CONSTANTS))


def scope(config: Mapping[str, Any], **values: Any) -> Scope:
    """The statement for one configuration: ``config`` is ShapeConfig's fields as a dict;
    ``values`` the report's inputs (``valid``, ``problems``, ``source``) and anything measured,
    which takes the place of its definition."""
    return Scope(_compiled(), {"config": dict(config), **values}, _constants())


def exported() -> dict[str, Any]:
    """The statement as the browser reads it: every constant and definition as a tree."""
    return {
        "about": "headlab's shape statement (headlab/shapes/statement.py), compiled by "
        "headlab.shapes.formula; static/offline/formula.js evaluates it",
        "constants": {name: literal(value) for name, value in CONSTANTS.items()},
        "definitions": definitions(),
    }


def _plain(value: Any) -> Any:
    """Constants as the language holds them: tuples as lists."""
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value
