"""Properties of the attention layer over random configurations (hypothesis)."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from headlab import MultiHeadAttention, merge_heads, split_heads


@st.composite
def configs(draw):
    h_kv = draw(st.integers(1, 4))
    h = h_kv * draw(st.integers(1, 3))
    d_k = draw(st.integers(1, 6))
    B = draw(st.integers(1, 3))
    n = draw(st.integers(1, 8))
    seed = draw(st.integers(0, 2**16))
    return h * d_k, h, h_kv, B, n, seed


def build(d_model, h, h_kv, seed):
    torch.manual_seed(seed)
    return MultiHeadAttention(d_model, h, h_kv).double().eval()


@settings(max_examples=60, deadline=None)
@given(configs())
def test_output_shape_equals_input_shape(cfg):
    d_model, h, h_kv, B, n, seed = cfg
    m = build(d_model, h, h_kv, seed)
    x = torch.randn(B, n, d_model, dtype=torch.float64)
    y, w = m(x, return_weights=True)
    assert y.shape == x.shape
    assert w.shape == (B, h, n, n)
    torch.testing.assert_close(w.sum(-1), torch.ones(B, h, n, dtype=torch.float64))


@settings(max_examples=60, deadline=None)
@given(configs(), st.data())
def test_permutation_equivariant_without_mask(cfg, data):
    d_model, h, h_kv, B, n, seed = cfg
    m = build(d_model, h, h_kv, seed)
    x = torch.randn(B, n, d_model, dtype=torch.float64)
    perm = torch.tensor(data.draw(st.permutations(range(n))))
    torch.testing.assert_close(m(x)[:, perm], m(x[:, perm]))


@settings(max_examples=60, deadline=None)
@given(configs(), st.data())
def test_causal_output_ignores_the_future(cfg, data):
    d_model, h, h_kv, B, n, seed = cfg
    m = build(d_model, h, h_kv, seed)
    i = data.draw(st.integers(0, n - 1))
    x = torch.randn(B, n, d_model, dtype=torch.float64)
    x2 = x.clone()
    x2[:, i + 1 :] = torch.randn_like(x2[:, i + 1 :])
    torch.testing.assert_close(m(x, causal=True)[:, : i + 1], m(x2, causal=True)[:, : i + 1])


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 4), st.integers(1, 9), st.integers(1, 8), st.integers(1, 8))
def test_split_and_merge_are_inverses(B, n, heads, d):
    x = torch.randn(B, n, heads * d)
    parts = split_heads(x, heads)
    assert parts.shape == (B, heads, n, d)
    assert torch.equal(merge_heads(parts), x)
    # head i is exactly the i-th slice of width d
    for i in range(heads):
        assert torch.equal(parts[:, i], x[..., i * d : (i + 1) * d])
