"""The shape report's figures, and the layer's shapes in closed form: no torch here.

:class:`ShapeReport` is what :func:`headlab.shapes.trace_shapes` reads off the real layer run on
the ``meta`` device (report.py). :func:`table_shapes` writes the same report from the shape
statement (:mod:`headlab.shapes.statement`) alone, without importing torch, so that ``headlab
shapes`` answers in a fraction of torch's own import; the tests hold the two reports equal, field
by field, over hundreds of sizes (and the static site's browser, which evaluates the same
statement, equal to both), and ``headlab shapes --trace`` runs the real layer and checks the
statement against it. Every count, sum and sentence of the report is the statement's; this
module gives it the report's types.

Shape legend (as in attention.py): B batch, n query positions, s key positions (cache_len + n),
d_model width, h query heads, h_kv key/value heads, d_k each head's width.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from headlab.shapes import statement
from headlab.shapes.config import ShapeConfig, check_shape_config, shape_config
from headlab.shapes.formula import Scope


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
        return dict(self._read("params"))

    @property
    def flops(self) -> dict[str, Any]:
        """Total FLOPs, those of the n·s part (QKᵀ and A·V), its share, and per stage."""
        return dict(self._read("flops"))

    @property
    def memory(self) -> dict[str, int]:
        """Bytes of the attention pattern (scores + weights), all activations, the parameters."""
        return dict(self._read("memory"))

    def summary(self) -> list[str]:
        """The report's figures as sentences for people (the CLI prints these)."""
        return list(self._read("summary"))

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
        return dict(self._read("report"))

    def _read(self, name: str) -> Any:
        """The statement's ``name`` for this report's own figures."""
        return statement.scope(
            fields_of(self.config),
            valid=self.valid,
            problems=list(self.problems),
            warnings=list(self.warnings),
            stages=[{**fields_of(st), "shape": list(st.shape)} for st in self.stages],
            param_tensors=[{**fields_of(p), "shape": list(p.shape)} for p in self.param_tensors],
            kv_cache=dict(self.kv_cache),
            shape_preserving=self.shape_preserving,
            verdict=self.verdict,
            source=self.source,
        )[name]

    def differences(self, other: ShapeReport) -> list[str]:
        """The keys of :meth:`to_dict` whose values differ between the two reports (their
        ``source`` aside): empty when the table and the trace agree."""
        a, b = self.to_dict(), other.to_dict()
        return [key for key in a if key != "source" and a[key] != b.get(key)]


def format_bytes(n: int | float) -> str:
    """Bytes in binary units for people: 40960 → '40.0 KiB'."""
    return str(statement.scope({}).call("format_bytes", n))


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

    Every stage's shape is its :data:`~headlab.shapes.STAGES` pattern at these sizes, in the
    order the layer computes them: the cached keys and values (``k_all``, ``v_all``) only with a
    cache, the expanded ones (``k_rep``, ``v_rep``) only when K/V heads are shared (h_kv < h);
    every tensor in the requested dtype. Parameters are ``nn.Linear``'s (out, in) weights and
    (out,) biases; the KV cache holds keys and values, (B, h_kv, s, d_k) each, and a streaming
    cache's position keeps the keys before rotary too. Invalid sizes are answered as there.
    """
    cfg = shape_config(d_model, n_heads, seq_len, batch, n_kv_heads, bias, dtype, cache_len, d_k)
    problems = check_shape_config(cfg)
    if problems:
        return ShapeReport(cfg, valid=False, problems=tuple(problems))
    return stated_report(cfg, "table")


def stated_report(cfg: ShapeConfig, source: str, **measured: Any) -> ShapeReport:
    """The report of a valid ``cfg`` from the statement, with whatever was ``measured`` on the
    real layer (``stages``, ``param_tensors``, the cache bytes) in place of the closed forms."""
    scope = statement.scope(fields_of(cfg), valid=True, problems=[], source=source, **measured)
    return ShapeReport(
        cfg,
        valid=True,
        problems=(),
        warnings=tuple(scope["warnings"]),
        stages=tuple(Stage(**{**st, "shape": tuple(st["shape"])}) for st in scope["stages"]),
        param_tensors=tuple(
            ParamTensor(**{**p, "shape": tuple(p["shape"])}) for p in scope["param_tensors"]
        ),
        kv_cache=dict(scope["kv_cache"]),
        shape_preserving=bool(scope["shape_preserving"]),
        verdict=str(scope["verdict"]),
        source=source,
    )


def statement_for(cfg: ShapeConfig) -> Scope:
    """The statement at ``cfg``'s sizes, to build measured stages and parameters with
    (``stage(name, shape, dtype, itemsize)``, ``param(name, shape)``)."""
    return statement.scope(fields_of(cfg), valid=True, problems=[], source="trace")


def fields_of(record: Any) -> dict[str, Any]:
    """A dataclass's fields as a dict, by name (``asdict`` without its deep copies)."""
    return {f.name: getattr(record, f.name) for f in fields(record)}
