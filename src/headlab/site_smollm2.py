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
    embedding     the rows of the table (stored once as q + 128, uint8) and their scales
                  gathered, less 128, then multiplied: exactly d·q, the weights headlab
                  computes with
    unembedding   (tied to the embedding; the switch-off graph's next-token guesses) an 8-bit
                  MatMulNBits on the same table, whose default zero point is 128
    other reads   a weight read otherwise than as x · Wᵀ (the switch-off graph's mean fill
                  reshapes W_O) is dequantised in the graph, d·q + m in float32: bit for bit

Before writing, the rewrite checks that each matrix's blocks, dequantised as GGUF does, equal
the model's weight bit for bit (the query and key rows put back in headlab's order, as
transformers does), so the graph cannot read another model's weights. The blocks are saved as
ONNX external data in files of at most :data:`SHARD_BYTES` (static hosts take 50 MB a file),
which onnxruntime-web's ``externalData`` session option reads. The switch-off graph
(:class:`~headlab.heads.switch.SwitchGraph`, rewritten the same way) reads its blocks from the
same files (:func:`save_sharing`), so a reader who switches heads off downloads only what the
site graph lacks.

Shape legend
    N   output features (rows of W);  K   input features;  nb = K / 32 blocks;  V   vocabulary
"""

from __future__ import annotations

import os
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
    """Rewrite an exported graph of SmolLM2 (an ``onnx_ir`` model: :class:`~headlab.site.SiteGraph`
    by :func:`headlab.site.export_program`, or :class:`~headlab.heads.switch.SwitchGraph` by
    :func:`headlab.site.export_switch_program`) in place to read the GGUF file's blocks: each
    linear map's x · Wᵀ a MatMulNBits, the embedding a gather of int8 rows, the tied
    unembedding an 8-bit MatMulNBits on the same rows (module docstring). Raises
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
            if name not in graph.initializers:  # SiteGraph stops at the last layer's weights:
                continue  # no output reads that layer's later maps, so the exporter left them out
            raw = np.asarray(tensors[f"blk.{layer}.{theirs}.weight"].data)
            if theirs in heads:
                raw = unpermute(raw, heads[theirs])
            q, d, m = q4_1(raw)
            weight = model.get_parameter(name.removeprefix("model."))
            checked(name, dequantised(q, d, m), weight)
            _linear(ir, graph, name, packed_nibbles(q), d, m)
    q8, d8 = q8_0(np.asarray(tensors["token_embd.weight"].data))
    checked("the token embedding", dequantised(q8, d8), model.get_parameter("embed.weight"))
    _embedding(ir, graph, q8, d8)
    left = [
        k
        for k, v in graph.initializers.items()
        if v.dtype == ir.DataType.FLOAT and v.shape.rank() == 2
    ]
    if left:  # a weight the exporter renamed or folded: the graph would read it in float32
        raise ValueError(f"the graph still reads float matrices {left[:3]}; rewrite it unoptimised")


def save_sharing(onnx_model: Any, path: Path, saved: Path) -> list[str]:
    """Save ``onnx_model`` (``onnx_ir``) to ``path``, reading every initializer that the graph
    already saved at ``saved`` (in the same folder) holds under the same name, with the same
    bytes, from that graph's external data files; the rest (the few the other graph lacks,
    such as the last layer's maps, which only the switch-off graph reads) is written into
    ``path`` itself. The reader downloads the shared blocks once. Returns the external data
    files ``path`` reads."""
    import onnx_ir as ir

    theirs = ir.load(saved).graph.initializers
    files: set[str] = set()
    for name, value in onnx_model.graph.initializers.items():
        other = theirs.get(name)
        tensor = other.const_value if other is not None else None
        if not isinstance(tensor, ir.ExternalTensor) or value.const_value is None:
            continue
        mine = value.const_value
        same = mine.dtype == tensor.dtype and mine.shape == tensor.shape
        if same and mine.tobytes() == tensor.tobytes():
            value.const_value = tensor
            files.add(os.fspath(tensor.location))
    ir.save(onnx_model, path)  # external tensors stay where they are; the rest is written inline
    return sorted(files)


