"""The Transformer: trace names, masks, head ablation, rotary positions, save/load, errors."""

from __future__ import annotations

import cmath
import json
import math

import pytest
import torch

from headlab import Trace
from headlab.model import ModelConfig, Rotary, Transformer


def small(**overrides) -> Transformer:
    cfg = dict(vocab_size=50, d_model=32, n_layers=2, n_heads=4, max_len=16)
    cfg.update(overrides)
    model = Transformer(ModelConfig(**cfg)).eval()
    with torch.no_grad():  # larger weights than the training init, so heads differ visibly
        for p in model.parameters():
            p.normal_(0, 0.3)
    return model


def test_logits_shape_and_trace_names():
    model = small()
    tokens = torch.randint(0, 50, (3, 7))
    trace = Trace()
    logits = model(tokens, trace=trace)
    assert logits.shape == (3, 7, 50)
    shapes = trace.shapes()
    for l in range(2):
        assert shapes[f"blocks.{l}.attn.weights"] == (3, 4, 7, 7)
        assert shapes[f"blocks.{l}.attn.head_out"] == (3, 4, 7, 8)
        for name in ("resid_pre", "resid_mid", "resid_post", "attn_out", "mlp_out"):
            assert shapes[f"blocks.{l}.{name}"] == (3, 7, 32)
    # the residual stream is a sum: resid_post = resid_mid + mlp_out = resid_pre + attn_out + …
    b0 = "blocks.0."
    torch.testing.assert_close(
        trace[b0 + "resid_mid"], trace[b0 + "resid_pre"] + trace[b0 + "attn_out"]
    )
    torch.testing.assert_close(
        trace[b0 + "resid_post"], trace[b0 + "resid_mid"] + trace[b0 + "mlp_out"]
    )
    torch.testing.assert_close(trace["blocks.1.resid_pre"], trace[b0 + "resid_post"])


def test_traced_explicit_path_equals_fused_path():
    model = small(positional="rotary", n_kv_heads=2)
    tokens = torch.randint(0, 50, (2, 9))
    torch.testing.assert_close(model(tokens, trace=Trace(only=("weights",))), model(tokens))


@pytest.mark.parametrize("causal", [True, False])
def test_causal_model_ignores_the_future_and_encoder_does_not(causal):
    model = small(causal=causal)
    a = torch.randint(0, 50, (1, 8))
    b = a.clone()
    b[0, -1] = (a[0, -1] + 1) % 50
    same = torch.allclose(model(a)[0, :-1], model(b)[0, :-1], atol=1e-5)
    assert same == causal
    trace = Trace(only=("weights",))
    model(a, trace=trace)
    upper = torch.triu(trace["blocks.0.attn.weights"][0], diagonal=1)
    assert (upper.abs().max() == 0) == causal


def test_padding_mask_makes_padded_batch_match_the_short_sequence():
    model = small(causal=False, norm="post", embed_norm=True)
    short = torch.randint(0, 50, (1, 5))
    padded = torch.cat([short, torch.zeros(1, 3, dtype=torch.long)], dim=1)
    allowed = torch.tensor([[True] * 5 + [False] * 3])
    torch.testing.assert_close(model(padded, allowed=allowed)[:, :5], model(short))
    assert not torch.allclose(model(padded)[:, :5], model(short), atol=1e-4)


def test_head_mask_equals_zeroing_that_heads_slice_of_W_O():
    model = small()
    tokens = torch.randint(0, 50, (2, 6))
    mask = torch.ones(2, 4)
    mask[1, 2] = 0.0  # ablate layer 1, head 2
    masked = model(tokens, head_mask=mask)
    d_k = 8
    with torch.no_grad():
        model.blocks[1].attn.W_O.weight[:, 2 * d_k : 3 * d_k] = 0.0
    torch.testing.assert_close(masked, model(tokens))


def test_head_mask_reaches_every_layer_and_accepts_a_batch():
    model = small(attn_only=True)
    tokens = torch.randint(0, 50, (2, 6))
    full = model(tokens)
    for l in range(2):
        mask = torch.ones(2, 4)
        mask[l] = 0.0
        assert not torch.allclose(model(tokens, head_mask=mask), full)
    per_seq = torch.ones(2, 2, 4)
    per_seq[1, 0, :] = 0.0  # ablate layer 0 for the second sequence only
    out = model(tokens, head_mask=per_seq)
    torch.testing.assert_close(out[0], full[0])
    layer0_off = torch.ones(2, 4)
    layer0_off[0] = 0.0
    torch.testing.assert_close(out[1], model(tokens[1:], head_mask=layer0_off)[0])


def test_attn_only_has_no_mlp():
    model = small(attn_only=True)
    trace = Trace()
    model(torch.randint(0, 50, (1, 4)), trace=trace)
    assert "blocks.0.mlp_out" not in trace
    assert not any("mlp" in name for name, _ in model.named_parameters())


