"""Hugging Face → headlab conversion, exact against `transformers` on randomly initialised models.

Every model here is built from a small config (nothing is downloaded), its weights are scrambled
so that biases and norm gains matter, and HF runs with eager attention and
``output_attentions=True``: logits / hidden states and each head's weights must agree to 1e-4.
"""

from __future__ import annotations

import pytest
import torch

from headlab import Trace
from headlab.convert import from_hf

transformers = pytest.importorskip("transformers")

TOL = dict(atol=1e-4, rtol=1e-4)


def scramble(model, std: float = 0.15):
    """Random weights everywhere (HF initialises biases to 0 and norm gains to 1)."""
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name.lower() or "ln_" in name:
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(std * torch.randn(p.shape, generator=g))
    return model.eval()


def headlab_run(model, tokens, allowed=None):
    trace = Trace(only=("weights",))
    with torch.no_grad():
        logits = model(tokens, trace=trace, allowed=allowed)
    L = model.config.n_layers
    return (
        logits,
        [trace[f"blocks.{l}.attn.weights"] for l in range(L)],
    )


def assert_heads_match(ours, theirs):
    assert len(ours) == len(theirs)
    for l, (a, b) in enumerate(zip(ours, theirs, strict=True)):
        assert a.shape == b.shape, l
        torch.testing.assert_close(a, b, **TOL, msg=f"layer {l} attention weights differ")


def gpt2(**kw):
    cfg = dict(vocab_size=61, n_embd=32, n_layer=2, n_head=4, n_positions=24)
    cfg.update(kw)
    config = transformers.GPT2Config(**cfg)
    config._attn_implementation = "eager"
    return scramble(transformers.GPT2LMHeadModel(config))


@pytest.mark.parametrize("activation", ["gelu_new", "relu"])
def test_gpt2_logits_and_every_head_match(activation):
    hf = gpt2(activation_function=activation)
    tokens = torch.randint(0, 61, (2, 17))
    with torch.no_grad():
        ref = hf(tokens, output_attentions=True)
    ours = from_hf(hf)
    logits, weights = headlab_run(ours, tokens)
    torch.testing.assert_close(logits, ref.logits, **TOL)
    assert_heads_match(weights, ref.attentions)
    assert ours.config.causal and ours.config.norm == "pre"


def test_gpt2_bare_model_hidden_states_match():
    hf_lm = gpt2()
    bare = hf_lm.transformer
    tokens = torch.randint(0, 61, (1, 9))
    with torch.no_grad():
        ref = bare(tokens, output_attentions=True)
    ours = from_hf(bare)
    trace = Trace()
    with torch.no_grad():
        ours(tokens, trace=trace)
    torch.testing.assert_close(trace["final"], ref.last_hidden_state, **TOL)


def bert(**kw):
    cfg = dict(
        vocab_size=53,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=48,
        max_position_embeddings=20,
    )
    cfg.update(kw)
    config = transformers.BertConfig(**cfg)
    config._attn_implementation = "eager"
    return scramble(transformers.BertModel(config, add_pooling_layer=False))


def test_bert_hidden_states_and_every_head_match():
    hf = bert()
    tokens = torch.randint(0, 53, (2, 13))
    with torch.no_grad():
        ref = hf(tokens, output_attentions=True, output_hidden_states=True)
    ours = from_hf(hf)
    trace = Trace()
    with torch.no_grad():
        ours(tokens, trace=trace)
    torch.testing.assert_close(trace["final"], ref.last_hidden_state, **TOL)
    torch.testing.assert_close(trace["embed"], ref.hidden_states[0], **TOL)
    for l in range(2):
        torch.testing.assert_close(trace[f"blocks.{l}.resid_post"], ref.hidden_states[l + 1], **TOL)
    assert_heads_match([trace[f"blocks.{l}.attn.weights"] for l in range(2)], ref.attentions)
    assert not ours.config.causal and ours.config.norm == "post"


def test_bert_with_padding_matches_hf_attention_mask():
    hf = bert()
    tokens = torch.randint(0, 53, (2, 10))
    mask = torch.ones(2, 10, dtype=torch.long)
    mask[1, 6:] = 0  # the second sequence is 6 tokens and 4 pads
    with torch.no_grad():
        ref = hf(tokens, attention_mask=mask, output_attentions=True)
    ours = from_hf(hf)
    trace = Trace()
    with torch.no_grad():
        ours(tokens, trace=trace, allowed=mask.bool())
    torch.testing.assert_close(trace["final"][0], ref.last_hidden_state[0], **TOL)
    torch.testing.assert_close(trace["final"][1, :6], ref.last_hidden_state[1, :6], **TOL)
    for l in range(2):
        torch.testing.assert_close(
            trace[f"blocks.{l}.attn.weights"][1, :, :6], ref.attentions[l][1, :, :6], **TOL
        )
        assert trace[f"blocks.{l}.attn.weights"][1, :, :, 6:].abs().max() == 0


def roberta(kind: str = "Roberta", **kw):
    """A random RoBERTa (or XLM-R: ``kind="XLMRoberta"``): BERT's layers, positions from
    padding_idx + 1 (pad id 1, so a 20-row table takes 18 tokens)."""
    cfg = dict(
        vocab_size=53,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=48,
        max_position_embeddings=20,
        pad_token_id=1,
    )
    cfg.update(kw)
    config = getattr(transformers, f"{kind}Config")(**cfg)
    config._attn_implementation = "eager"
    return scramble(getattr(transformers, f"{kind}Model")(config, add_pooling_layer=False))


