"""The shape report: every tensor of the attention layer, read off the real module run on the
``meta`` device, with parameters, FLOPs, bytes and the KV cache.
"""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from headlab.attention import KVCache, MultiHeadAttention
from headlab.shapes.config import (
    DTYPE_ALIASES,
    LARGE_ELEMENTS,
    N2_STAGES,
    STAGES,
    ShapeConfig,
    check_shape_config,
    shape_config,
    stage_flops,
)
from headlab.trace import Trace

# every dtype name a user may type (DTYPE_ALIASES) → the torch dtype the layer is run in
_TORCH_DTYPES = {"float32": torch.float32, "float16": torch.float16,
                 "bfloat16": torch.bfloat16, "float64": torch.float64}  # fmt: skip
DTYPES: dict[str, torch.dtype] = {a: _TORCH_DTYPES[name] for a, name in DTYPE_ALIASES.items()}


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
        cfg = self.config
        mha = cfg.kind == "MHA" and cfg.bias and cfg.heads_fill_width
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
        mha_bytes, mha_bytes_per_token, ratio_vs_mha, mqa_bytes, mqa_bytes_per_token,
        sink_bytes_per_token}``; ``shape_preserving`` (bool);
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


def trace_shapes(
    d_model: int,
    n_heads: int,
    seq_len: int,
    batch: int,
    n_kv_heads: int | None = None,
    bias: bool = True,
    dtype: str = "float32",
    cache_len: int = 0,
    d_k: int | None = None,
) -> ShapeReport:
    """Every tensor, parameter, FLOP and byte of one attention layer, from running it.

    Builds ``MultiHeadAttention(d_model, n_heads, n_kv_heads, bias, d_k=d_k)`` on the ``meta``
    device (``d_k`` None: d_model // h; given, each head's width, as Gemma's 256 at 640 / 4), feeds
    it X (B=batch, n=seq_len, d_model) — after ``cache_len`` positions already in a KV cache when
    that is positive — and reads the shapes off a :class:`Trace`. Invalid or absurd sizes are
    answered with ``valid=False`` and ``problems`` (each says what would be valid), not raised.
    See :meth:`ShapeReport.to_dict` for the JSON keys.
    """
    cfg = shape_config(d_model, n_heads, seq_len, batch, n_kv_heads, bias, dtype, cache_len, d_k)
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


@functools.lru_cache(maxsize=64)
def _meta_module(
    d_model: int, n_heads: int, n_kv_heads: int, bias: bool, dtype: str, d_k: int | None
) -> MultiHeadAttention:
    """The real layer on the meta device (cached: the page asks on every keystroke)."""
    with torch.device("meta"):
        layer = MultiHeadAttention(d_model, n_heads, n_kv_heads, bias=bias, d_k=d_k)
        return layer.to(DTYPES[dtype])


def _run_on_meta(cfg: ShapeConfig) -> tuple[Trace, MultiHeadAttention]:
    """Trace one forward pass on meta; return the trace and the module the user asked for.

    The pass runs on the bias-free twin of the layer: on meta, a Linear with a bias becomes
    ``addmm``, which PyTorch decomposes in Python (about 2 ms for the four projections), and a
    bias changes no shape. The parameters are read from the module with the requested bias.
    """
    module = _meta_module(cfg.d_model, cfg.n_heads, cfg.h_kv, cfg.bias, cfg.dtype, cfg.d_k)
    runner = _meta_module(cfg.d_model, cfg.n_heads, cfg.h_kv, False, cfg.dtype, cfg.d_k)
    trace = Trace()
    # no torch.device("meta") mode here: x and the module are on meta already, and the mode
    # would route every op through __torch_function__
    with torch.no_grad(), _MetaProductsInPlace():
        x = torch.empty(cfg.batch, cfg.seq_len, cfg.d_model, dtype=DTYPES[cfg.dtype], device="meta")
        cache = None
        if cfg.cache_len:
            cache = runner.new_cache(cfg.batch, cfg.cache_len + cfg.seq_len)
            cache.length = cfg.cache_len  # positions "already there": shapes are all meta needs
        runner(x, cache=cache, impl="explicit", trace=trace)
    return trace, module