def test_rotary_matches_complex_rotation():
    """RoPE as Su et al. write it: pair (x_i, x_{i+d/2}) times e^{i·pos·θ_i}."""
    d_k, theta, offset = 8, 10000.0, 3
    x = torch.randn(1, 1, 5, d_k, dtype=torch.float64)
    got = Rotary(d_k, theta).double()(x, offset)
    for pos in range(5):
        for i in range(d_k // 2):
            z = complex(x[0, 0, pos, i], x[0, 0, pos, i + d_k // 2])
            w = z * cmath.exp(1j * (offset + pos) * theta ** (-2 * i / d_k))
            assert got[0, 0, pos, i].item() == pytest.approx(w.real)
            assert got[0, 0, pos, i + d_k // 2].item() == pytest.approx(w.imag)


def test_rotary_scores_depend_only_on_relative_position():
    rope = Rotary(16, 10000.0)
    q, k = torch.randn(1, 1, 1, 16), torch.randn(1, 1, 1, 16)
    a = (rope(q, 5) * rope(k, 2)).sum()
    b = (rope(q, 11) * rope(k, 8)).sum()
    assert a.item() == pytest.approx(b.item(), rel=1e-4)


def test_gqa_rmsnorm_gated_model_runs():
    model = small(
        n_kv_heads=1,
        positional="rotary",
        norm_kind="rmsnorm",
        mlp="gated",
        activation="silu",
        bias=False,
        mlp_bias=False,
        tie_embeddings=False,
    )
    trace = Trace()
    model(torch.randint(0, 50, (2, 5)), trace=trace)
    assert trace["blocks.0.attn.k"].shape == (2, 1, 5, 8)
    assert trace["blocks.0.attn.weights"].shape == (2, 4, 5, 5)


def test_save_load_roundtrip(tmp_path):
    model = small(tie_embeddings=True)
    tokens = torch.randint(0, 50, (2, 6))
    model.save(tmp_path / "m")
    loaded = Transformer.load(tmp_path / "m")
    assert loaded.config == model.config
    torch.testing.assert_close(loaded(tokens), model(tokens))
    assert loaded.unembed.weight is loaded.embed.weight


def test_load_missing_directory_names_the_file(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"config\.json"):
        Transformer.load(tmp_path)


def test_a_config_read_from_json_names_the_field_of_the_wrong_type(tmp_path):
    """`"d_model": "x"` in a model folder's config.json was a TypeError deep in the checks
    (issue 43); each field of the wrong type is named with what it takes, with the file."""
    from headlab.model.config import read_config

    good = small().config.to_dict()
    wrong = {"d_model": "x", "n_heads": 4.0, "causal": 1, "n_kv_heads": "2", "norm_eps": True}
    wrong |= {"local_layers": [0, "1"], "positional": 3}
    for field, value in wrong.items():
        with pytest.raises(ValueError, match=f"^{field} must be "):
            ModelConfig.from_dict({**good, field: value})
    with pytest.raises(ValueError, match="has no d_model; it takes an integer"):
        ModelConfig.from_dict({k: v for k, v in good.items() if k != "d_model"})
    assert ModelConfig.from_dict({**good, "norm_eps": 1, "d_ff": None}).norm_eps == 1
    (tmp_path / "config.json").write_text('{"d_model": 1,')
    with pytest.raises(ValueError, match=r"config\.json is not valid JSON"):
        read_config(tmp_path / "config.json")
    saved = small().save(tmp_path / "m")
    (saved / "config.json").write_text(json.dumps({**good, "d_model": "x"}))
    with pytest.raises(ValueError, match=r"m/config\.json: d_model must be an integer, got 'x'"):
        Transformer.load(saved)
    (saved / "model.safetensors").write_bytes(b"")
    (saved / "config.json").write_text(json.dumps(good))
    with pytest.raises(ValueError, match="cannot be read as safetensors"):
        Transformer.load(saved)


def test_config_errors_say_what_is_valid():
    with pytest.raises(ValueError, match="valid head counts"):
        ModelConfig(vocab_size=10, d_model=30, n_layers=1, n_heads=4)
    with pytest.raises(ValueError, match="positional must be one of"):
        ModelConfig(vocab_size=10, d_model=32, n_layers=1, n_heads=4, positional="sinusoid")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="unknown ModelConfig fields"):
        ModelConfig.from_dict({"vocab_size": 10, "d_model": 8, "n_layers": 1, "n_heads": 2, "x": 1})


def test_input_errors():
    model = small()
    with pytest.raises(ValueError, match=r"outside 1\.\.16"):
        model(torch.zeros(1, 17, dtype=torch.long))
    with pytest.raises(ValueError, match=r"token ids must be in 0\.\.49"):
        model(torch.tensor([[3, 50]]))
    with pytest.raises(ValueError, match=r"\(n_layers, h\)"):
        model(torch.zeros(1, 3, dtype=torch.long), head_mask=torch.ones(4))
    with pytest.raises(ValueError, match="padding"):
        model(torch.zeros(1, 3, dtype=torch.long), allowed=torch.ones(1, 3))


def test_default_init_is_small_and_gives_near_uniform_predictions():
    model = Transformer(ModelConfig(vocab_size=64, d_model=32, n_layers=2, n_heads=4))
    logits = model(torch.randint(0, 64, (2, 10)))
    loss = torch.nn.functional.cross_entropy(logits.view(-1, 64), torch.randint(0, 64, (20,)))
    assert abs(loss.item() - math.log(64)) < 0.2
