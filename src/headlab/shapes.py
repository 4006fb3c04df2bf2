"""The shape and parameter calculator: every tensor of the attention layer, for any size.

The report is read off the real :class:`~headlab.attention.MultiHeadAttention`: the module is built
and run on PyTorch's ``meta`` device with a :class:`~headlab.trace.Trace`, so every recorded tensor
has its true shape and dtype but no storage. Nothing is allocated, and even GPT-3's width with a
131,072-token context and a batch of 64 takes a couple of milliseconds. The formulas that the
page shows (symbolic shapes, 4·d_model² + 4·d_model parameters, FLOPs) are checked against the
trace by the tests rather than used in its place.

Shape legend (as in attention.py): B batch, n query positions, s key positions (cache_len + n),
d_model width, h query heads, h_kv key/value heads, d_k = d_model // h.

FLOPs count the matrix products only, a multiply-add as 2 (Kaplan et al. 2020's convention, and
what ``torch.utils.flop_counter`` counts); the bias adds, the 1/√d_k scale and the softmax are
O(B·h·n·s) element-wise work against the products' O(B·h·n·s·d_k), and are left out.

Papers: Vaswani et al. 2017 (multi-head attention), Shazeer 2019 (MQA), Ainslie et al. 2023 (GQA).
"""

from __future__ import annotations

import functools
import math
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import torch

from headlab.attention import KVCache, MultiHeadAttention, valid_head_counts
from headlab.trace import Trace

# dtype names a user may type → the torch dtype the layer is run in
DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "float16": torch.float16,
    "fp16": torch.float16,
    "half": torch.float16,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float64": torch.float64,
    "fp64": torch.float64,
}
# one name per dtype, as reports and the page's menu write it (the aliases above map onto these)
DTYPE_NAMES: tuple[str, ...] = tuple(
    dict.fromkeys(str(t).removeprefix("torch.") for t in DTYPES.values())
)
# a tensor above this many elements gets a warning: no single accelerator holds it
LARGE_ELEMENTS = 2**40
# above this the configuration is refused: byte counts (8 bytes per element) would pass 2**53,
# where JSON numbers stop being exact in a browser, and nothing could ever run it
MAX_ELEMENTS = 2**50
# the sizes a request may ask for (the CLI's options and the API's schema): (least, most)
LIMITS: dict[str, tuple[int, int]] = {
    "d_model": (1, 2**20),
    "n_heads": (1, 2**16),
    "n_kv_heads": (1, 2**16),
    "seq_len": (1, 2**24),
    "batch": (1, 2**16),
    "cache_len": (0, 2**24),
}
# how FLOPs are counted, in the words the CLI, the page and the README use
FLOP_CONVENTION = (
    "FLOPs count the matrix products, a multiply-add as 2; the bias adds, the 1/√d_k scale "
    "and the softmax are not counted"
)
# above this the configuration is refused too: a FLOP count must fit a 64-bit integer (JSON
# encoders and the page's numbers); 2**62 is about a million times a GPT-3 layer at 131k tokens
MAX_FLOPS = 2**62

# stage name in the trace → (what it is, symbolic shape for MHA without a cache). The symbolic
# shape is adjusted in _symbolic: "h_kv" appears for GQA/MQA, "s" when a cache is in use.
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


@dataclass(frozen=True)
class ShapeConfig:
    """The layer and input sizes a report describes."""

    d_model: int  # model width
    n_heads: int  # query heads h
    seq_len: int  # new positions n
    batch: int  # sequences B
    n_kv_heads: int | None = None  # key/value heads h_kv; None means h (MHA)
    bias: bool = True  # biases on the four projections
    dtype: str = "float32"  # a key of DTYPES
    cache_len: int = 0  # positions already in the KV cache; s = cache_len + n

    @property
    def h_kv(self) -> int:
        return self.n_heads if self.n_kv_heads is None else self.n_kv_heads

    @property
    def kind(self) -> str:
        """ "MHA", "GQA" or "MQA"."""
        if self.h_kv == self.n_heads:
            return "MHA"
        return "MQA" if self.h_kv == 1 else "GQA"

    def sizes(self) -> dict[str, int]:
        """The legend's symbols with their values: B, n, s, d_model, h, h_kv, d_k."""
        return {
            "B": self.batch,
            "n": self.seq_len,
            "s": self.cache_len + self.seq_len,
            "d_model": self.d_model,
            "h": self.n_heads,
            "h_kv": self.h_kv,
            "d_k": self.d_model // self.n_heads
            if _is_int(self.n_heads) and self.n_heads > 0
            else 0,
        }

    def head_counts(self) -> dict[str, list[int]]:
        """The head counts that would be valid here, which the calculator offers to pick:
        ``valid_head_counts``, the h that split ``d_model`` evenly, and ``valid_kv_head_counts``,
        the h_kv that split ``n_heads`` into equal groups (both ascending divisors)."""
        return {
            "valid_head_counts": valid_head_counts(self.d_model),
            "valid_kv_head_counts": valid_head_counts(self.n_heads),
        }


