"""The command line starts at once: help, `models`, `shapes` and argument errors import neither
torch nor transformers, and `shapes --trace` imports torch alone of the heavy libraries.

The oracle is Python's own import log (``python -X importtime``), read from a fresh process:
which modules a command imported, not how long it took, so a loaded machine cannot fool it.
(benchmarks/bench_cold_start.py measures the times.)
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

SRC = str(Path(__file__).resolve().parents[2] / "src")
HEAVY = ("torch", "transformers", "fastapi", "matplotlib")


def imported(*args: str) -> tuple[set[str], subprocess.CompletedProcess[str]]:
    """The modules ``headlab ARGS`` imports in a fresh interpreter, and the finished process."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([SRC, os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, "-X", "importtime", "-m", "headlab.cli", *args]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, check=False)
    # each line: "import time: <self us> | <cumulative us> | <indent><dotted name>"
    names = {
        line.rsplit("|", 1)[1].strip()
        for line in proc.stderr.splitlines()
        if line.startswith("import time:") and line.count("|") == 2
    }
    return names, proc


def heavy(names: set[str], which: tuple[str, ...] = HEAVY) -> list[str]:
    """The heavy top-level packages among ``names``."""
    return sorted({n.split(".")[0] for n in names} & set(which))


@pytest.mark.parametrize(
    ("args", "code"),
    [
        (["--help"], 0),
        (["models"], 0),
        (["shapes", "--help"], 0),
        (["heads", "--help"], 0),
        # argument errors: an unknown command or option, a value out of range, an unknown
        # preset or dtype, a size refused by the calculator's checks
        (["no-such-command"], 2),
        (["heads", "--no-such-option"], 2),
        (["shapes", "--d-model", "0"], 2),
        (["shapes", "--preset", "gpt5"], 2),
        (["shapes", "--dtype", "int4"], 2),
        (["shapes", "--seq", "16777216", "--batch", "65536"], 2),
    ],
    ids=lambda v: " ".join(v) if isinstance(v, list) else f"exit {v}",
)
def test_help_models_and_argument_errors_import_no_heavy_library(args, code):
    names, proc = imported(*args)
    assert proc.returncode == code, proc.stdout + proc.stderr
    assert "headlab.cli" in names  # the log was read: the command line itself is in it
    assert heavy(names) == [], f"`headlab {' '.join(args)}` imported {heavy(names)}"
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    "args",
    [
        ["--d-model", "512", "--heads", "8"],
        ["--preset", "gemma-3-270m", "--json"],
        # refused sizes whose messages list the valid head counts
        ["--d-model", "10", "--heads", "3"],
        ["--heads", "8", "--kv-heads", "3"],
    ],
    ids=" ".join,
)
def test_shapes_imports_nothing_heavy(args):
    """`shapes` answers from the shape table, which needs no torch (the tests hold it equal to
    the traced layer: tests/interop/test_shapes.py)."""
    names, proc = imported("shapes", *args)
    assert proc.returncode in (0, 2), proc.stderr
    assert "verdict:" in proc.stdout or "nearest valid" in " ".join(proc.stderr.split())
    assert heavy(names) == []


def test_shapes_trace_imports_torch_and_nothing_else_heavy():
    """`shapes --trace` runs the real layer on the meta device, so it needs torch; only torch.
    (That the log shows torch here is also what shows the checks above could see it.)"""
    names, proc = imported("shapes", "--d-model", "512", "--heads", "8", "--trace")
    assert proc.returncode == 0, proc.stderr
    assert "verdict: MHA, h=8, h_kv=8, d_k=64" in proc.stdout
    assert heavy(names) == ["torch"]


def test_shapes_trace_never_imports_torch_dynamo_or_sympy():
    """On meta, PyTorch computes products and softmax in Python, whose first calls import
    torch._dynamo and sympy (each about as long as torch itself); the trace runs without them."""
    names, proc = imported(
        "shapes",
        "--d-model",
        "512",
        "--heads",
        "8",
        "--kv-heads",
        "2",
        "--cache-len",
        "3",
        "--dtype",
        "bf16",
        "--trace",
    )
    assert proc.returncode == 0, proc.stderr
    assert "verdict: GQA, h=8, h_kv=2, d_k=64" in proc.stdout
    assert "torch" in names  # the log shows torch's own modules, so it would show these
    assert "torch._dynamo" not in names
    assert "sympy" not in names and "torch.fx.experimental.symbolic_shapes" not in names


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ((2, 3, 4), 0.125),
        ((2, 3, 4), 3),
        ((1, 3, 1), (2, 1, 4)),
        ((4,), ()),
    ],
)
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "float64", "int64"])
def test_meta_products_in_place_make_the_tensor_torch_mul_makes(a, b, dtype):
    """Oracle: PyTorch's own meta kernel for ``mul`` on the same inputs, outside the mode."""
    import torch

    from headlab.shapes.report import _MetaKernels

    x = torch.empty(a, dtype=getattr(torch, dtype), device="meta")
    y = torch.empty(b, dtype=torch.float32, device="meta") if isinstance(b, tuple) else b
    with _MetaKernels():
        got = x * y
    want = x * y
    assert (got.device, got.shape, got.dtype) == (want.device, want.shape, want.dtype)


