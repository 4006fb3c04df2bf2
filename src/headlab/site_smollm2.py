"""SmolLM2 in the static site: its exported graph reading the wheel's own 4-bit weights.

headlab computes SmolLM2 with the weights transformers dequantises from the wheel's GGUF file
(:mod:`headlab.smollm2`): every linear map of the 30 blocks in Q4_1 blocks of 32 weights,
w = d·q + m (d, m float16, q 4 bits, in float32), and the token embedding in Q8_0, w = d·q
(q int8). The site's graph (:class:`headlab.site.SiteGraph`, exported once with the float
weights: the model's forward and every head's scores) is rewritten to read those blocks as the
wheel ships them, so that the reader downloads 4 bits a weight, not 32:

    linear maps   y = x Wᵀ becomes ONNX Runtime's ``com.microsoft`` MatMulNBits (bits 4, block
                  32): the same nibbles (repacked: it keeps element 2j in the low half of byte
                  j, GGUF elements j and j + 16), d as its scales and −m/d as a float zero
                  point. It computes (q − zp)·d, which is d·q + m up to float32 rounding: on
                  SmolLM2 at most 2.4e-7 a weight (one rounding), the attention weights within
                  1e-6 of PyTorch's (measured by tests/unit/test_site_smollm2.py)
    embedding     the rows of the int8 table and their scales gathered, then multiplied:
                  exactly d·q, the weights headlab computes with

Before writing, the rewrite checks that each matrix's blocks, dequantised as GGUF does, equal
the model's weight bit for bit (the query and key rows put back in headlab's order, as
transformers does), so the graph cannot read another model's weights. The blocks are saved as
ONNX external data in files of at most :data:`SHARD_BYTES` (static hosts take 50 MB a file),
which onnxruntime-web's ``externalData`` session option reads.

Shape legend
    N   output features (rows of W);  K   input features;  nb = K / 32 blocks;  V   vocabulary
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from torch import nn

BLOCK = 32  # weights per GGUF block (Q4_1, Q8_0)
# headlab's linear maps of a block → the GGUF tensor holding its weights
LINEAR = {
    "attn.W_Q": "attn_q",
    "attn.W_K": "attn_k",
    "attn.W_V": "attn_v",
    "attn.W_O": "attn_output",
    "mlp.W_in": "ffn_up",
    "mlp.W_gate": "ffn_gate",
    "mlp.W_out": "ffn_down",
}
GRAPH_FILE = "smollm2.onnx"
DATA_FILE = "smollm2.onnx.data"  # ir.save's shards are named after it
SHARD_BYTES = 40 * 2**20  # each external-data file at most this (static hosts: 50 MB)
# the longest text the site runs SmolLM2 on, in tokens: the graph's weights (L, h, n, n) and
# its scores over L · (h + 1) heads grow with n², and the browser's memory and time with them
# (benchmarks/bench_static_smollm2.py: 1.5 GB in Chromium at 128); `headlab serve` takes 8192
SITE_LEN = 128
MS_DOMAIN = "com.microsoft"
FLOAT = 1  # ONNX's float32 type number (Cast's "to")


class WeightsDiffer(ValueError):
    """The GGUF's blocks, dequantised, are not the model's weights (another file or model)."""


def q4_1(raw: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """GGUF Q4_1 rows (N, nb · 20) uint8 → q (N, nb, 32) uint8 in GGUF's element order,
    d (N, nb) float16, m (N, nb) float16. A block: d, m, then 16 bytes, byte j holding element
    j (low 4 bits) and element j + 16 (high 4 bits)."""
    N = raw.shape[0]
    blocks = np.ascontiguousarray(raw).reshape(N, -1, 20)
    d = blocks[..., 0:2].copy().view(np.float16)[..., 0]
    m = blocks[..., 2:4].copy().view(np.float16)[..., 0]
    nibbles = blocks[..., 4:]
    return np.concatenate([nibbles & 15, nibbles >> 4], -1), d, m


def q8_0(raw: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """GGUF Q8_0 rows (V, nb · 34) uint8 → q (V, nb, 32) int8, d (V, nb) float16."""
    V = raw.shape[0]
    blocks = np.ascontiguousarray(raw).reshape(V, -1, 34)
    return blocks[..., 2:].copy().view(np.int8), blocks[..., 0:2].copy().view(np.float16)[..., 0]


def unpermute(rows: np.ndarray, heads: int) -> np.ndarray:
    """The rows of a query or key map (N, …) in headlab's (Hugging Face's) order from
    llama.cpp's, which interleaves each head's two rotary halves (transformers'
    ``_reverse_permute_weights``)."""
    half = rows.shape[0] // heads // 2
    return rows.reshape(heads, half, 2, *rows.shape[1:]).swapaxes(2, 1).reshape(rows.shape)


def dequantised(q: np.ndarray, d: np.ndarray, m: np.ndarray | None = None) -> np.ndarray:
    """d·q (+ m) per block in float32, as GGUF's own dequantisation computes it → (N, K)."""
    w = d.astype(np.float32)[..., None] * q.astype(np.float32)
    if m is not None:
        w = w + m.astype(np.float32)[..., None]
    return w.reshape(q.shape[0], -1)


