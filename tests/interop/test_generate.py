"""The model-level KV cache and generation, against the uncached model and transformers.

Cached decoding must give the logits of running the whole sequence at once (every position
family, MHA/GQA/MQA); greedy generation must equal Hugging Face's ``generate`` token for token on
random models built from a config (nothing downloaded); the cache must hold the numbers the
shape calculator and the formula 2 · L · B · h_kv · s · d_k say.
"""

from __future__ import annotations

import pytest
import torch

from headlab import Trace
from headlab.convert import from_hf
from headlab.model import ModelConfig, Transformer, pick_tokens
from headlab.shapes import trace_shapes

transformers = pytest.importorskip("transformers")


def small(**overrides) -> Transformer:
    cfg = dict(vocab_size=50, d_model=36, n_layers=3, n_heads=6, max_len=24)
    cfg.update(overrides)
    model = Transformer(ModelConfig(**cfg)).eval()
    with torch.no_grad():  # larger weights than the training init, so positions matter
        for p in model.parameters():
            p.normal_(0, 0.3)
    return model


@pytest.mark.parametrize("positional", ["learned", "rotary", "none"])
@pytest.mark.parametrize("kv_heads", [6, 2, 1])
def test_cached_logits_equal_the_uncached_forward(positional, kv_heads):
    model = small(positional=positional, n_kv_heads=kv_heads)
    tokens = torch.randint(0, 50, (2, 13))
    with torch.no_grad():
        whole = model(tokens)  # (2, 13, V)
        cache = model.new_cache(2, 13)
        pieces = [model(tokens[:, a:b], cache=cache) for a, b in ((0, 5), (5, 8), (8, 9))]
        pieces += [model(tokens[:, i : i + 1], cache=cache) for i in range(9, 13)]
    torch.testing.assert_close(torch.cat(pieces, dim=1), whole, atol=1e-5, rtol=1e-5)
    assert all(c.length == 13 for c in cache)


def test_cached_step_records_weights_over_every_key_aligned_bottom_right():
    model = small(positional="rotary", n_kv_heads=2)
    tokens = torch.randint(0, 50, (1, 10))
    cache = model.new_cache(1, 10)
    with torch.no_grad():
        model(tokens[:, :7], cache=cache)
        trace = Trace(only=("weights",))
        model(tokens[:, 7:], trace=trace, cache=cache)
        full = Trace(only=("weights",))
        model(tokens, trace=full)
    for l in range(3):
        step = trace[f"blocks.{l}.attn.weights"]  # (1, h, 3, 10): 3 new queries, 10 keys
        assert step.shape == (1, 6, 3, 10)
        torch.testing.assert_close(
            step, full[f"blocks.{l}.attn.weights"][:, :, 7:], atol=1e-6, rtol=1e-5
        )
        assert step[0, :, 0, 8:].abs().max() == 0  # query at position 7 cannot see keys 8, 9


def test_cache_errors_are_sentences():
    model = small()
    cache = model.new_cache(2, 6)
    with pytest.raises(ValueError, match="KV cache is full"):
        model(torch.randint(0, 50, (2, 7)), cache=cache)
    with pytest.raises(ValueError, match="sequences but tokens has 3"):
        model(torch.randint(0, 50, (3, 2)), cache=model.new_cache(2, 6))
    with pytest.raises(ValueError, match="one KVCache per layer"):
        model(torch.randint(0, 50, (2, 2)), cache=cache[:2])
    with pytest.raises(ValueError, match="allowed=None"):
        model(torch.randint(0, 50, (2, 2)), cache=cache, allowed=torch.ones(2, 2, dtype=bool))
    with pytest.raises(ValueError, match=r"capacity must be 1\.\.24"):
        model.new_cache(1, 25)
    encoder = small(causal=False)
    with pytest.raises(ValueError, match="causal"):
        encoder(torch.zeros(1, 2, dtype=torch.long), cache=encoder.new_cache(1, 4))