@dataclass(frozen=True)
class Stage:
    """One tensor of the forward pass, in the order the layer computes it."""

    name: str  # trace name, e.g. "scores"
    label: str  # what it is, e.g. "scores QKᵀ/√d_k"
    symbolic: str  # e.g. "B×h×n×d_k"
    shape: tuple[int, ...]  # concrete shape recorded from the real module
    dtype: str  # the dtype the module produced, e.g. "bfloat16"
    elements: int
    bytes: int  # elements × bytes per element at that dtype
    flops: int  # FLOPs of the product that made it (0 for a reshape)
    n2: bool  # part of the n·s attention pattern


@dataclass(frozen=True)
class ParamTensor:
    """One parameter tensor of the layer, as the real module holds it."""

    name: str  # e.g. "W_Q.weight"
    symbolic: str  # e.g. "h·d_k×d_model" (nn.Linear stores out × in)
    shape: tuple[int, ...]
    count: int


@dataclass(frozen=True)
class ShapeReport:
    """Everything :func:`trace_shapes` found; ``to_dict()`` is its JSON form."""

    config: ShapeConfig
    valid: bool
    problems: tuple[str, ...]
    warnings: tuple[str, ...] = ()
    stages: tuple[Stage, ...] = ()
    param_tensors: tuple[ParamTensor, ...] = ()
    kv_cache: dict[str, int | float] = field(default_factory=dict)
    shape_preserving: bool = False
    verdict: str = ""

    def stage(self, name: str) -> Stage:
        """The stage with trace name ``name``."""
        for st in self.stages:
            if st.name == name:
                return st
        raise KeyError(f"no stage {name!r}; stages: {', '.join(s.name for s in self.stages)}")

    @property
    def params(self) -> dict[str, int]:
        """Parameters per projection (weight + bias) and in total."""
        out = {m: 0 for m in ("W_Q", "W_K", "W_V", "W_O")}
        for p in self.param_tensors:
            out[p.name.split(".")[0]] += p.count
        out["total"] = sum(p.count for p in self.param_tensors)
        return out

    @property
    def flops(self) -> dict[str, Any]:
        """Total FLOPs, those of the n·s part (QKᵀ and A·V), its share, and per stage."""
        total = sum(st.flops for st in self.stages)
        n2 = sum(st.flops for st in self.stages if st.name in ("scores", "head_out"))
        by_stage = {st.name: st.flops for st in self.stages if st.flops}
        return {"total": total, "n2": n2, "n2_share": n2 / total if total else 0.0, **by_stage}

    @property
    def memory(self) -> dict[str, int]:
        """Bytes of the attention pattern (scores + weights), all activations, the parameters."""
        n2 = sum(st.bytes for st in self.stages if st.n2)
        elem = DTYPES[self.config.dtype].itemsize if self.config.dtype in DTYPES else 0
        return {
            "n2_bytes": n2,
            "activation_bytes": sum(st.bytes for st in self.stages),
            "param_bytes": self.params["total"] * elem,
        }

    def summary(self) -> list[str]:
        """The report's figures as sentences for people (the CLI prints these)."""
        if not self.valid:
            return list(self.problems)
        p, fl, mem = self.params, self.flops, self.memory
        mha = self.config.kind == "MHA" and self.config.bias
        return [
            "parameters: "
            + ", ".join(f"{k} {v:,}" for k, v in p.items())
            + (" (= 4·d_model² + 4·d_model)" if mha else ""),
            f"FLOPs: {fl['total']:,}; {fl['n2_share']:.1%} of them in QKᵀ and A·V, the n·s part "
            "(a multiply-add counts 2; bias, scale and softmax are not counted)",
            f"attention pattern (scores + weights): {format_bytes(mem['n2_bytes'])}; "
            f"all activations {format_bytes(mem['activation_bytes'])}",
            _kv_sentence(self.kv_cache),
            *(f"warning: {w}" for w in self.warnings),
            f"verdict: {self.verdict}",
        ]

    def to_dict(self) -> dict[str, Any]:
        """The report as plain JSON-able data.

        Keys: ``valid`` (bool); ``problems`` and ``warnings`` (lists of sentences); ``config``
        (the inputs plus ``kind`` "MHA"/"GQA"/"MQA" and ``sizes``, the legend's symbols → values);
        ``stages``: list of ``{name, label, symbolic, shape, dtype, elements, bytes, flops, n2}``
        in computation order; ``params``: ``{W_Q, W_K, W_V, W_O, total}`` (weight + bias each);
        ``param_tensors``: list of ``{name, symbolic, shape, count}``; ``flops``: ``{total, n2,
        n2_share, <stage>: flops…}``; ``memory``: ``{n2_bytes, activation_bytes, param_bytes}``;
        ``kv_cache_bytes`` (int) and ``kv_cache``: ``{bytes, bytes_per_token, tokens,
        mha_bytes, mha_bytes_per_token, ratio_vs_mha}``; ``shape_preserving`` (bool);
        ``verdict`` (one sentence); ``summary`` (sentences for people). An invalid report has
        the same keys, empty or zero.
        """
        cfg = self.config
        return {
            "valid": self.valid,
            "problems": list(self.problems),
            "warnings": list(self.warnings),
            "config": {**asdict(cfg), "kind": cfg.kind, "sizes": cfg.sizes()},
            "stages": [{**asdict(st), "shape": list(st.shape)} for st in self.stages],
            "params": self.params,
            "param_tensors": [{**asdict(p), "shape": list(p.shape)} for p in self.param_tensors],
            "flops": self.flops,
            "memory": self.memory,
            "kv_cache_bytes": int(self.kv_cache.get("bytes", 0)),
            "kv_cache": dict(self.kv_cache),
            "shape_preserving": self.shape_preserving,
            "verdict": self.verdict,
            "summary": self.summary(),
        }