def packed_nibbles(q: np.ndarray) -> np.ndarray:
    """MatMulNBits' B for 4-bit blocks q (N, nb, 32): (N, nb, 16) uint8, element 2j in byte
    j's low half and 2j + 1 in its high half."""
    return (q[..., 0::2] | (q[..., 1::2] << 4)).astype(np.uint8)


def gguf_tensors(path: Path) -> dict[str, Any]:
    """The GGUF file's tensors by name (``gguf.GGUFReader``: a map of the file, nothing read
    until used)."""
    import gguf

    return {t.name: t for t in gguf.GGUFReader(str(path)).tensors}


def checked(name: str, w: np.ndarray, want: nn.Parameter) -> None:
    """:class:`WeightsDiffer` unless ``w`` equals the model's weight ``want`` bit for bit."""
    have = want.detach().cpu().numpy()
    if w.shape != have.shape or not np.array_equal(w.view(np.uint32), have.view(np.uint32)):
        raise WeightsDiffer(
            f"{name}: the GGUF's blocks, dequantised, are not the model's weights; the site "
            "reads SmolLM2 from the wheel's GGUF file headlab converted"
        )


def rewrite(onnx_model: Any, model: nn.Module, gguf: Path) -> None:
    """Rewrite the exported :class:`~headlab.site.SiteGraph` of SmolLM2 (an ``onnx_ir`` model,
    :func:`headlab.site.export_program`) in place to read the GGUF file's blocks: each linear
    map a MatMulNBits, the embedding a gather of int8 rows (module docstring). Raises
    :class:`WeightsDiffer` when a matrix's blocks are not ``model``'s weights."""
    import onnx_ir as ir

    config: Any = model.config
    tensors = gguf_tensors(gguf)
    graph = onnx_model.graph
    onnx_model.opset_imports[MS_DOMAIN] = 1
    graph.opset_imports[MS_DOMAIN] = 1
    heads = {"attn_q": config.n_heads, "attn_k": config.n_kv_heads or config.n_heads}
    for layer in range(config.n_layers):
        for ours, theirs in LINEAR.items():
            name = f"model.blocks.{layer}.{ours}.weight"
            if name not in graph.initializers:  # the last layer's maps after its weights:
                continue  # no output reads them, so the exporter left them out
            raw = np.asarray(tensors[f"blk.{layer}.{theirs}.weight"].data)
            if theirs in heads:
                raw = unpermute(raw, heads[theirs])
            q, d, m = q4_1(raw)
            weight = model.get_parameter(name.removeprefix("model."))
            checked(name, dequantised(q, d, m), weight)
            _matmul_nbits(ir, graph, name, packed_nibbles(q), d, m)
    q8, d8 = q8_0(np.asarray(tensors["token_embd.weight"].data))
    checked("the token embedding", dequantised(q8, d8), model.get_parameter("embed.weight"))
    _embedding(ir, graph, q8.reshape(q8.shape[0], -1), d8)
    left = [
        k
        for k, v in graph.initializers.items()
        if v.dtype == ir.DataType.FLOAT and v.shape.rank() == 2
    ]
    if left:  # a weight the exporter renamed or folded: the graph would read it in float32
        raise ValueError(f"the graph still reads float matrices {left[:3]}; rewrite it unoptimised")


def _initializer(ir: Any, graph: Any, name: str, array: np.ndarray) -> Any:
    value = ir.Value(name=name, const_value=ir.tensor(array, name=name))
    value.shape = ir.Shape(array.shape)
    value.dtype = value.const_value.dtype
    graph.register_initializer(value)
    return value