class _MetaProductsInPlace(TorchDispatchMode):
    """Run ``a * b`` on meta tensors as a copy into the result, then ``mul_``.

    On the meta device ``mul``'s result comes from PyTorch's Python reference (torch._refs),
    whose type-promotion wrapper imports torch._dynamo on its first call: 1.5 s, about as long
    as ``import torch`` itself, for one product (the scores' 1/√d_k). The in-place kernel's
    meta function does not. The result is the same tensor ``mul`` makes: the broadcast shape,
    the promoted dtype (``torch.result_type``), on meta. Every other op runs unchanged.
    """

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # TorchDispatchMode wraps a mode's __torch_dispatch__ in torch._disable_dynamo, whose
        # first call imports torch._dynamo: the very import this mode exists to avoid. The
        # meta pass is never compiled, so there is nothing for dynamo to skip.
        return False

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict | None = None
    ) -> Any:
        if func is not torch.ops.aten.mul.Tensor or kwargs or args[0].device.type != "meta":
            return func(*args, **(kwargs or {}))
        a, b = args  # b: a tensor or a Python number (the scale)
        shape = torch.broadcast_shapes(a.shape, getattr(b, "shape", ()))
        out = torch.empty(shape, dtype=torch.result_type(a, b), device="meta")
        return out.copy_(a).mul_(b)


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
        flops=stage_flops(cfg, name),
        n2=name in N2_STAGES,
    )


def _param(cfg: ShapeConfig, name: str, p: torch.Tensor) -> ParamTensor:
    width = {"W_Q": "h·d_k", "W_K": "h_kv·d_k", "W_V": "h_kv·d_k", "W_O": "d_model"}
    matrix, kind = name.split(".")
    out = _symbolic(cfg, width[matrix])
    fan_in = "h·d_k" if matrix == "W_O" else "d_model"
    symbolic = out if kind == "bias" else f"{out}×{fan_in}"  # nn.Linear stores (out, in)
    return ParamTensor(name, symbolic, tuple(p.shape), p.numel())


def _kv_cache(cfg: ShapeConfig) -> dict[str, int | float]:
    """KV-cache bytes for this layer, from real (meta) caches, against MHA (h K/V heads) and MQA
    (one) of the same size; ``sink_bytes_per_token``: what one kept position of a StreamingLLM
    cache (:class:`headlab.model.streaming.SinkCache`) holds per sequence, keys before rotary
    included, which the page's streaming figure multiplies by the positions each policy keeps."""
    from headlab.model.streaming import SinkCache

    z = cfg.sizes()
    dt = DTYPES[cfg.dtype]
    ours = KVCache(z["B"], z["h_kv"], z["d_k"], z["s"], dt, device="meta").nbytes
    mha = KVCache(z["B"], z["h"], z["d_k"], z["s"], dt, device="meta").nbytes
    mqa = KVCache(z["B"], 1, z["d_k"], z["s"], dt, device="meta").nbytes
    slot = SinkCache(1, z["h_kv"], z["d_k"], 0, 1, dt, device="meta").nbytes
    tokens = z["B"] * z["s"]
    return {
        "bytes": ours,
        "bytes_per_token": ours // tokens,
        "tokens": tokens,
        "mha_bytes": mha,
        "mha_bytes_per_token": mha // tokens,
        "ratio_vs_mha": mha / ours,
        "mqa_bytes": mqa,
        "mqa_bytes_per_token": mqa // tokens,
        "sink_bytes_per_token": slot,
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
    d_k = cfg.sizes()["d_k"]
    maps = (
        "h·d_k = d_model back to d_model"
        if cfg.heads_fill_width
        else f"h·d_k = {cfg.n_heads * d_k:,} back to d_model = {cfg.d_model:,}"
    )
    preserve = (
        f"shape-preserving: B×n×d_model in and out (W_O maps {maps}), "
        "so the output adds onto the residual stream and blocks stack"
        if report.shape_preserving
        else "NOT shape-preserving"
    )
    verdict = f"{cfg.kind}, h={cfg.n_heads}, h_kv={cfg.h_kv}, d_k={d_k}; {preserve}"
    return replace(report, verdict=verdict)


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


def format_bytes(n: int | float) -> str:
    """Bytes in binary units for people: 40960 → '40.0 KiB'."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if abs(n) < 1024 or unit == "PiB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")