def test_meta_trace_equals_the_trace_with_torchs_own_meta_kernels():
    """Every traced tensor of the shape report (GQA, a cache, bf16) has the shape and dtype that
    the same layer gets on meta with PyTorch's own kernels for every op."""
    import torch

    from headlab.attention import MultiHeadAttention
    from headlab.shapes import shape_config
    from headlab.shapes.report import _run_on_meta
    from headlab.trace import Trace

    cfg = shape_config(48, 6, 5, 2, 3, True, "bf16", 4)
    trace, _ = _run_on_meta(cfg)
    with torch.device("meta"):
        layer = MultiHeadAttention(48, 6, 3, bias=True).to(torch.bfloat16)
    want = Trace()
    cache = layer.new_cache(2, 9)
    cache.length = 4
    with torch.no_grad():
        x = torch.empty(2, 5, 48, dtype=torch.bfloat16, device="meta")
        layer(x, cache=cache, impl="explicit", trace=want)
    got = {k: (tuple(t.shape), t.dtype) for k, t in trace.items()}
    assert got == {k: (tuple(t.shape), t.dtype) for k, t in want.items()}
    assert "scores" in got and got["scores"][0] == (2, 6, 5, 9)


@pytest.mark.parametrize(
    ("op", "shapes", "extra"),
    [
        ("mm", [(3, 4), (4, 5)], ()),
        ("mm", [(1, 1), (1, 7)], ()),
        ("bmm", [(2, 3, 4), (2, 4, 6)], ()),
        ("bmm", [(5, 1, 8), (5, 8, 1)], ()),
        ("_softmax", [(2, 3, 4, 4)], (-1, False)),
        ("_softmax", [(2, 3)], (0, False)),
    ],
)
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "float64"])
def test_meta_kernels_make_the_tensor_torchs_own_meta_kernels_make(op, shapes, extra, dtype):
    """Oracle: PyTorch's own meta kernel for the same aten op and inputs, outside the mode."""
    import torch

    from headlab.shapes.report import _MetaKernels

    func = getattr(torch.ops.aten, op).default
    args = [torch.empty(s, dtype=getattr(torch, dtype), device="meta") for s in shapes]
    with _MetaKernels():
        got = func(*args, *extra)
    want = func(*args, *extra)
    assert (got.device, got.shape, got.dtype) == (want.device, want.shape, want.dtype)


def test_meta_softmax_upcasting_half_is_float32_as_torchs():
    import torch

    from headlab.shapes.report import _MetaKernels

    x = torch.empty(2, 5, dtype=torch.float16, device="meta")
    with _MetaKernels():
        got = torch.ops.aten._softmax.default(x, -1, True)
    want = torch.ops.aten._softmax.default(x, -1, True)
    assert (got.shape, got.dtype) == (want.shape, want.dtype) == ((2, 5), torch.float32)


@pytest.mark.parametrize(
    ("op", "a", "b"),
    [
        ("mm", (3, 4), (5, 6)),
        ("bmm", (2, 3, 4), (3, 4, 5)),
        ("bmm", (2, 3, 4), (2, 5, 6)),
        ("mul", (2, 3), (4,)),
    ],
)
def test_meta_kernels_leave_sizes_that_do_not_fit_to_torchs_own_error(op, a, b):
    """Inputs outside the mode's rules go to PyTorch's kernel, which raises as it always does."""
    import torch

    from headlab.shapes.report import _MetaKernels

    overload = "Tensor" if op == "mul" else "default"
    func = getattr(getattr(torch.ops.aten, op), overload)
    x, y = (torch.empty(s, device="meta") for s in (a, b))
    with pytest.raises(RuntimeError) as outside:
        func(x, y)
    with _MetaKernels(), pytest.raises(RuntimeError) as inside:
        func(x, y)
    assert str(inside.value) == str(outside.value)