@dataclass(frozen=True)
class Preset:
    """A published model's attention configuration."""

    name: str  # the key in PRESETS, e.g. "gpt2-small"
    title: str  # e.g. "GPT-2 small (124M)"
    d_model: int
    n_heads: int
    n_kv_heads: int | None  # None: MHA
    bias: bool  # biases on the Q, K, V and output projections
    n_layers: int
    context: int  # the context length the model was trained with
    source: str  # where the sizes are published

    def report(self, seq_len: int | None = None, batch: int = 1, **kw: Any) -> ShapeReport:
        """:func:`trace_shapes` for this model; ``seq_len`` defaults to its context length."""
        n = self.context if seq_len is None else seq_len
        return trace_shapes(self.d_model, self.n_heads, n, batch, self.n_kv_heads, self.bias, **kw)


# name, title, d_model, h, h_kv (None: MHA), bias, layers, context, source
_PUBLISHED = (
    ("transformer-base", "Transformer base", 512, 8, None, False, 6, 512,
     "Vaswani et al. 2017, Table 3 (base); projections without bias"),
    ("bert-base", "BERT-base", 768, 12, None, True, 12, 512, "Devlin et al. 2019"),
    ("gpt2-small", "GPT-2 small (124M)", 768, 12, None, True, 12, 1024, "Radford et al. 2019"),
    ("gpt2-medium", "GPT-2 medium (355M)", 1024, 16, None, True, 24, 1024, "Radford et al. 2019"),
    ("gpt2-large", "GPT-2 large (774M)", 1280, 20, None, True, 36, 1024, "Radford et al. 2019"),
    ("gpt2-xl", "GPT-2 XL (1.5B)", 1600, 25, None, True, 48, 1024, "Radford et al. 2019"),
    ("llama-2-7b", "Llama-2-7B", 4096, 32, None, False, 32, 4096, "Touvron et al. 2023"),
    ("llama-3-8b", "Llama-3-8B (GQA)", 4096, 32, 8, False, 32, 8192, "Meta 2024, Llama 3"),
    ("mistral-7b", "Mistral-7B (GQA)", 4096, 32, 8, False, 32, 8192,
     "Jiang et al. 2023, Table 1"),
    ("gpt3-175b", "GPT-3 175B", 12288, 96, None, True, 96, 2048, "Brown et al. 2020, Table 2.1"),
)  # fmt: skip
PRESETS: dict[str, Preset] = {row[0]: Preset(*row) for row in _PUBLISHED}


