"""Attention layer sizes a user may ask for, and the checks that say what is wrong with one.

Shape legend (as in attention.py): B batch, n query positions, s key positions (cache_len + n),
d_model width, h query heads, h_kv key/value heads, d_k each head's width: d_model // h unless
given (Gemma 3 270M: 256 at d_model 640 with 4 heads, so h·d_k need not equal d_model).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from headlab.numbers import valid_head_counts

# No torch here: `headlab shapes --help` and its argument errors read this module (LIMITS, the
# checks) and answer before torch is imported; the report (report.py) runs the layer.

# dtype names a user may type → torch's name of the dtype the layer is run in
# (report.DTYPES maps the same names onto the torch dtypes themselves)
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


# one name per dtype, as reports and the page's menu write it (the aliases above map onto these)
DTYPE_NAMES: tuple[str, ...] = tuple(dict.fromkeys(DTYPE_ALIASES.values()))


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
    "d_k": (1, 2**20),
}


# how FLOPs are counted, in the words the CLI, the page and the README use
FLOP_CONVENTION = (
    "FLOPs count the matrix products, a multiply-add as 2; the bias adds, the 1/√d_k scale "
    "and the softmax are not counted"
)


# above this the configuration is refused too: a FLOP count must fit a 64-bit integer (JSON
# encoders and the page's numbers); 2**62 is about a million times a GPT-3 layer at 131k tokens
MAX_FLOPS = 2**62


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
            "d_k": self.head_width,
        }

    @property
    def head_width(self) -> int:
        """d_k: the width given, else d_model // h (0 while h is not a positive integer)."""
        if self.d_k is not None:
            return self.d_k
        return self.d_model // self.n_heads if _is_int(self.n_heads) and self.n_heads > 0 else 0

    @property
    def heads_fill_width(self) -> bool:
        """h·d_k == d_model: true unless a head width is given that makes them differ."""
        return self.n_heads * self.head_width == self.d_model

    def head_counts(self) -> dict[str, list[int]]:
        """The head counts that would be valid here, which the calculator offers to pick:
        ``valid_head_counts``, the h that split ``d_model`` evenly, and ``valid_kv_head_counts``,
        the h_kv that split ``n_heads`` into equal groups (both ascending divisors)."""
        return {
            "valid_head_counts": _divisors(self.d_model),
            "valid_kv_head_counts": _divisors(self.n_heads),
        }


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
    largest = _largest_tensor(cfg)
    if largest > MAX_ELEMENTS:
        return [
            f"the largest tensor would hold {largest:,} elements "
            f"(about 2**{math.log2(largest):.0f}), over the limit of 2**50; choose smaller sizes"
        ]
    problems = _divisibility_problems(cfg)
    flops = sum(stage_flops(cfg, name) for name in STAGES)
    if not problems and flops > MAX_FLOPS:
        problems.append(
            f"the layer would take {flops:,} FLOPs (about 2**{math.log2(flops):.0f}), over the "
            "limit of 2**62; choose a smaller batch, sequence or width"
        )
    return problems


def nearest_divisors(value: int, of: int) -> list[int]:
    """The divisors of ``of`` closest to ``value``: the one below and the one above (if any)."""
    divisors = _divisors(of)
    below = [d for d in divisors if d < value]
    above = [d for d in divisors if d > value]
    return ([below[-1]] if below else []) + ([above[0]] if above else [])


def _divisibility_problems(cfg: ShapeConfig) -> list[str]:
    problems = []
    d, h = cfg.d_model, cfg.n_heads
    if cfg.d_k is None and d % h:  # a given head width need not split d_model
        problems.append(
            f"d_model={d} is not divisible by n_heads={h}, so the heads cannot split the width "
            f"evenly; nearest valid head counts: {_or(nearest_divisors(h, d))} "
            f"(any divisor of {d}: {_short(_divisors(d))})"
        )
    h_kv = cfg.h_kv
    # (a head count over d_model without a given d_k is already reported above)
    if (h <= d or cfg.d_k is not None) and h % h_kv:
        problems.append(
            f"n_heads={h} is not divisible by n_kv_heads={h_kv}, so the query heads cannot share "
            f"K/V heads in equal groups; nearest valid K/V head counts: "
            f"{_or(nearest_divisors(h_kv, h))} (any divisor of {h}: {_short(_divisors(h))})"
        )
    return problems


def _largest_tensor(cfg: ShapeConfig) -> int:
    """Closed-form element count of the layer's largest tensor, checked before building it.
    (With d_k = d_model // h, h·d_k·d_model ≤ d_model² and B·n·h·d_k ≤ B·n·d_model.)"""
    z = cfg.sizes()
    return max(
        z["B"] * z["n"] * z["d_model"],
        z["B"] * z["h"] * z["n"] * z["s"],
        z["d_model"] * z["d_model"],
        z["B"] * z["h"] * z["s"] * z["d_k"],
        z["h"] * z["d_k"] * z["d_model"],
        z["B"] * z["n"] * z["h"] * z["d_k"],
    )


def canonical_dtype(dtype: str) -> str:
    """'bf16' → 'bfloat16'; anything unknown is passed on for check_shape_config to report."""
    if isinstance(dtype, str) and dtype in DTYPE_ALIASES:
        return DTYPE_ALIASES[dtype]  # a DTYPE_NAMES name
    return dtype


def _divisors(n: int) -> list[int]:
    return valid_head_counts(n)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _or(values: list[int]) -> str:
    return " or ".join(map(str, values))


def _short(values: list[int], limit: int = 16) -> str:
    if len(values) <= limit:
        return ", ".join(map(str, values))
    head, tail = values[: limit // 2], values[-limit // 2 :]
    return ", ".join(map(str, head)) + ", …, " + ", ".join(map(str, tail))


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


def stage_flops(cfg: ShapeConfig, name: str) -> int:
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