def _initializer(ir: Any, graph: Any, name: str, array: np.ndarray) -> Any:
    value = ir.Value(name=name, const_value=ir.tensor(array, name=name))
    value.shape = ir.Shape(array.shape)
    value.dtype = value.const_value.dtype
    graph.register_initializer(value)
    return value


def _linear(
    ir: Any, graph: Any, name: str, packed: np.ndarray, d: np.ndarray, m: np.ndarray
) -> None:
    """Make every reader of the initializer ``name`` (N, K) read its 4-bit blocks instead:
    B the packed nibbles (N, nb, 16), d and m (N, nb) float16, stored as the wheel ships them.
    Each x · Wᵀ (Transpose(W) → MatMul(x, ·)) becomes MatMulNBits(x, B, scales, zero points),
    the scales d and the zero points −m/d computed in the graph in float32. Any other reader
    (the switch-off graph's mean fill reshapes W_O) reads W dequantised in the graph from the
    same blocks, d·q + m in float32: bit for bit the model's weight."""
    weight = graph.initializers[name]
    N, nb = packed.shape[:2]
    stem = name.removesuffix(".weight")
    q4 = _initializer(ir, graph, f"{stem}.q4", packed)
    d16 = _initializer(ir, graph, f"{stem}.d", d.reshape(-1))
    m16 = _initializer(ir, graph, f"{stem}.m", m.reshape(-1))
    attributes = {
        "K": nb * BLOCK,
        "N": N,
        "bits": 4,
        "block_size": BLOCK,
        "accuracy_level": 0,  # float32 throughout: no 8-bit activations
    }
    w = None  # W in float32, made once for the readers other than x · Wᵀ
    for node, index in list(weight.uses()):
        readers = list(node.outputs[0].uses()) if node.op_type == "Transpose" else []
        perm = node.attributes.get("perm")
        if (
            readers
            and perm is not None
            and tuple(perm.value) == (1, 0)
            and all(reader.op_type == "MatMul" and i == 1 for reader, i in readers)
        ):
            for matmul, _ in readers:
                nodes = _Nodes(ir)
                scales = nodes.op("Cast", d16, to=FLOAT)
                zero = nodes.op("Neg", nodes.op("Div", nodes.op("Cast", m16, to=FLOAT), scales))
                x = matmul.inputs[0]
                nodes.op("MatMulNBits", x, q4, scales, zero, domain=MS_DOMAIN, **attributes)
                _swap(ir, graph, matmul, nodes.made)
            graph.remove(node, safe=True)
            continue
        if w is None:
            nodes = _Nodes(ir)
            w = _dequantise(ir, graph, nodes, q4, d16, m16, stem, (N, nb))
            graph.insert_before(graph[0], nodes.made)  # it reads initializers alone
        node.replace_input_with(index, w)
    del graph.initializers[name]