def trace_shapes(
    d_model: int,
    n_heads: int,
    seq_len: int,
    batch: int,
    n_kv_heads: int | None = None,
    bias: bool = True,
    dtype: str = "float32",
    cache_len: int = 0,
) -> ShapeReport:
    """Every tensor, parameter, FLOP and byte of one attention layer, from running it.

    Builds ``MultiHeadAttention(d_model, n_heads, n_kv_heads, bias)`` on the ``meta`` device, feeds
    it X (B=batch, n=seq_len, d_model) — after ``cache_len`` positions already in a KV cache when
    that is positive — and reads the shapes off a :class:`Trace`. Invalid or absurd sizes are
    answered with ``valid=False`` and ``problems`` (each says what would be valid), not raised.
    See :meth:`ShapeReport.to_dict` for the JSON keys.
    """
    name = _canonical_dtype(dtype)
    cfg = ShapeConfig(d_model, n_heads, seq_len, batch, n_kv_heads, bias, name, cache_len)
    problems = check_shape_config(cfg)
    if problems:
        return ShapeReport(cfg, valid=False, problems=tuple(problems))
    trace, module = _run_on_meta(cfg)
    stages = tuple(_stage(cfg, name, t) for name, t in trace.items())
    params = tuple(_param(cfg, name, p) for name, p in module.named_parameters())
    x, y = trace["x"], trace["out"]
    preserving = x.shape == y.shape and x.dtype == y.dtype
    report = ShapeReport(
        cfg,
        valid=True,
        problems=(),
        warnings=tuple(_warnings(stages)),
        stages=stages,
        param_tensors=params,
        kv_cache=_kv_cache(cfg),
        shape_preserving=preserving,
    )
    return _with_verdict(report)


def check_shape_config(cfg: ShapeConfig) -> list[str]:
    """Every problem with ``cfg``, each saying what is wrong and what would be valid."""
    problems = [
        f"{name} must be a positive integer, got {value!r}"
        for name, value in (
            ("d_model", cfg.d_model),
            ("n_heads", cfg.n_heads),
            ("seq_len", cfg.seq_len),
            ("batch", cfg.batch),
        )
        if not _is_int(value) or value < 1
    ]
    if cfg.n_kv_heads is not None and (not _is_int(cfg.n_kv_heads) or cfg.n_kv_heads < 1):
        problems.append(f"n_kv_heads must be a positive integer or None, got {cfg.n_kv_heads!r}")
    if not _is_int(cfg.cache_len) or cfg.cache_len < 0:
        problems.append(f"cache_len must be an integer >= 0, got {cfg.cache_len!r}")
    if not isinstance(cfg.bias, bool):
        problems.append(f"bias must be True or False, got {cfg.bias!r}")
    if cfg.dtype not in DTYPES:
        problems.append(f"unknown dtype {cfg.dtype!r}; valid: {', '.join(DTYPES)}")
    if problems:
        return problems
    largest = _largest_tensor(cfg)
    if largest > MAX_ELEMENTS:
        return [
            f"the largest tensor would hold {largest:,} elements "
            f"(about 2**{math.log2(largest):.0f}), over the limit of 2**50; choose smaller sizes"
        ]
    problems = _divisibility_problems(cfg)
    flops = sum(_stage_flops(cfg, name) for name in STAGES)
    if not problems and flops > MAX_FLOPS:
        problems.append(
            f"the layer would take {flops:,} FLOPs (about 2**{math.log2(flops):.0f}), over the "
            "limit of 2**62; choose a smaller batch, sequence or width"
        )
    return problems


def nearest_divisors(value: int, of: int) -> list[int]:
    """The divisors of ``of`` closest to ``value``: the one below and the one above (if any)."""
    divisors = valid_head_counts(of)
    below = [d for d in divisors if d < value]
    above = [d for d in divisors if d > value]
    return ([below[-1]] if below else []) + ([above[0]] if above else [])