def test_cache_holds_2_L_B_hkv_s_dk_numbers_as_the_calculator_says():
    d_model, h, L, B, s = 72, 9, 3, 2, 11
    sizes = {}
    for kv in (3, 9):
        model = small(d_model=d_model, n_heads=h, n_kv_heads=kv, n_layers=L)
        cache = model.new_cache(B, s)
        numbers = sum(c.k.numel() + c.v.numel() for c in cache)
        assert numbers == 2 * L * B * kv * s * (d_model // h)
        per_layer = trace_shapes(d_model, h, 1, B, kv, cache_len=s - 1).to_dict()
        assert sum(c.nbytes for c in cache) == L * per_layer["kv_cache_bytes"]
        sizes[kv] = numbers
    assert sizes[9] == 3 * sizes[3]


def llama(**kw):
    cfg = dict(
        vocab_size=57,
        hidden_size=48,
        num_hidden_layers=2,
        num_attention_heads=6,
        num_key_value_heads=2,
        intermediate_size=64,
        max_position_embeddings=40,
        rope_theta=10000.0,
        tie_word_embeddings=False,
    )
    cfg.update(kw)
    config = transformers.LlamaConfig(**cfg)
    config._attn_implementation = "eager"
    return scrambled(transformers.LlamaForCausalLM(config))


def gpt2():
    config = transformers.GPT2Config(vocab_size=61, n_embd=32, n_layer=2, n_head=4, n_positions=40)
    config._attn_implementation = "eager"
    return scrambled(transformers.GPT2LMHeadModel(config))


def scrambled(model):
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, p in model.named_parameters():
            is_norm = "norm" in name.lower() or "ln_" in name
            p.copy_((1.0 if is_norm else 0.0) + 0.2 * torch.randn(p.shape, generator=g))
    return model.eval()


def hf_greedy(hf, tokens: torch.Tensor, new: int) -> torch.Tensor:
    """transformers' own greedy decoding with its own KV cache, end-of-sequence switched off."""
    hf.generation_config.eos_token_id = None
    hf.generation_config.pad_token_id = 0
    with torch.no_grad():
        return hf.generate(tokens, max_new_tokens=new, do_sample=False, min_new_tokens=new)


@pytest.mark.parametrize("family", ["llama-gqa", "llama-mqa", "gpt2"])
def test_greedy_generation_equals_transformers_generate(family):
    hf = {"llama-gqa": llama, "llama-mqa": lambda: llama(num_key_value_heads=1), "gpt2": gpt2}[
        family
    ]()
    tokens = torch.randint(3, 50, (2, 7))
    expected = hf_greedy(hf, tokens, 20)
    ours = from_hf(hf).generate(tokens, 20)
    assert ours.shape == (2, 27)
    assert ours.tolist() == expected.tolist()


def test_default_model_generates_the_greedy_argmax_of_its_uncached_forward():
    from headlab import zoo

    model, tokenizer = zoo.load("default")
    prompt = torch.tensor([tokenizer.encode("The cat sat on the")])
    out = model.generate(prompt, 6)
    with torch.no_grad():  # a plain loop: rerun the whole sequence for every new token
        seq = prompt
        for _ in range(6):
            seq = torch.cat([seq, model(seq)[:, -1].argmax(-1, keepdim=True)], dim=1)
    assert out.tolist() == seq.tolist()


def test_sampling_is_seeded_and_respects_top_k():
    model = small(positional="rotary")
    prompt = torch.randint(0, 50, (3, 4))
    a = model.generate(prompt, 12, temperature=1.5, top_k=3, seed=7)
    b = model.generate(prompt, 12, temperature=1.5, top_k=3, seed=7)
    assert a.tolist() == b.tolist()
    assert a.tolist() != model.generate(prompt, 12, temperature=1.5, seed=8).tolist()
    # top_k = 1 is greedy whatever the temperature
    assert model.generate(prompt, 12, temperature=2.0, top_k=1, seed=1).tolist() == (
        model.generate(prompt, 12).tolist()
    )
    logits = torch.tensor([[0.0, 5.0, 4.0, -1.0, 3.0]]).repeat(2000, 1)
    drawn = pick_tokens(logits, 1.0, 2, torch.Generator().manual_seed(0))
    assert set(drawn.tolist()) == {1, 2}  # only the two most likely, in softmax proportion
    share = (drawn == 1).float().mean().item()
    assert abs(share - torch.softmax(torch.tensor([5.0, 4.0]), 0)[0].item()) < 0.04


def test_a_temperature_too_small_to_divide_by_picks_the_likeliest_token():
    """`generate --temperature 1e-320` failed in torch.multinomial (probabilities inf/nan):
    dividing by it overflows, and the limit of sampling as T → 0 is the greedy pick."""
    logits = torch.tensor([[0.0, 5.0, 4.0, -1.0, 3.0], [2.0, 0.0, 1.0, 9.0, 0.5]])
    for tiny in (1e-320, 5e-324, 1e-45, 1e-38):
        drawn = pick_tokens(logits, tiny, None, torch.Generator().manual_seed(0))
        assert drawn.tolist() == [1, 3], tiny
        assert pick_tokens(logits, tiny, 2, None).tolist() == [1, 3]
    model = small(positional="rotary")
    prompt = torch.randint(0, 50, (2, 4))
    assert model.generate(prompt, 6, temperature=1e-320, seed=3).tolist() == (
        model.generate(prompt, 6).tolist()
    )


def test_logits_that_are_not_finite_are_a_sentence():
    broken = torch.tensor([[0.0, float("nan"), 1.0]])
    with pytest.raises(ValueError, match="not finite"):
        pick_tokens(broken, 1.0, None, None)


def test_generation_stops_at_the_end_token_and_pads_with_it():
    model = small(positional="rotary")
    prompt = torch.randint(0, 50, (2, 3))
    free = model.generate(prompt, 10)
    eos = int(free[0, 5])  # the token row 0 emits third
    out = model.generate(prompt, 10, eos_id=eos)
    row0 = out[0, 3:].tolist()
    assert row0[: row0.index(eos) + 1] == free[0, 3 : 3 + row0.index(eos) + 1].tolist()
    assert all(t == eos for t in row0[row0.index(eos) :])


def test_generation_settings_errors_are_sentences():
    model = small()  # max_len 24
    prompt = torch.randint(0, 50, (1, 20))
    with pytest.raises(ValueError, match="at least 1, got 0"):
        model.generate(prompt, 0)
    with pytest.raises(ValueError, match="at most 4 new tokens fit, not 5"):
        model.generate(prompt, 5)
    with pytest.raises(ValueError, match="no room for new tokens"):
        model.generate(torch.randint(0, 50, (1, 30)), 1)
    with pytest.raises(ValueError, match="temperature"):
        model.generate(prompt, 1, temperature=-1)
    with pytest.raises(ValueError, match="top_k"):
        model.generate(prompt, 1, temperature=1, top_k=0)
    with pytest.raises(ValueError, match="causal"):
        small(causal=False).generate(prompt, 1)


# --- headlab generate ----------------------------------------------------------------------------


def cli(*args: str):
    from typer.testing import CliRunner

    from headlab.cli import app

    return CliRunner().invoke(app, list(args))


def test_cli_generate_json_is_the_models_greedy_continuation():
    import json

    from headlab import zoo

    result = cli(
        "generate",
        "--model",
        "default",
        "--prompt",
        "The cat sat",
        "--max-new-tokens",
        "5",
        "--json",
    )
    assert result.exit_code == 0, result.output
    body = json.loads(result.stdout)
    model, tokenizer = zoo.load("default")
    prompt = torch.tensor([tokenizer.encode("The cat sat")])
    expected = model.generate(prompt, 5)[0, prompt.shape[1] :].tolist()
    assert body["prompt_ids"] == prompt[0].tolist()
    assert body["new_ids"] == expected[: len(body["new_ids"])]
    assert body["text"] == tokenizer.decode(
        body["new_ids"][:-1] if body["stopped"] else body["new_ids"]
    )


def test_cli_generate_heads_labels_every_head_of_prompt_and_continuation():
    import json

    result = cli(
        "generate",
        "--prompt",
        "The cat sat on the mat.",
        "--max-new-tokens",
        "4",
        "--heads",
        "--json",
    )
    assert result.exit_code == 0, result.output
    body = json.loads(result.stdout)
    from headlab import zoo

    model, _ = zoo.load("default")
    heads = body["heads"]["heads"]
    assert len(heads) == model.config.n_layers * model.config.n_heads
    assert len(body["heads"]["tokens"]) == len(body["prompt_ids"]) + len(body["new_ids"])
    table = cli("generate", "--prompt", "The cat sat.", "--max-new-tokens", "3", "--heads")
    assert table.exit_code == 0 and "label" in table.stdout


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"--max-new-tokens": "0"}, "at least 1, got 0"),
        ({"--max-new-tokens": "-3"}, "at least 1, got -3"),
        ({"--prompt": "word " * 200}, "no room for new tokens"),
        ({"--prompt": "   "}, "the prompt is empty"),
        ({"--model": "no-such-model"}, "unknown model 'no-such-model'"),
        ({"--temperature": "-1"}, "temperature must be 0"),
    ],
)
def test_cli_generate_bad_input_exits_2_with_a_sentence(overrides, message):
    options = {"--model": "default", "--prompt": "The cat", **overrides}
    result = cli("generate", *[x for pair in options.items() for x in pair])
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.stderr.split())
    assert "Traceback" not in result.output


def test_cli_generate_with_a_vanishing_temperature_is_greedy():
    """`generate --prompt hello --temperature 1e-320 --max-new-tokens 2` gave a traceback."""
    import json

    tiny = cli(
        "generate",
        "--prompt",
        "hello",
        "--temperature",
        "1e-320",
        "--max-new-tokens",
        "2",
        "--json",
    )
    assert tiny.exit_code == 0 and "Traceback" not in tiny.output, tiny.output
    greedy = cli("generate", "--prompt", "hello", "--max-new-tokens", "2", "--json")
    assert json.loads(tiny.stdout)["new_ids"] == json.loads(greedy.stdout)["new_ids"]
    assert "too small" in " ".join(cli("generate", "--help").stdout.split())