def _dequantise(
    ir: Any,
    graph: Any,
    nodes: _Nodes,
    q4: Any,
    d16: Any,
    m16: Any,
    stem: str,
    blocks: tuple[int, int],
) -> Any:
    """The float32 matrix (N, K) of the packed 4-bit blocks ``q4`` (N, nb, 16): the nibbles
    taken apart in float32 (exact: byte = 16·high + low), put back in order (element 2j is
    byte j's low half), then d·q + m, the one rounding GGUF's dequantisation makes."""
    N, nb = blocks
    op = nodes.op

    def const(value: np.ndarray, label: str) -> Any:
        return _initializer(ir, graph, f"{stem}.{label}", value)

    byte = op("Cast", q4, to=FLOAT)  # (N, nb, 16)
    sixteen = const(np.array(16, np.float32), "sixteen")
    high = op("Floor", op("Div", byte, sixteen))
    low = op("Sub", byte, op("Mul", high, sixteen))
    last = const(np.array([-1], np.int64), "last")
    pairs = op("Concat", op("Unsqueeze", low, last), op("Unsqueeze", high, last), axis=-1)
    q = op("Reshape", pairs, const(np.array([N, nb, BLOCK], np.int64), "blocks"))
    per_block = const(np.array([N, nb, 1], np.int64), "per_block")
    d = op("Reshape", op("Cast", d16, to=FLOAT), per_block)
    m = op("Reshape", op("Cast", m16, to=FLOAT), per_block)
    w = op("Add", op("Mul", q, d), m)
    return op("Reshape", w, const(np.array([N, nb * BLOCK], np.int64), "matrix"))


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
    """Make every reader of the float embedding read the Q8_0 blocks, stored once as q + 128
    (V, nb, 32) uint8 and d (V, nb) float16: a Gather of it (the embedding) becomes the rows
    gathered, less 128, times their scales, exactly d·q; a Gemm with it transposed (the tied
    unembedding, in the switch-off graph) becomes an 8-bit MatMulNBits on the same bytes,
    whose default zero point is 128."""
    name = "model.unembed.weight"  # the tied embedding, under the name the exporter kept
    weight = graph.initializers[name]
    V, nb = d.shape
    table = _initializer(
        ir, graph, "embed.q8", (q.reshape(V, nb, BLOCK).astype(np.int16) + 128).astype(np.uint8)
    )
    scales = _initializer(ir, graph, "embed.scales", d)

    offset = _initializer(ir, graph, "embed.offset", np.array(128, np.float32))
    last = _initializer(ir, graph, "embed.last", np.array([-1]))
    rows_shape = _initializer(ir, graph, "embed.rows", np.array([0, 0, nb * BLOCK]))
    for node, index in list(weight.uses()):
        nodes = _Nodes(ir)
        op = nodes.op
        if node.op_type == "Gather" and index == 0 and _ints(node, axis=0):
            tokens = node.inputs[1]
            rows = op("Cast", op("Gather", table, tokens, axis=0), to=FLOAT)  # (B, n, nb, 32)
            rows = op("Sub", rows, offset)
            per_row = op("Cast", op("Gather", scales, tokens, axis=0), to=FLOAT)  # (B, n, nb)
            scaled = op("Mul", rows, op("Unsqueeze", per_row, last))
            op("Reshape", scaled, rows_shape)  # (B, n, K)
        elif (
            node.op_type == "Gemm"
            and index == 1
            and len(node.inputs) == 2
            and _ints(node, transA=0, transB=1)
            and all(_float(node, k) == 1.0 for k in ("alpha", "beta"))
        ):
            flat = op("Reshape", op("Cast", scales, to=FLOAT), last)
            attributes = {"K": nb * BLOCK, "N": V, "bits": 8, "block_size": BLOCK}
            op("MatMulNBits", node.inputs[0], table, flat, domain=MS_DOMAIN, **attributes)
        else:
            raise ValueError(
                f"{name} is read by {node.op_type} (input {index}), not by a Gather of rows or "
                "x · Wᵀ; the graph cannot take its int8 blocks"
            )
        _swap(ir, graph, node, nodes.made)
    del graph.initializers[name]


def _ints(node: Any, **want: int) -> bool:
    """Whether ``node``'s integer attributes are ``want`` (an absent one read as 0)."""
    return all(
        (node.attributes[k].value if k in node.attributes else 0) == v for k, v in want.items()
    )


def _float(node: Any, key: str) -> float:
    return float(node.attributes[key].value) if key in node.attributes else 1.0


def _swap(ir: Any, graph: Any, old: Any, new: list[Any]) -> None:
    """Put the nodes ``new`` where the node ``old`` stood (the last of them gives the output
    the graph reads on) and drop ``old``."""
    last, out = old.outputs[0], new[-1].outputs[0]
    out.shape, out.dtype = last.shape, last.dtype
    if last.is_graph_output():  # the graph's output keeps its name
        out.name, last.name = last.name, f"{last.name}.replaced"
    for node in new:
        graph.insert_before(old, node)
    ir.convenience.replace_all_uses_with(last, out, replace_graph_outputs=True)
    graph.remove(old, safe=True)
