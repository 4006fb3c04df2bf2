"""The 4-bit rewrite of :mod:`headlab.site_smollm2` on small graphs of known weights, run by
onnxruntime (the outside runtime): every reader of a weight reads its blocks, however many
readers it has (the switch-off graph runs the model twice, and its mean fill reshapes W_O),
and what each reads equals the weights GGUF's dequantisation gives (NumPy, here): bit for bit
where the graph dequantises, to float32 rounding where MatMulNBits multiplies. The tied
embedding's rows are exact, and its transposed product (the unembedding) is an 8-bit
MatMulNBits on the same bytes."""

from __future__ import annotations

import numpy as np
import pytest

from headlab import site_smollm2 as s2

onnxruntime = pytest.importorskip("onnxruntime", reason="headlab[static] installs onnxruntime")
ir = pytest.importorskip("onnx_ir", reason="headlab[static] exports with torch.onnx (dynamo)")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

N, K, V, ROWS = 48, 96, 40, 5
rng = np.random.default_rng(2046)


def q4_blocks(n: int, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Random Q4_1 blocks: q (n, k/32, 32) in 0..15, d and m float16 of a real model's size."""
    q = rng.integers(0, 16, (n, k // 32, 32)).astype(np.uint8)
    d = (rng.random((n, k // 32)) * 0.02 + 1e-3).astype(np.float16)
    m = (-rng.random((n, k // 32)) * 0.1).astype(np.float16)
    return q, d, m


def run(model_proto, feeds: dict) -> dict:
    options = onnxruntime.SessionOptions()
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = onnxruntime.InferenceSession(
        model_proto.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )
    return dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds), strict=True))


def graph(nodes, inputs, outputs, weights: dict[str, np.ndarray]):
    made = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in outputs],
        [numpy_helper.from_array(a, name) for name, a in weights.items()],
    )
    return helper.make_model(made, opset_imports=[helper.make_opsetid("", 21)])


def test_every_reader_of_a_linear_map_reads_its_4bit_blocks() -> None:
    """W read by two x · Wᵀ (two runs) and by a Reshape (the mean fill): after the rewrite
    both products are MatMulNBits within float32 rounding of x · Wᵀ, the Reshape reads W bit
    for bit, and no float matrix is left."""
    q, d, m = q4_blocks(N, K)
    w = s2.dequantised(q, d, m)
    name = "model.blocks.0.attn.W_O.weight"
    nodes = [
        helper.make_node("Transpose", [name], ["t1"], perm=[1, 0]),
        helper.make_node("MatMul", ["x", "t1"], ["y1"]),
        helper.make_node("Transpose", [name], ["t2"], perm=[1, 0]),
        helper.make_node("MatMul", ["x2", "t2"], ["y2"]),
        helper.make_node("Reshape", [name, "shape"], ["w"]),
    ]
    weights = {name: w, "shape": np.array([N, K], np.int64)}
    inputs = [(x, TensorProto.FLOAT, [ROWS, K]) for x in ("x", "x2")]
    proto = graph(nodes, inputs, ["y1", "y2", "w"], weights)
    model = ir.from_proto(proto)
    model.opset_imports[s2.MS_DOMAIN] = 1
    s2._linear(ir, model.graph, name, s2.packed_nibbles(q), d, m)
    kinds = [node.op_type for node in model.graph]
    assert kinds.count("MatMulNBits") == 2 and "MatMul" not in kinds and "Transpose" not in kinds
    assert name not in model.graph.initializers
    assert not [
        v
        for v in model.graph.initializers.values()
        if v.dtype == ir.DataType.FLOAT and v.shape.rank() == 2
    ]
    x, x2 = (rng.standard_normal((ROWS, K)).astype(np.float32) for _ in range(2))
    out = run(ir.to_proto(model), {"x": x, "x2": x2})
    assert np.array_equal(out["w"].view(np.uint32), w.view(np.uint32))
    for got, a in ((out["y1"], x), (out["y2"], x2)):
        exact = a.astype(np.float64) @ w.T.astype(np.float64)
        assert np.abs(got - exact).max() < 1e-5


def test_the_tied_embedding_reads_one_table_of_q8_rows() -> None:
    """The float embedding read by a Gather (the token's row) and by Gemm(h, E, transB=1) (the
    unembedding): after the rewrite both read one uint8 table, the rows exactly d·q and the
    logits within float32 rounding of h · Eᵀ."""
    q = rng.integers(-128, 128, (V, K // 32, 32)).astype(np.int8)
    d = (rng.random((V, K // 32)) * 0.01 + 1e-3).astype(np.float16)
    e = s2.dequantised(q, d)
    name = "model.unembed.weight"
    nodes = [
        helper.make_node("Gather", [name, "tokens"], ["rows"], axis=0),
        helper.make_node("Gemm", ["h", name], ["logits"], transB=1),
    ]
    inputs = [("tokens", TensorProto.INT64, [1, ROWS]), ("h", TensorProto.FLOAT, [ROWS, K])]
    model = ir.from_proto(graph(nodes, inputs, ["rows", "logits"], {name: e}))
    model.opset_imports[s2.MS_DOMAIN] = 1
    s2._embedding(ir, model.graph, q.reshape(V, K), d)
    kinds = [node.op_type for node in model.graph]
    assert "Gemm" not in kinds and kinds.count("MatMulNBits") == 1
    table = model.graph.initializers["embed.q8"].const_value.numpy()
    assert table.dtype == np.uint8 and np.array_equal(table.astype(np.int16) - 128, q)
    tokens = rng.integers(0, V, (1, ROWS)).astype(np.int64)
    h = rng.standard_normal((ROWS, K)).astype(np.float32)
    out = run(ir.to_proto(model), {"tokens": tokens, "h": h})
    assert np.array_equal(out["rows"][0].view(np.uint32), e[tokens[0]].view(np.uint32))
    exact = h.astype(np.float64) @ e.T.astype(np.float64)
    assert np.abs(out["logits"] - exact).max() < 1e-5


def test_a_reader_the_rewrite_cannot_take_is_refused() -> None:
    """A Gemm that adds a bias to the unembedding is no plain x · Eᵀ: refused, saying so."""
    q = rng.integers(-128, 128, (V, K // 32, 32)).astype(np.int8)
    d = np.full((V, K // 32), 0.01, np.float16)
    name = "model.unembed.weight"
    nodes = [helper.make_node("Gemm", ["h", name, "bias"], ["logits"], transB=1)]
    weights = {name: s2.dequantised(q, d), "bias": np.zeros(V, np.float32)}
    model = ir.from_proto(graph(nodes, [("h", TensorProto.FLOAT, [ROWS, K])], ["logits"], weights))
    with pytest.raises(ValueError, match="not by a Gather of rows or x · Wᵀ"):
        s2._embedding(ir, model.graph, q.reshape(V, K), d)
