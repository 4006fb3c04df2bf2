"""The shape report: every tensor of the attention layer, read off the real module run on the
``meta`` device, with parameters, FLOPs, bytes and the KV cache. (The report's types and its
closed form, which needs no torch, are in figures.py.)
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from headlab.attention import KVCache, MultiHeadAttention
from headlab.shapes.config import DTYPE_ALIASES, ShapeConfig, check_shape_config, shape_config
from headlab.shapes.figures import (
    ParamTensor,
    ShapeReport,
    Stage,
    format_bytes,
    stated_report,
    statement_for,
    table_shapes,
)
from headlab.trace import Trace

__all__ = [
    "DTYPES",
    "ParamTensor",
    "ShapeReport",
    "Stage",
    "format_bytes",
    "table_shapes",
    "trace_shapes",
]

# every dtype name a user may type (DTYPE_ALIASES) → the torch dtype the layer is run in
_TORCH_DTYPES = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float64": torch.float64,
}
DTYPES: dict[str, torch.dtype] = {a: _TORCH_DTYPES[name] for a, name in DTYPE_ALIASES.items()}


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
        return ShapeReport(cfg, valid=False, problems=tuple(problems), source="trace")
    trace, module = _run_on_meta(cfg)
    stated = statement_for(cfg)
    stages = [
        stated.call("stage", name, list(t.shape), _dtype_name(t), t.element_size())
        for name, t in trace.items()
    ]
    params = [stated.call("param", n, list(p.shape)) for n, p in module.named_parameters()]
    return stated_report(cfg, "trace", stages=stages, param_tensors=params, **_kv_cache(cfg))


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
    with torch.no_grad(), _MetaKernels():
        x = torch.empty(cfg.batch, cfg.seq_len, cfg.d_model, dtype=DTYPES[cfg.dtype], device="meta")
        cache = None
        if cfg.cache_len:
            cache = runner.new_cache(cfg.batch, cfg.cache_len + cfg.seq_len)
            cache.length = cfg.cache_len  # positions "already there": shapes are all meta needs
        runner(x, cache=cache, impl="explicit", trace=trace)
    return trace, module


class _MetaKernels(TorchDispatchMode):
    """The meta results of the trace's products and softmax, made here rather than by PyTorch.

    On the meta device PyTorch computes the results of ``mm``, ``bmm``, ``_softmax`` and ``mul``
    in Python (torch._meta_registrations, torch._refs). Their first calls import what a shape
    never needs: ``torch._check`` imports torch.fx's symbolic shapes and sympy (0.7 s), and
    ``mul``'s type-promotion wrapper torch._dynamo (1.5 s), each about half to all of
    ``import torch`` itself. This mode answers those four ops on meta tensors with an empty
    meta tensor of the result's shape and dtype, as their meta kernels do: (n, k)·(k, m) →
    (n, m); (b, n, k)·(b, k, m) → (b, n, m); softmax keeps the shape (float32 when asked to
    upcast half); ``a * b`` has the broadcast shape and the promoted dtype, filled in place
    (``copy_`` then ``mul_``, whose kernels are not Python). Inputs these rules do not cover
    (mismatched sizes or dtypes) go to PyTorch's own kernel, which raises its own error; every
    other op runs unchanged. The tests hold each result to PyTorch's own meta kernel.
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
        kernel = _KERNELS.get(func)
        if kernel is not None and not kwargs and args[0].device.type == "meta":
            out = kernel(*args)
            if out is not None:
                return out
        return func(*args, **(kwargs or {}))


def _mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor | None:
    if a.dim() != 2 or b.dim() != 2 or a.shape[1] != b.shape[0] or a.dtype != b.dtype:
        return None
    return torch.empty(a.shape[0], b.shape[1], dtype=a.dtype, device="meta")


def _bmm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor | None:
    if a.dim() != 3 or b.dim() != 3 or a.dtype != b.dtype:
        return None
    if a.shape[0] != b.shape[0] or a.shape[2] != b.shape[1]:
        return None
    return torch.empty(a.shape[0], a.shape[1], b.shape[2], dtype=a.dtype, device="meta")


def _softmax(x: torch.Tensor, dim: int, half_to_float: bool) -> torch.Tensor | None:
    if not -x.dim() <= dim < max(x.dim(), 1) or (half_to_float and x.dtype != torch.half):
        return None
    return torch.empty(x.shape, dtype=torch.float32 if half_to_float else x.dtype, device="meta")


def _mul(a: torch.Tensor, b: Any) -> torch.Tensor | None:
    """``a * b``, b a tensor or a Python number (the scores' 1/√d_k)."""
    shape = _broadcast(tuple(a.shape), tuple(getattr(b, "shape", ())))
    if shape is None:
        return None
    out = torch.empty(shape, dtype=torch.result_type(a, b), device="meta")
    return out.copy_(a).mul_(b)


def _broadcast(x: tuple[int, ...], y: tuple[int, ...]) -> tuple[int, ...] | None:
    """NumPy's broadcast of two shapes, or None where they do not broadcast (torch's own
    ``broadcast_shapes`` imports sympy on its first call)."""
    width = max(len(x), len(y))
    x, y = (1,) * (width - len(x)) + x, (1,) * (width - len(y)) + y
    if any(i != j and 1 not in (i, j) for i, j in zip(x, y, strict=True)):
        return None
    return tuple(j if i == 1 else i for i, j in zip(x, y, strict=True))


_KERNELS: dict[Any, Callable[..., torch.Tensor | None]] = {
    torch.ops.aten.mm.default: _mm,
    torch.ops.aten.bmm.default: _bmm,
    torch.ops.aten._softmax.default: _softmax,
    torch.ops.aten.mul.Tensor: _mul,
}


def _dtype_name(t: torch.Tensor) -> str:
    return str(t.dtype).removeprefix("torch.")


def _kv_cache(cfg: ShapeConfig) -> dict[str, int]:
    """KV-cache bytes for this layer, from real (meta) caches, against MHA (h K/V heads) and MQA
    (one) of the same size; ``sink_slot_bytes``: what one kept position of a StreamingLLM
    cache (:class:`headlab.model.streaming.SinkCache`) holds per sequence, keys before rotary
    included, which the page's streaming figure multiplies by the positions each policy keeps.
    The statement derives the rest (per token, the ratio) from these."""
    from headlab.model.streaming import SinkCache

    z = cfg.sizes()
    dt = DTYPES[cfg.dtype]

    def bytes_of(heads: int) -> int:
        return KVCache(z["B"], heads, z["d_k"], z["s"], dt, device="meta").nbytes

    return {
        "cache_bytes": bytes_of(z["h_kv"]),
        "mha_cache_bytes": bytes_of(z["h"]),
        "mqa_cache_bytes": bytes_of(1),
        "sink_slot_bytes": SinkCache(1, z["h_kv"], z["d_k"], 0, 1, dt, device="meta").nbytes,
    }
