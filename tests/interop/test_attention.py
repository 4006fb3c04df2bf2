"""The attention core against outside oracles: nn.MultiheadAttention and the NumPy reference."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from headlab import KVCache, MultiHeadAttention, attention, merge_heads, repeat_kv, split_heads
from headlab.reference import multi_head_attention, weights_of


def random_mha(d_model=32, h=4, h_kv=None, bias=True) -> MultiHeadAttention:
    m = MultiHeadAttention(d_model, h, h_kv, bias=bias).eval()
    if bias:  # nn.Linear starts biases near zero; make them matter
        with torch.no_grad():
            for lin in (m.W_Q, m.W_K, m.W_V, m.W_O):
                lin.bias.normal_()
    return m


# --- parity with torch.nn.MultiheadAttention, weights copied ----------------------------------


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("batch_first", [True, False])
@pytest.mark.parametrize("packed", [True, False])
def test_from_torch_matches_torch(bias, batch_first, packed):
    d, h, B, n = 32, 4, 3, 7
    ref = nn.MultiheadAttention(d, h, bias=bias, batch_first=batch_first)
    if not packed:
        # torch keeps separate q/k/v weights only when kdim/vdim differ from d; lay them out by hand
        ref._qkv_same_embed_dim = False
        for name in ("q_proj_weight", "k_proj_weight", "v_proj_weight"):
            setattr(ref, name, nn.Parameter(torch.randn(d, d) * 0.2))
        ref.register_parameter("in_proj_weight", None)
    if bias:
        with torch.no_grad():
            ref.in_proj_bias.normal_()
            ref.out_proj.bias.normal_()
    ref.eval()
    mine = MultiHeadAttention.from_torch(ref).eval()
    x = torch.randn(B, n, d)
    xt = x if batch_first else x.transpose(0, 1)
    expected, expected_w = ref(xt, xt, xt, need_weights=True, average_attn_weights=False)
    expected = expected if batch_first else expected.transpose(0, 1)
    got, got_w = mine(x, return_weights=True)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got_w, expected_w, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("impl", ["explicit", "fused"])
def test_masks_match_torch(impl):
    d, h, B, n = 48, 6, 3, 9
    mine = random_mha(d, h)
    ref = mine.to_torch(batch_first=True).eval()
    x = torch.randn(B, n, d)
    lengths = torch.tensor([9, 5, 2])
    padding = torch.arange(n)[None, :] >= lengths[:, None]  # torch polarity: True = ignore
    causal_ignore = torch.triu(torch.ones(n, n, dtype=torch.bool), 1)
    expected, expected_w = ref(
        x,
        x,
        x,
        key_padding_mask=padding,
        attn_mask=causal_ignore,
        need_weights=True,
        average_attn_weights=False,
    )
    allowed = (~padding)[:, None, None, :]  # (B, 1, 1, s), headlab polarity: True = may attend
    got = mine(x, causal=True, allowed=allowed, impl=impl)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    _, got_w = mine(x, causal=True, allowed=allowed, return_weights=True)
    torch.testing.assert_close(got_w, expected_w, atol=1e-5, rtol=1e-5)


def test_to_torch_round_trip():
    mine = random_mha(24, 3)
    back = MultiHeadAttention.from_torch(mine.to_torch())
    for a, b in zip(mine.state_dict().values(), back.state_dict().values(), strict=True):
        assert torch.equal(a, b)


# --- parity with the NumPy reference, head by head -------------------------------------------


@pytest.mark.parametrize(
    ("d_model", "h", "h_kv"),
    [(32, 4, None), (32, 4, 2), (32, 4, 1), (48, 6, 3), (64, 8, 2), (30, 5, 1), (16, 1, None)],
)
@pytest.mark.parametrize("impl", ["explicit", "fused"])
def test_matches_numpy_reference(d_model, h, h_kv, impl):
    mine = random_mha(d_model, h, h_kv).double()
    x = torch.randn(2, 6, d_model, dtype=torch.float64)
    allowed = torch.rand(2, 1, 6, 6) > 0.3
    allowed[..., 0] = True
    got = mine(x, allowed=allowed, impl=impl)
    _, got_w = mine(x, allowed=allowed, return_weights=True)
    w = weights_of(mine)
    for b in range(2):
        out, pattern = multi_head_attention(x[b].numpy(), w, h, h_kv, allowed=allowed[b, 0].numpy())
        np.testing.assert_allclose(got[b].detach().numpy(), out, atol=1e-10)
        np.testing.assert_allclose(got_w[b].detach().numpy(), pattern, atol=1e-12)


@settings(max_examples=40, deadline=None)
@given(
    h_kv=st.integers(1, 4),
    group=st.integers(1, 3),
    d_k=st.integers(1, 5),
    n=st.integers(1, 7),
    causal=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_random_configs_match_numpy_reference(h_kv, group, d_k, n, causal, seed):
    torch.manual_seed(seed)
    h = h_kv * group
    mine = random_mha(h * d_k, h, h_kv).double()
    x = torch.randn(1, n, h * d_k, dtype=torch.float64)
    got, got_w = mine(x, causal=causal, return_weights=True)
    fused = mine(x, causal=causal, impl="fused")
    allowed = np.tril(np.ones((n, n), dtype=bool)) if causal else None
    out, pattern = multi_head_attention(x[0].numpy(), weights_of(mine), h, h_kv, allowed)
    np.testing.assert_allclose(got[0].detach().numpy(), out, atol=1e-10)
    np.testing.assert_allclose(fused[0].detach().numpy(), out, atol=1e-10)
    np.testing.assert_allclose(got_w[0].detach().numpy(), pattern, atol=1e-12)


# --- the two paths and the cache ---------------------------------------------------------------


@pytest.mark.parametrize(("h", "h_kv"), [(8, None), (8, 2), (8, 1)])
@pytest.mark.parametrize("causal", [True, False])
def test_explicit_equals_fused(h, h_kv, causal):
    mine = random_mha(64, h, h_kv)
    x = torch.randn(2, 11, 64)
    a = mine(x, causal=causal, impl="explicit")
    b = mine(x, causal=causal, impl="fused")
    torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_fused_with_weights_is_refused_not_switched():
    """SDPA computes no weights: asking for them on the fused path is an error that names the
    paths that have them, not a silent switch to the explicit path."""
    mine = random_mha(32, 4, 2)
    with pytest.raises(ValueError, match='impl="explicit" or "auto"'):
        mine(torch.randn(1, 5, 32), impl="fused", return_weights=True)
    _, weights = mine(torch.randn(1, 5, 32), impl="auto", return_weights=True)
    assert weights.shape == (1, 4, 5, 5)


@pytest.mark.parametrize(("h", "h_kv"), [(4, None), (4, 2), (4, 1)])
@pytest.mark.parametrize("chunks", [[1] * 10, [3, 3, 4], [1, 6, 2, 1]])
@pytest.mark.parametrize("impl", ["explicit", "fused"])
def test_cached_decoding_equals_full_pass(h, h_kv, chunks, impl):
    mine = random_mha(32, h, h_kv)
    x = torch.randn(2, 10, 32)
    full = mine(x, causal=True)
    cache = mine.new_cache(batch=2, capacity=10)
    parts, start = [], 0
    for size in chunks:
        parts.append(mine(x[:, start : start + size], causal=True, cache=cache, impl=impl))
        start += size
    torch.testing.assert_close(torch.cat(parts, dim=1), full, atol=1e-5, rtol=1e-5)
    assert cache.length == 10


@pytest.mark.parametrize("h_kv", [8, 4, 2, 1])
def test_cache_memory_shrinks_by_h_over_h_kv(h_kv):
    mha_cache = MultiHeadAttention(64, 8).new_cache(batch=2, capacity=100)
    cache = MultiHeadAttention(64, 8, h_kv).new_cache(batch=2, capacity=100)
    assert mha_cache.nbytes == 2 * 2 * 8 * 100 * 8 * 4  # K and V, B, h, s, d_k, fp32 bytes
    assert mha_cache.nbytes / cache.nbytes == 8 / h_kv


def test_head_mask_zeroes_a_head_exactly():
    mine = random_mha(32, 4)
    x = torch.randn(2, 5, 32)
    mask = torch.tensor([1.0, 0.0, 1.0, 1.0])
    got = mine(x, head_mask=mask)
    # oracle: rebuild the output from the reference with head 1's slice of W_O removed
    w = weights_of(mine)
    W_O = w.W_O.copy()
    W_O[8:16] = 0.0
    w2 = type(w)(w.W_Q, w.W_K, w.W_V, W_O, w.b_Q, w.b_K, w.b_V, w.b_O)
    for b in range(2):
        out, _ = multi_head_attention(x[b].double().numpy(), w2, 4)
        np.testing.assert_allclose(got[b].detach().numpy(), out, atol=1e-5)


# --- numerics -----------------------------------------------------------------------------------


@pytest.mark.parametrize("impl", ["explicit", "fused"])
def test_fully_masked_row_gives_zeros_not_nan(impl):
    mine = random_mha(16, 2)
    x = torch.randn(1, 4, 16)
    allowed = torch.ones(1, 1, 4, 4, dtype=torch.bool)
    allowed[..., 2, :] = False
    y, w = mine(x, allowed=allowed, return_weights=True)
    assert torch.isfinite(w).all() and (w[0, :, 2] == 0).all()
    y = mine(x, allowed=allowed, impl=impl)
    assert torch.isfinite(y).all()
    torch.testing.assert_close(y[0, 2], mine.W_O.bias)  # zero heads → only the output bias


def test_softmax_is_stable_for_large_logits():
    q = torch.full((1, 1, 3, 4), 1e4)
    k = torch.full((1, 1, 3, 4), 1e4)
    v = torch.randn(1, 1, 3, 4)
    out, w = attention(q, k, v)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(w.sum(-1), torch.ones(1, 1, 3))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("impl", ["explicit", "fused"])
def test_low_precision_runs_close_to_fp32(dtype, impl):
    mine = random_mha(32, 4, 2)
    x = torch.randn(2, 8, 32)
    expected = mine(x, causal=True)
    got = mine.to(dtype)(x.to(dtype), causal=True, impl=impl)
    assert got.dtype == dtype
    torch.testing.assert_close(got.float(), expected, atol=5e-2, rtol=5e-2)


# --- errors say what is valid -------------------------------------------------------------------


def test_error_d_model_not_divisible_lists_divisors():
    with pytest.raises(ValueError, match=r"valid head counts for d_model=12: 1, 2, 3, 4, 6, 12"):
        MultiHeadAttention(12, 5)


def test_error_kv_heads_not_dividing_lists_valid():
    with pytest.raises(ValueError, match=r"valid n_kv_heads for n_heads=6: 1, 2, 3, 6"):
        MultiHeadAttention(24, 6, 4)


def test_error_wrong_width_and_rank():
    mine = MultiHeadAttention(16, 2)
    with pytest.raises(ValueError, match=r"input width is 8 but this layer has d_model=16"):
        mine(torch.randn(1, 3, 8))
    with pytest.raises(ValueError, match=r"3 dimensions \(B, n, d_model\)"):
        mine(torch.randn(3, 16))


def test_error_mask_shape_and_dtype():
    mine = MultiHeadAttention(16, 2)
    x = torch.randn(2, 3, 16)
    with pytest.raises(ValueError, match=r"does not broadcast to \(B, h, n, s\) = \(2, 2, 3, 3\)"):
        mine(x, allowed=torch.ones(4, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"must be a bool tensor"):
        mine(x, allowed=torch.ones(3, 3))


def test_error_cache_past_capacity():
    mine = MultiHeadAttention(16, 2)
    cache = mine.new_cache(batch=1, capacity=4)
    mine(torch.randn(1, 3, 16), causal=True, cache=cache)
    with pytest.raises(ValueError, match=r"holds 3 of 4 positions and cannot take 2 more"):
        mine(torch.randn(1, 2, 16), causal=True, cache=cache)


def test_error_head_mask_shape():
    with pytest.raises(ValueError, match=r"expected \(2,\) or \(B, 2\)"):
        MultiHeadAttention(16, 2)(torch.randn(1, 3, 16), head_mask=torch.ones(3))


def test_error_gqa_to_torch():
    with pytest.raises(ValueError, match="only MHA converts"):
        MultiHeadAttention(16, 4, 2).to_torch()


def test_kvcache_rejects_wrong_shape():
    cache = KVCache(1, 2, 4, 8)
    with pytest.raises(ValueError, match="do not fit this cache"):
        cache.append(torch.zeros(1, 3, 1, 4), torch.zeros(1, 3, 1, 4))


def test_split_merge_roundtrip_basic():
    x = torch.randn(2, 5, 12)
    assert torch.equal(merge_heads(split_heads(x, 3)), x)


def test_repeat_kv_repeats_each_head_for_its_group_and_views_for_mqa():
    x = torch.randn(2, 3, 5, 4)
    rep = repeat_kv(x, 2)
    assert rep.shape == (2, 6, 5, 4)
    for i in range(6):
        assert torch.equal(rep[:, i], x[:, i // 2])
    one = torch.randn(2, 1, 5, 4)
    view = repeat_kv(one, 8)
    assert view.shape == (2, 8, 5, 4) and view.data_ptr() == one.data_ptr()
    assert view.stride(1) == 0  # no copy: every query head reads the same memory


def test_trace_records_every_stage_and_only_what_is_asked():
    from headlab import Trace

    mine = random_mha(32, 4, 2)
    x = torch.randn(2, 5, 32)
    full = Trace()
    y, w = mine(x, causal=True, trace=full.scope("attn"), return_weights=True)
    names = [name.removeprefix("attn.") for name in full]
    assert names == [
        "x",
        "q_proj",
        "k_proj",
        "v_proj",
        "q",
        "k",
        "v",
        "k_rep",
        "v_rep",
        "scores",
        "weights",
        "head_out",
        "merged",
        "out",
    ]
    assert torch.equal(full["attn.weights"], w) and torch.equal(full["attn.out"], y)
    # the recorded logits, softmaxed under the causal mask, are the recorded weights
    masked = full["attn.scores"].masked_fill(~torch.ones(5, 5).tril().bool(), float("-inf"))
    torch.testing.assert_close(masked.softmax(-1), w)
    only = Trace(only=("weights",))
    mine(x, causal=True, trace=only)
    assert list(only) == ["weights"]
