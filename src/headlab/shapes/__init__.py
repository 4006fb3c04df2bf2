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

    config    the sizes a user may ask for (:class:`ShapeConfig`, :data:`LIMITS`, dtypes) and
              the checks that name what is wrong
    report    :func:`trace_shapes` and its :class:`ShapeReport`; the published :data:`PRESETS`

Papers: Vaswani et al. 2017 (multi-head attention), Shazeer 2019 (MQA), Ainslie et al. 2023 (GQA).
"""

from headlab.shapes.config import (
    DTYPE_NAMES,
    DTYPES,
    FLOP_CONVENTION,
    LARGE_ELEMENTS,
    LIMITS,
    MAX_ELEMENTS,
    MAX_FLOPS,
    N2_STAGES,
    STAGES,
    ShapeConfig,
    check_shape_config,
    nearest_divisors,
)
from headlab.shapes.report import (
    PRESETS,
    ParamTensor,
    Preset,
    ShapeReport,
    Stage,
    format_bytes,
    trace_shapes,
)

__all__ = [
    "DTYPES", "DTYPE_NAMES", "FLOP_CONVENTION", "LARGE_ELEMENTS", "LIMITS", "MAX_ELEMENTS",
    "MAX_FLOPS", "N2_STAGES", "PRESETS", "STAGES", "ParamTensor", "Preset", "ShapeConfig",
    "ShapeReport", "Stage", "check_shape_config", "format_bytes", "nearest_divisors",
    "trace_shapes",
]  # fmt: skip
