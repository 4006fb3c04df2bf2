"""``headlab shapes``: every tensor's shape, the parameters, FLOPs and KV cache of one layer."""

from __future__ import annotations

from typing import Any

import typer

from headlab.cli.common import console, fail

TRACE_HELP = (
    "Run the real layer on PyTorch's meta device and read the report off it, checked against "
    "the shape table (imports torch: about a second more)."
)


def _size_option(name: str, help_text: str, *flags: str) -> Any:
    """An optional size of ``headlab shapes``, bounded as the API's schema bounds it."""
    from headlab.shapes import LIMITS

    low, high = LIMITS[name]
    return typer.Option(None, *flags, min=low, max=high, help=f"{help_text} ({low}..{high:,}).")


def shapes(
    d_model: int | None = _size_option("d_model", "Model width (default 512, or the preset's)"),
    heads: int | None = _size_option("n_heads", "Query heads h (default 8, or the preset's)"),
    kv_heads: int | None = _size_option("n_kv_heads", "Key/value heads h_kv (GQA/MQA); default h"),
    seq: int | None = _size_option("seq_len", "Tokens n (default 10, or the preset's context)"),
    batch: int | None = _size_option("batch", "Sequences B (default 1)"),
    dtype: str = typer.Option("float32", help="float32, float16/fp16, bfloat16/bf16, float64."),
    cache_len: int | None = _size_option(
        "cache_len", "Positions already in the KV cache (default 0)"
    ),
    d_k: int | None = _size_option(
        "d_k",
        "Each head's width d_k (default d_model // h, or the preset's)",
        "--d-k",
        "--head-dim",
    ),
    bias: bool | None = typer.Option(None, "--bias/--no-bias", help="Projection biases."),
    preset: str | None = typer.Option(None, help="A published model, e.g. gpt2-small."),
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON."),
    trace: bool = typer.Option(False, "--trace", help=TRACE_HELP),
) -> None:
    """Every tensor's shape, the parameters, FLOPs and KV cache of one attention layer.

    The report comes from the layer's shape table, which headlab's tests hold equal to the real
    layer traced on the meta device; --trace runs that trace here.
    FLOPs: a multiply-add counts 2; bias adds, the 1/√d_k scale and softmax are not counted.
    """
    import json

    from headlab.shapes import PRESETS, Preset, check_shape_config, shape_config, table_shapes

    if preset is not None and preset not in PRESETS:
        raise fail(f"unknown preset {preset!r}; valid presets: {', '.join(PRESETS)}")
    p = PRESETS[preset] if preset else Preset("", "", 512, 8, None, True, 1, 10, "")
    sizes = (
        p.d_model if d_model is None else d_model,
        p.n_heads if heads is None else heads,
        p.context if seq is None else seq,
        1 if batch is None else batch,
        p.n_kv_heads if kv_heads is None else kv_heads,
        p.bias if bias is None else bias,
        dtype,
        0 if cache_len is None else cache_len,
        p.d_k if d_k is None else d_k,
    )
    # a refused size is answered before anything is built; --json prints the refused report
    problems = check_shape_config(shape_config(*sizes))
    if problems and not as_json:
        raise fail("; ".join(problems))
    r = table_shapes(*sizes)
    if trace and r.valid:
        r = _traced(r, sizes)
    if as_json:
        typer.echo(json.dumps(r.to_dict(), indent=2, ensure_ascii=False))
    if not r.valid:
        raise fail("; ".join(r.problems))
    if not as_json:
        _print_report(r, p.title)


def _traced(table: Any, sizes: tuple[Any, ...]) -> Any:
    """The report read off the real layer on meta, which must equal the table's."""
    from headlab.shapes import trace_shapes

    traced = trace_shapes(*sizes)
    differ = traced.differences(table)
    if differ:
        raise fail(
            f"the shape table and the traced layer disagree on {', '.join(differ)}: a headlab "
            "bug; the traced figures are the layer's own",
            code=1,
        )
    return traced


def _print_report(r: Any, title: str) -> None:
    """A :class:`headlab.shapes.ShapeReport` as two tables (stages, parameters) and its summary."""
    from rich.table import Table

    from headlab.shapes import format_bytes

    table = Table("stage", "symbolic", "concrete", "elements", "memory", "FLOPs", title=title)
    for st in r.stages:
        shape = "×".join(map(str, st.shape))
        table.add_row(
            st.label,
            st.symbolic,
            shape,
            f"{st.elements:,}",
            format_bytes(st.bytes),
            f"{st.flops:,}" if st.flops else "",
        )
    params = Table("parameter", "symbolic", "concrete", "count")
    for pt in r.param_tensors:
        params.add_row(pt.name, pt.symbolic, "×".join(map(str, pt.shape)), f"{pt.count:,}")
    console.print(table, params)
    for line in r.summary():
        console.print(line, highlight=False)
    source = (
        "read off the real layer run on the meta device, and equal to the shape table"
        if r.source == "trace"
        else "from the shape table, which the tests hold equal to the traced layer; "
        "--trace runs the layer"
    )
    console.print(f"source: {source}", highlight=False)
