"""The shape report's figures, and the layer's shapes in closed form: no torch here.

:class:`ShapeReport` is what :func:`headlab.shapes.trace_shapes` reads off the real layer run on
the ``meta`` device (report.py). :func:`table_shapes` writes the same report from the shape table
(:data:`headlab.shapes.config.STAGES`) and the layer's parameter and cache layout, without
importing torch, so that ``headlab shapes`` answers in a fraction of torch's own import; the
tests hold the two reports equal, field by field, over hundreds of sizes (as they hold the
page's offline twin, offline/shapes.js), and ``headlab shapes --trace`` runs the real layer and
checks the table against it.

Shape legend (as in attention.py): B batch, n query positions, s key positions (cache_len + n),
d_model width, h query heads, h_kv key/value heads, d_k each head's width.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from headlab.shapes.config import (
    ITEMSIZE,
    LARGE_ELEMENTS,
    N2_STAGES,
    STAGES,
    ShapeConfig,
    check_shape_config,
    shape_config,
    stage_flops,
)


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
    source: str = "table"  # "trace": read off the real layer on meta; "table": closed form

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
        elem = ITEMSIZE.get(self.config.dtype, 0)
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
            kv_sentence(self.kv_cache),
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
        ``verdict`` (one sentence); ``summary`` (sentences for people); ``source``: "trace"
        (read off the real layer run on meta) or "table" (closed form). An invalid report has
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
            "source": self.source,
        }

    def differences(self, other: ShapeReport) -> list[str]:
        """The keys of :meth:`to_dict` whose values differ between the two reports (their
        ``source`` aside): empty when the table and the trace agree."""
        a, b = self.to_dict(), other.to_dict()
        return [key for key in a if key != "source" and a[key] != b.get(key)]


def symbolic_shape(cfg: ShapeConfig, pattern: str) -> str:
    """A STAGES pattern for this layer: h_kv named only where it differs from h, and s only
    where a cache makes it differ from n."""
    same = {"h_kv": "h"} if cfg.h_kv == cfg.n_heads else {}
    if cfg.cache_len == 0:
        same["s"] = "n"
    dims = ("·".join(same.get(f, f) for f in dim.split("·")) for dim in pattern.split("×"))
    return "×".join(dims)


def param_tensor(cfg: ShapeConfig, name: str, shape: tuple[int, ...]) -> ParamTensor:
    """The parameter ``name`` ("W_Q.weight", …) of the layer, as a tensor of ``shape`` holds it."""
    width = {"W_Q": "h·d_k", "W_K": "h_kv·d_k", "W_V": "h_kv·d_k", "W_O": "d_model"}
    matrix, kind = name.split(".")
    out = symbolic_shape(cfg, width[matrix])
    fan_in = "h·d_k" if matrix == "W_O" else "d_model"
    symbolic = out if kind == "bias" else f"{out}×{fan_in}"  # nn.Linear stores (out, in)
    return ParamTensor(name, symbolic, shape, math.prod(shape))


def warnings_of(stages: tuple[Stage, ...]) -> list[str]:
    big = [st for st in stages if st.elements > LARGE_ELEMENTS]
    if not big:
        return []
    names = ", ".join(st.name for st in big)
    return [
        f"{names} would hold over 2**40 elements each (up to {max(s.bytes for s in big):,} bytes):"
        " no single accelerator holds that; fused kernels (FlashAttention, SDPA) never store"
        " the n·s pattern, and real runs split the batch or the sequence"
    ]


def with_verdict(report: ShapeReport) -> ShapeReport:
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


def kv_sentence(kv: dict[str, int | float]) -> str:
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


def table_shapes(
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
    """:func:`headlab.shapes.trace_shapes`'s report for the same arguments, in closed form.

    Every stage's shape is its :data:`STAGES` pattern at these sizes, in the order the layer
    computes them: the cached keys and values (``k_all``, ``v_all``) only with a cache, the
    expanded ones (``k_rep``, ``v_rep``) only when K/V heads are shared (h_kv < h); every
    tensor in the requested dtype. Parameters are ``nn.Linear``'s (out, in) weights and (out,)
    biases; the KV cache holds keys and values, (B, h_kv, s, d_k) each, and a streaming
    cache's position keeps the keys before rotary too. Invalid sizes are answered as there.
    """
    cfg = shape_config(d_model, n_heads, seq_len, batch, n_kv_heads, bias, dtype, cache_len, d_k)
    problems = check_shape_config(cfg)
    if problems:
        return ShapeReport(cfg, valid=False, problems=tuple(problems))
    z = cfg.sizes()
    item = ITEMSIZE[cfg.dtype]
    stages = tuple(
        closed_stage(cfg, name, _evaluate(pattern, z), cfg.dtype, item)
        for name, (_, pattern) in STAGES.items()
        if _present(cfg, name)
    )
    q, kv = z["h"] * z["d_k"], z["h_kv"] * z["d_k"]
    shapes = {"W_Q": (q, z["d_model"]), "W_K": (kv, z["d_model"]),
              "W_V": (kv, z["d_model"]), "W_O": (z["d_model"], q)}  # fmt: skip
    params = tuple(
        param_tensor(cfg, f"{m}.{kind}", shape if kind == "weight" else shape[:1])
        for m, shape in shapes.items()
        for kind in (("weight", "bias") if cfg.bias else ("weight",))
    )
    report = ShapeReport(cfg, valid=True, problems=(), warnings=tuple(warnings_of(stages)),
                         stages=stages, param_tensors=params, kv_cache=_kv_cache(z, item),
                         shape_preserving=stages[0].shape == stages[-1].shape)  # fmt: skip
    return with_verdict(report)


def closed_stage(
    cfg: ShapeConfig, name: str, shape: tuple[int, ...], dtype: str, itemsize: int
) -> Stage:
    """Stage ``name`` of a tensor of ``shape`` and ``dtype`` (``itemsize`` bytes per element)."""
    label, pattern = STAGES.get(name, (name, "?"))
    elements = math.prod(shape)
    return Stage(name=name, label=label, symbolic=symbolic_shape(cfg, pattern), shape=shape,
                 dtype=dtype, elements=elements, bytes=elements * itemsize,
                 flops=stage_flops(cfg, name), n2=name in N2_STAGES)  # fmt: skip


def kv_figures(bytes_of: Any, z: dict[str, int], slot: int) -> dict[str, int | float]:
    """The KV-cache figures from ``bytes_of(h_kv)``, the bytes of one layer's cache with that
    many K/V heads at these sizes, and ``slot``, a streaming cache's bytes per kept position."""
    ours, mha, mqa = bytes_of(z["h_kv"]), bytes_of(z["h"]), bytes_of(1)
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


def _kv_cache(z: dict[str, int], item: int) -> dict[str, int | float]:
    """Keys and values, (B, h_kv, s, d_k) each; a streaming position keeps raw keys as well."""
    return kv_figures(lambda heads: 2 * z["B"] * heads * z["s"] * z["d_k"] * item, z,
                      3 * z["h_kv"] * z["d_k"] * item)  # fmt: skip


def _present(cfg: ShapeConfig, name: str) -> bool:
    """Whether the layer records stage ``name`` at these sizes."""
    if name in ("k_all", "v_all"):
        return cfg.cache_len > 0
    if name in ("k_rep", "v_rep"):
        return cfg.h_kv != cfg.n_heads
    return True


def _evaluate(pattern: str, z: dict[str, int]) -> tuple[int, ...]:
    """A STAGES pattern ("B×h×n×d_k") at the sizes ``z``."""
    return tuple(math.prod(z[f] for f in dim.split("·")) for dim in pattern.split("×"))
