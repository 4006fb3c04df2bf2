"""Attention layer sizes a user may ask for, and the checks that say what is wrong with one.

Shape legend (as in attention.py): B batch, n query positions, s key positions (cache_len + n),
d_model width, h query heads, h_kv key/value heads, d_k each head's width: d_model // h unless
given (Gemma 3 270M: 256 at d_model 640 with 4 heads, so h·d_k need not equal d_model).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from headlab.shapes import statement
from headlab.shapes.statement import (
    DTYPE_ALIASES,
    FIELDS,
    ITEMSIZE,
    LARGE_ELEMENTS,
    MAX_ELEMENTS,
    MAX_FLOPS,
    N2_STAGES,
    STAGES,
)

# No torch here: `headlab shapes --help` and its argument errors read this module (LIMITS, the
# checks) and answer before torch is imported; the report (report.py) runs the layer. The sizes,
# shapes, counts and checks themselves are stated once, in statement.py, which the static site's
# browser reads too.

__all__ = [
    "DTYPE_ALIASES",
    "DTYPE_NAMES",
    "FLOP_CONVENTION",
    "ITEMSIZE",
    "LARGE_ELEMENTS",
    "LIMITS",
    "MAX_ELEMENTS",
    "MAX_FLOPS",
    "N2_STAGES",
    "STAGES",
    "ShapeConfig",
    "check_shape_config",
    "nearest_divisors",
    "shape_config",
]

# one name per dtype, as reports and the page's menu write it (the aliases map onto these)
DTYPE_NAMES: tuple[str, ...] = tuple(dict.fromkeys(DTYPE_ALIASES.values()))


# the sizes a request may ask for (the CLI's options and the API's schema): (least, most)
LIMITS: dict[str, tuple[int, int]] = {
    name: (field["least"], field["most"]) for name, field in FIELDS.items()
}


# how FLOPs are counted, in the words the CLI, the page and the README use
FLOP_CONVENTION = (
    "FLOPs count the matrix products, a multiply-add as 2; the bias adds, the 1/√d_k scale "
    "and the softmax are not counted"
)


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
    d_k: int | None = None  # each head's width; None means d_model // h (Gemma 3: 256 ≠ 640 / 4)

    @property
    def h_kv(self) -> int:
        """Key/value heads: n_kv_heads, else h (MHA)."""
        return self.read("h_kv")

    @property
    def kind(self) -> str:
        """ "MHA", "GQA" or "MQA"."""
        return str(self.read("kind"))

    def sizes(self) -> dict[str, int]:
        """The legend's symbols with their values: B, n, s, d_model, h, h_kv, d_k."""
        return dict(self.read("sizes"))

    @property
    def head_width(self) -> int:
        """d_k: the width given, else d_model // h (0 while h is not a positive integer)."""
        return self.read("d_k")

    @property
    def heads_fill_width(self) -> bool:
        """h·d_k == d_model: true unless a head width is given that makes them differ."""
        return bool(self.read("heads_fill_width"))

    def head_counts(self) -> dict[str, list[int]]:
        """The head counts that would be valid here, which the calculator offers to pick:
        ``valid_head_counts``, the h that split ``d_model`` evenly, and ``valid_kv_head_counts``,
        the h_kv that split ``n_heads`` into equal groups (both ascending divisors)."""
        return dict(self.read("head_counts"))

    def read(self, name: str) -> Any:
        """The shape statement's ``name`` for these sizes (:mod:`headlab.shapes.statement`)."""
        return statement.scope({f.name: getattr(self, f.name) for f in fields(self)})[name]


def shape_config(
    d_model: int,
    n_heads: int,
    seq_len: int,
    batch: int,
    n_kv_heads: int | None = None,
    bias: bool = True,
    dtype: str = "float32",
    cache_len: int = 0,
    d_k: int | None = None,
) -> ShapeConfig:
    """The :class:`ShapeConfig` that ``trace_shapes`` with these arguments reports on, its dtype
    under its one name ('bf16' → 'bfloat16'); :func:`check_shape_config` says what is wrong."""
    name = canonical_dtype(dtype)
    return ShapeConfig(d_model, n_heads, seq_len, batch, n_kv_heads, bias, name, cache_len, d_k)


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
    if cfg.d_k is not None and (not _is_int(cfg.d_k) or cfg.d_k < 1):
        problems.append(
            f"d_k must be a positive integer or None (then d_model // n_heads), got {cfg.d_k!r}"
        )
    if not _is_int(cfg.cache_len) or cfg.cache_len < 0:
        problems.append(f"cache_len must be an integer >= 0, got {cfg.cache_len!r}")
    if not isinstance(cfg.bias, bool):
        problems.append(f"bias must be True or False, got {cfg.bias!r}")
    if cfg.dtype not in DTYPE_ALIASES:
        problems.append(f"unknown dtype {cfg.dtype!r}; valid: {', '.join(DTYPE_ALIASES)}")
    if problems:
        return problems
    return list(cfg.read("size_problems"))


def nearest_divisors(value: int, of: int) -> list[int]:
    """The divisors of ``of`` closest to ``value``: the one below and the one above (if any)."""
    return list(statement.scope({}).call("nearest", value, of))


def canonical_dtype(dtype: str) -> str:
    """'bf16' → 'bfloat16'; anything unknown is passed on for check_shape_config to report."""
    if isinstance(dtype, str) and dtype in DTYPE_ALIASES:
        return DTYPE_ALIASES[dtype]  # a DTYPE_NAMES name
    return dtype


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