def _divisibility_problems(cfg: ShapeConfig) -> list[str]:
    problems = []
    d, h = cfg.d_model, cfg.n_heads
    if d % h:
        problems.append(
            f"d_model={d} is not divisible by n_heads={h}, so the heads cannot split the width "
            f"evenly; nearest valid head counts: {_or(nearest_divisors(h, d))} "
            f"(any divisor of {d}: {_short(valid_head_counts(d))})"
        )
    h_kv = cfg.h_kv
    if h <= d and h % h_kv:  # (a head count over d_model is already reported above)
        problems.append(
            f"n_heads={h} is not divisible by n_kv_heads={h_kv}, so the query heads cannot share "
            f"K/V heads in equal groups; nearest valid K/V head counts: "
            f"{_or(nearest_divisors(h_kv, h))} (any divisor of {h}: {_short(valid_head_counts(h))})"
        )
    return problems


def _largest_tensor(cfg: ShapeConfig) -> int:
    """Closed-form element count of the layer's largest tensor, checked before building it."""
    z = cfg.sizes()
    return max(
        z["B"] * z["n"] * z["d_model"],
        z["B"] * z["h"] * z["n"] * z["s"],
        z["d_model"] * z["d_model"],
        z["B"] * z["h"] * z["s"] * z["d_k"],
    )


@functools.lru_cache(maxsize=64)
def _meta_module(
    d_model: int, n_heads: int, n_kv_heads: int, bias: bool, dtype: str
) -> MultiHeadAttention:
    """The real layer on the meta device (cached: the page asks on every keystroke)."""
    with torch.device("meta"):
        return MultiHeadAttention(d_model, n_heads, n_kv_heads, bias=bias).to(DTYPES[dtype])


def _run_on_meta(cfg: ShapeConfig) -> tuple[Trace, MultiHeadAttention]:
    """Trace one forward pass on meta; return the trace and the module the user asked for.

    The pass runs on the bias-free twin of the layer: on meta, a Linear with a bias becomes
    ``addmm``, which PyTorch decomposes in Python (about 2 ms for the four projections), and a
    bias changes no shape. The parameters are read from the module with the requested bias.
    """
    module = _meta_module(cfg.d_model, cfg.n_heads, cfg.h_kv, cfg.bias, cfg.dtype)
    runner = _meta_module(cfg.d_model, cfg.n_heads, cfg.h_kv, False, cfg.dtype)
    trace = Trace()
    # no torch.device("meta") mode here: x and the module are on meta already, and the mode
    # would route every op through __torch_function__
    with torch.no_grad():
        x = torch.empty(cfg.batch, cfg.seq_len, cfg.d_model, dtype=DTYPES[cfg.dtype], device="meta")
        cache = None
        if cfg.cache_len:
            cache = runner.new_cache(cfg.batch, cfg.cache_len + cfg.seq_len)
            cache.length = cfg.cache_len  # positions "already there": shapes are all meta needs
        runner(x, cache=cache, impl="explicit", trace=trace)
    return trace, module


def _symbolic(cfg: ShapeConfig, pattern: str) -> str:
    """Name h_kv only where it differs from h, and s only where a cache makes it differ from n."""
    same = {"h_kv": "h"} if cfg.h_kv == cfg.n_heads else {}
    if cfg.cache_len == 0:
        same["s"] = "n"
    dims = ("·".join(same.get(f, f) for f in dim.split("·")) for dim in pattern.split("×"))
    return "×".join(dims)


def _stage(cfg: ShapeConfig, name: str, t: torch.Tensor) -> Stage:
    label, pattern = STAGES.get(name, (name, "?"))
    elements = t.numel()
    return Stage(
        name=name,
        label=label,
        symbolic=_symbolic(cfg, pattern),
        shape=tuple(t.shape),
        dtype=str(t.dtype).removeprefix("torch."),
        elements=elements,
        bytes=elements * t.element_size(),
        flops=_stage_flops(cfg, name),
        n2=name in N2_STAGES,
    )


