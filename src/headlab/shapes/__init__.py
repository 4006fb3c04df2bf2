"""The shape and parameter calculator: every tensor of the attention layer, for any size.

The report is read off the real :class:`~headlab.attention.MultiHeadAttention`: the module is built
and run on PyTorch's ``meta`` device with a :class:`~headlab.trace.Trace`, so every recorded tensor
has its true shape and dtype but no storage (:func:`trace_shapes`). Nothing is allocated, and even
GPT-3's width with a 131,072-token context and a batch of 64 takes a couple of milliseconds.
:func:`table_shapes` writes the same report in closed form from the shape statement, without torch:
the command line answers with it in a fraction of torch's import (``--trace`` runs the layer and
checks it), and the tests hold the two equal, field by field, over hundreds of sizes.

Shape legend (as in attention.py): B batch, n query positions, s key positions (cache_len + n),
d_model width, h query heads, h_kv key/value heads, d_k each head's width (d_model // h unless
given).

FLOPs count the matrix products only, a multiply-add as 2 (Kaplan et al. 2020's convention, and
what ``torch.utils.flop_counter`` counts); the bias adds, the 1/√d_k scale and the softmax are
O(B·h·n·s) element-wise work against the products' O(B·h·n·s·d_k), and are left out.

    statement every size, shape, count, check and sentence of the report, written once as
              Python expressions that this package and the static site's browser evaluate
    formula   the small language the statement is written in: compiled to JSON trees, evaluated
    config    the sizes a user may ask for (:class:`ShapeConfig`, :data:`LIMITS`, dtypes) and
              the checks that name what is wrong; no torch
    presets   the published models' sizes (:data:`PRESETS`); no torch
    figures   :class:`ShapeReport` and its parts, and :func:`table_shapes`; no torch
    report    :func:`trace_shapes`, which runs the layer (torch)

Papers: Vaswani et al. 2017 (multi-head attention), Shazeer 2019 (MQA), Ainslie et al. 2023 (GQA).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from headlab.shapes.config import (
    DTYPE_ALIASES,
    DTYPE_NAMES,
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
    shape_config,
)
from headlab.shapes.figures import ParamTensor, ShapeReport, Stage, format_bytes, table_shapes
from headlab.shapes.presets import PRESETS, Preset

if TYPE_CHECKING:  # the checker sees the real names; at run time they load on first use
    from headlab.shapes.report import DTYPES, trace_shapes

__all__ = [
    "DTYPES",
    "DTYPE_ALIASES",
    "DTYPE_NAMES",
    "FLOP_CONVENTION",
    "LARGE_ELEMENTS",
    "LIMITS",
    "MAX_ELEMENTS",
    "MAX_FLOPS",
    "N2_STAGES",
    "PRESETS",
    "STAGES",
    "ParamTensor",
    "Preset",
    "ShapeConfig",
    "ShapeReport",
    "Stage",
    "check_shape_config",
    "format_bytes",
    "nearest_divisors",
    "shape_config",
    "table_shapes",
    "trace_shapes",
]

# the names that run the layer, and so need torch: imported on first use (PEP 562), so that
# `headlab shapes --help` and a refused size never import torch
_REPORT = frozenset({"DTYPES", "trace_shapes"})


def __getattr__(name: str) -> Any:
    """A name of report.py, imported on first access and kept as a module attribute."""
    if name not in _REPORT:
        raise AttributeError(f"module 'headlab.shapes' has no attribute {name!r}")
    from headlab.shapes import report

    value = getattr(report, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