def _matmul_nbits(
    ir: Any, graph: Any, name: str, packed: np.ndarray, d: np.ndarray, m: np.ndarray
) -> None:
    """Replace Transpose(W) → MatMul(x, ·) of the initializer ``name`` (N, K) by
    MatMulNBits(x, B, scales, zero points): B the packed nibbles (N, nb, 16), the scales d and
    the zero points −m/d computed in the graph in float32 from d and m (N, nb) float16, which
    are stored as the wheel ships them."""
    weight = graph.initializers[name]
    (transpose, _), *more = list(weight.uses())
    (matmul, index), *others = list(transpose.outputs[0].uses())
    if (
        more
        or others
        or transpose.op_type != "Transpose"
        or matmul.op_type != "MatMul"
        or index != 1
    ):
        raise ValueError(f"{name} is not read as x · Wᵀ alone; the graph cannot take 4-bit weights")
    N, nb = packed.shape[:2]
    stem = name.removesuffix(".weight")
    nodes = _Nodes(ir)
    scales = nodes.op("Cast", _initializer(ir, graph, f"{stem}.d", d.reshape(-1)), to=FLOAT)
    mins = nodes.op("Cast", _initializer(ir, graph, f"{stem}.m", m.reshape(-1)), to=FLOAT)
    zero = nodes.op("Neg", nodes.op("Div", mins, scales))
    attributes = {
        "K": nb * BLOCK,
        "N": N,
        "bits": 4,
        "block_size": BLOCK,
        "accuracy_level": 0,  # float32 throughout: no 8-bit activations
    }
    q4 = _initializer(ir, graph, f"{stem}.q4", packed)
    nodes.op("MatMulNBits", matmul.inputs[0], q4, scales, zero, domain=MS_DOMAIN, **attributes)
    _replace(ir, graph, [transpose, matmul], nodes.made, name)


class _Nodes:
    """New nodes, in the order made: ``op(kind, *inputs, **int attributes)`` → its output."""

    def __init__(self, ir: Any) -> None:
        self.ir = ir
        self.made: list[Any] = []

    def op(self, kind: str, *inputs: Any, domain: str = "", **attrs: int) -> Any:
        attributes = [self.ir.AttrInt64(k, v) for k, v in attrs.items()]
        node = self.ir.Node(domain, kind, list(inputs), attributes)
        self.made.append(node)
        return node.outputs[0]


def _embedding(ir: Any, graph: Any, q: np.ndarray, d: np.ndarray) -> None:
    """Replace Gather(E, tokens) of the float embedding by the int8 rows times their scales:
    q (V, K) int8, d (V, nb) float16."""
    name = "model.unembed.weight"  # the tied embedding, under the name the exporter kept
    weight = graph.initializers[name]
    (gather, index), *more = list(weight.uses())
    if more or gather.op_type != "Gather" or index != 0:
        raise ValueError(f"{name} is not read by one Gather; the graph cannot take int8 rows")
    tokens = gather.inputs[1]
    table = _initializer(ir, graph, "embed.q8", q)
    scales = _initializer(ir, graph, "embed.scales", d)
    nb = d.shape[1]

    def const(values: list[int], label: str) -> Any:
        return _initializer(ir, graph, f"embed.{label}", np.array(values, dtype=np.int64))

    nodes = _Nodes(ir)
    op = nodes.op
    rows = op("Cast", op("Gather", table, tokens, axis=0), to=FLOAT)
    per_row = op("Cast", op("Gather", scales, tokens, axis=0), to=FLOAT)
    blocks = op("Reshape", rows, const([0, 0, nb, BLOCK], "blocks"))  # (1, n, nb, 32)
    scaled = op("Mul", blocks, op("Unsqueeze", per_row, const([-1], "last")))
    op("Reshape", scaled, const([0, 0, nb * BLOCK], "rows"))  # (1, n, K)
    _replace(ir, graph, [gather], nodes.made, name)


def _replace(ir: Any, graph: Any, old: list[Any], new: list[Any], initializer: str) -> None:
    """Put the nodes ``new`` where ``old`` stood (the last of each gives the output the graph
    reads on), and drop ``old`` and the float initializer they read."""
    last, out = old[-1].outputs[0], new[-1].outputs[0]
    out.shape, out.dtype = last.shape, last.dtype
    for node in new:
        graph.insert_before(old[-1], node)
    ir.convenience.replace_all_uses_with(last, out)
    graph.remove(old[::-1], safe=True)
    del graph.initializers[initializer]