def _stage_flops(cfg: ShapeConfig, name: str) -> int:
    """FLOPs of the matrix product that produces stage ``name`` (multiply-add = 2)."""
    z = cfg.sizes()
    tokens = z["B"] * z["n"]
    pattern = z["B"] * z["h"] * z["n"] * z["s"]
    return {
        "q_proj": 2 * tokens * z["d_model"] * z["h"] * z["d_k"],
        "k_proj": 2 * tokens * z["d_model"] * z["h_kv"] * z["d_k"],
        "v_proj": 2 * tokens * z["d_model"] * z["h_kv"] * z["d_k"],
        "scores": 2 * pattern * z["d_k"],
        "head_out": 2 * pattern * z["d_k"],
        "out": 2 * tokens * z["h"] * z["d_k"] * z["d_model"],
    }.get(name, 0)


def _param(cfg: ShapeConfig, name: str, p: torch.Tensor) -> ParamTensor:
    width = {"W_Q": "h·d_k", "W_K": "h_kv·d_k", "W_V": "h_kv·d_k", "W_O": "d_model"}
    matrix, kind = name.split(".")
    out = _symbolic(cfg, width[matrix])
    fan_in = "h·d_k" if matrix == "W_O" else "d_model"
    symbolic = out if kind == "bias" else f"{out}×{fan_in}"  # nn.Linear stores (out, in)
    return ParamTensor(name, symbolic, tuple(p.shape), p.numel())


def _kv_cache(cfg: ShapeConfig) -> dict[str, int | float]:
    """KV-cache bytes for this layer, from real (meta) caches, against MHA of the same size."""
    z = cfg.sizes()
    dt = DTYPES[cfg.dtype]
    ours = KVCache(z["B"], z["h_kv"], z["d_k"], z["s"], dt, device="meta").nbytes
    mha = KVCache(z["B"], z["h"], z["d_k"], z["s"], dt, device="meta").nbytes
    tokens = z["B"] * z["s"]
    return {
        "bytes": ours,
        "bytes_per_token": ours // tokens,
        "tokens": tokens,
        "mha_bytes": mha,
        "mha_bytes_per_token": mha // tokens,
        "ratio_vs_mha": mha / ours,
    }


def _warnings(stages: tuple[Stage, ...]) -> list[str]:
    big = [st for st in stages if st.elements > LARGE_ELEMENTS]
    if not big:
        return []
    names = ", ".join(st.name for st in big)
    return [
        f"{names} would hold over 2**40 elements each (up to {max(s.bytes for s in big):,} bytes):"
        " no single accelerator holds that; fused kernels (FlashAttention, SDPA) never store"
        " the n·s pattern, and real runs split the batch or the sequence"
    ]


def _with_verdict(report: ShapeReport) -> ShapeReport:
    cfg = report.config
    preserve = (
        "shape-preserving: B×n×d_model in and out (W_O maps h·d_k = d_model back to d_model), "
        "so the output adds onto the residual stream and blocks stack"
        if report.shape_preserving
        else "NOT shape-preserving"
    )
    d_k = cfg.sizes()["d_k"]
    verdict = f"{cfg.kind}, h={cfg.n_heads}, h_kv={cfg.h_kv}, d_k={d_k}; {preserve}"
    return replace(report, verdict=verdict)


def _canonical_dtype(dtype: str) -> str:
    """'bf16' → 'bfloat16'; anything unknown is passed on for check_shape_config to report."""
    if isinstance(dtype, str) and dtype in DTYPES:
        return str(DTYPES[dtype]).removeprefix("torch.")  # a DTYPE_NAMES name
    return dtype


def _kv_sentence(kv: dict[str, int | float]) -> str:
    compared = (
        f"plain MHA would hold {format_bytes(kv['mha_bytes'])}, {kv['ratio_vs_mha']:g}× as much"
        if kv["ratio_vs_mha"] != 1
        else "this is MHA: every head keeps its own keys and values"
    )
    return (
        f"KV cache: {format_bytes(kv['bytes_per_token'])} per token, "
        f"{format_bytes(kv['bytes'])} for {kv['tokens']:,} tokens (B·s); {compared}"
    )


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _or(values: list[int]) -> str:
    return " or ".join(map(str, values))


def _short(values: list[int], limit: int = 16) -> str:
    if len(values) <= limit:
        return ", ".join(map(str, values))
    head, tail = values[: limit // 2], values[-limit // 2 :]
    return ", ".join(map(str, head)) + ", …, " + ", ".join(map(str, tail))


def format_bytes(n: int | float) -> str:
    """Bytes in binary units for people: 40960 → '40.0 KiB'."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if abs(n) < 1024 or unit == "PiB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")