@pytest.mark.parametrize("kind", ["Roberta", "XLMRoberta"])
def test_roberta_hidden_states_and_every_head_match_to_the_last_position(kind):
    """Positions counted from padding_idx + 1, up to the table's last row: every hidden state
    and head on 18 tokens (the longest the 20-row table takes), the converted model refusing a
    19th; with right padding (HF's mask) the real tokens match too."""
    hf = roberta(kind)
    ours = from_hf(hf)
    assert ours.config.max_len == 18 and not ours.config.causal
    tokens = torch.randint(2, 53, (2, 18), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        ref = hf(tokens, output_attentions=True, output_hidden_states=True)
    trace = Trace()
    with torch.no_grad():
        ours(tokens, trace=trace)
    torch.testing.assert_close(trace["embed"], ref.hidden_states[0], **TOL)
    torch.testing.assert_close(trace["final"], ref.last_hidden_state, **TOL)
    assert_heads_match([trace[f"blocks.{l}.attn.weights"] for l in range(2)], ref.attentions)
    with pytest.raises(ValueError, match="18"):
        ours(torch.randint(2, 53, (1, 19)))
    padded, mask = tokens[:, :12].clone(), torch.ones(2, 12, dtype=torch.long)
    padded[1, 7:], mask[1, 7:] = 1, 0  # the second sequence is 7 tokens and 5 pads
    with torch.no_grad():
        ref = hf(padded, attention_mask=mask, output_attentions=True)
        ours(padded, trace=(trace := Trace()), allowed=mask.bool())
    torch.testing.assert_close(trace["final"][1, :7], ref.last_hidden_state[1, :7], **TOL)
    torch.testing.assert_close(trace["final"][0], ref.last_hidden_state[0], **TOL)


def llama(**kw):
    cfg = dict(
        vocab_size=57,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=40,
        max_position_embeddings=32,
    )
    cfg.update(kw)
    config = transformers.LlamaConfig(**cfg)
    config._attn_implementation = "eager"
    return scramble(transformers.LlamaForCausalLM(config))


@pytest.mark.parametrize(
    ("kv_heads", "tie", "theta"), [(2, False, 10000.0), (1, True, 500.0), (4, False, 10000.0)]
)
def test_llama_gqa_rotary_logits_and_every_head_match(kv_heads, tie, theta):
    hf = llama(num_key_value_heads=kv_heads, tie_word_embeddings=tie, rope_theta=theta)
    assert hf.config.rope_parameters["rope_theta"] == theta
    tokens = torch.randint(0, 57, (2, 19))
    with torch.no_grad():
        ref = hf(tokens, output_attentions=True)
    ours = from_hf(hf)
    assert ours.config.n_kv_heads == kv_heads and ours.config.positional == "rotary"
    logits, weights = headlab_run(ours, tokens)
    torch.testing.assert_close(logits, ref.logits, **TOL)
    assert_heads_match(weights, ref.attentions)


def test_unsupported_family_is_named():
    config = transformers.BloomConfig(vocab_size=20, hidden_size=16, n_layer=1, n_head=2)
    families = "bert, roberta, xlm-roberta, gpt2, opt, llama"
    with pytest.raises(
        ValueError,
        match=f"cannot convert a 'bloom' model; supported Hugging Face families: {families}",
    ):
        from_hf(transformers.BloomModel(config))


def test_unsupported_variants_are_refused_with_a_reason():
    with pytest.raises(ValueError, match="only the default RoPE"):
        from_hf(llama(rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4}))
    with pytest.raises(ValueError, match="scaling"):
        from_hf(gpt2(scale_attn_by_inverse_layer_idx=True))


@pytest.mark.parametrize("pooler", [False, True])
def test_a_roberta_folder_loads_offline_and_its_heads_are_scored(
    tmp_path, monkeypatch, caplog, pooler
):
    """A saved RoBERTa (safetensors and a tokenizer.json) loads by its folder, offline, as the
    encoder it is (transformers' AutoModel, not a causal LM), equals transformers' hidden
    states, and `headlab heads` scores every head of it as a bidirectional model."""
    import json
    import shutil
    from pathlib import Path

    from typer.testing import CliRunner

    from headlab import zoo
    from headlab.cli import app

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    caplog.set_level("WARNING")
    hf = roberta(vocab_size=1024, max_position_embeddings=66)  # the shipped tokenizer's vocab
    if pooler:  # a checkpoint with one (MiniLM's has one): built, so not reported unexpected
        hf = scramble(transformers.RobertaModel(hf.config, add_pooling_layer=True))
    folder = tmp_path / "my-roberta"
    hf.save_pretrained(folder)
    shutil.copy(Path(zoo.WEIGHTS_DIR) / "tokenizer.json", folder / "tokenizer.json")
    model, _ = zoo.load(str(folder))
    tokens = torch.randint(2, 1024, (1, 30), generator=torch.Generator().manual_seed(4))
    trace = Trace()
    with torch.no_grad():
        ref = hf(tokens)
        model(tokens, trace=trace)
    torch.testing.assert_close(trace["final"], ref.last_hidden_state, **TOL)
    result = CliRunner().invoke(
        app,
        [
            "heads",
            "--model",
            str(folder),
            "--json",
            "--no-floors",
            "--text",
            "The cat sat on the mat.",
        ],
    )
    assert result.exit_code == 0, result.output
    body = json.loads(result.stdout)
    assert len(body["heads"]) == 2 * 4 and "next" in body["heads"][0]["scores"]  # both ways
    said = result.output + caplog.text  # the pooler built exactly where the checkpoint has one
    assert "pooler" not in said and "MISSING" not in said and "UNEXPECTED" not in said, said
