"""Ten more Hugging Face families → headlab, exact against `transformers` on random models.

Each model is built from a small config (nothing is downloaded) with its family's quirks switched
on: a sliding window shorter than the input, soft-capped scores and logits, query pre-scaling,
QK-norm, two RoPE bases, partial rotary, a parallel residual, biases on Q/K/V alone, fused
projections, a head width other than d_model / h. Its weights are scrambled so that biases and
norm gains matter, and transformers runs with eager attention and ``output_attentions=True``:
logits agree within 1e-4 and every head's weights within 1e-5. Each quirk is then switched off in
the converted model alone, and the logits must move: the agreement is not an accident of one.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from headlab import Trace, zoo
from headlab.convert import SUPPORTED, from_hf
from headlab.model import ModelConfig, Transformer

transformers = pytest.importorskip("transformers")

LOGITS = dict(atol=1e-4, rtol=1e-4)
WEIGHTS = dict(atol=1e-5, rtol=1e-5)
N = 19  # tokens: longer than every window below
TOKENIZER = Path(__file__).parents[2] / "src" / "headlab" / "weights" / "tokenizer.json"
VOCAB = 1024  # the shipped tokenizer's, so a saved model can be run from the command line

BASE = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    num_hidden_layers=3,
    num_attention_heads=4,
    intermediate_size=40,
    max_position_embeddings=64,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
)
GEMMA_ROPE = {
    "full_attention": {"rope_type": "default", "rope_theta": 1e6},
    "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
}
LOCAL_GLOBAL = ["sliding_attention", "full_attention", "sliding_attention"]

# family → (config class, model class, the config fields that switch its quirks on)
FAMILIES = {
    "opt": ("OPTConfig", "OPTForCausalLM", dict(ffn_dim=40, word_embed_proj_dim=32)),
    "qwen2": (
        "Qwen2Config",
        "Qwen2ForCausalLM",
        dict(num_key_value_heads=2, use_sliding_window=True, sliding_window=5, max_window_layers=1),
    ),
    "qwen3": (
        "Qwen3Config",
        "Qwen3ForCausalLM",
        dict(
            num_key_value_heads=2,
            head_dim=12,
            attention_bias=True,
            use_sliding_window=True,
            sliding_window=5,
            max_window_layers=1,
        ),
    ),
    "olmo": ("OlmoConfig", "OlmoForCausalLM", dict(num_key_value_heads=2, attention_bias=True)),
    "mistral": (
        "MistralConfig",
        "MistralForCausalLM",
        dict(num_key_value_heads=2, head_dim=12, sliding_window=4),
    ),
    "gemma": ("GemmaConfig", "GemmaForCausalLM", dict(num_key_value_heads=1, head_dim=16)),
    "gemma2": (
        "Gemma2Config",
        "Gemma2ForCausalLM",
        dict(
            num_key_value_heads=2,
            head_dim=16,
            query_pre_attn_scalar=24,
            sliding_window=5,
            attn_logit_softcapping=1.5,
            final_logit_softcapping=2.0,
        ),
    ),
    "gemma3_text": (
        "Gemma3TextConfig",
        "Gemma3ForCausalLM",
        dict(
            num_key_value_heads=1,
            head_dim=16,
            query_pre_attn_scalar=24,
            sliding_window=5,
            layer_types=LOCAL_GLOBAL,
            rope_parameters=GEMMA_ROPE,
            final_logit_softcapping=2.0,
        ),
    ),
    "gpt_neox": (
        "GPTNeoXConfig",
        "GPTNeoXForCausalLM",
        dict(
            rope_parameters={
                "rope_type": "default",
                "rope_theta": 1e4,
                "partial_rotary_factor": 0.25,
            },
            use_parallel_residual=True,
        ),
    ),
    "phi3": (
        "Phi3Config",
        "Phi3ForCausalLM",
        dict(
            num_key_value_heads=2,
            sliding_window=6,
            rope_parameters={
                "rope_type": "default",
                "rope_theta": 1e4,
                "partial_rotary_factor": 0.5,
            },
        ),
    ),
}

# family → quirk → the headlab config change that switches it off
QUIRKS = {
    "opt": {"relu": dict(activation="gelu")},
    "qwen2": {"window": dict(sliding_window=None, local_layers=()), "qkv biases": "zero"},
    "qwen3": {
        "qk-norm": dict(qk_norm=False),
        "attention biases": "zero",
        "window": dict(sliding_window=None, local_layers=()),
    },
    "mistral": {"window": dict(sliding_window=None, local_layers=())},
    "olmo": {"layernorm": dict(norm_kind="rmsnorm"), "attention biases": "zero"},
    "gemma": {"embedding scale": dict(embed_scale=1.0)},
    "gemma2": {
        "score cap": dict(attn_softcap=None),
        "logit cap": dict(logit_softcap=None),
        "pre-scaling": dict(attn_scale=None),
        "embedding scale": dict(embed_scale=1.0),
        "window": dict(sliding_window=None, local_layers=()),
    },
    "gemma3_text": {
        "qk-norm": dict(qk_norm=False),
        "local rope base": dict(rope_theta_local=None),
        "window": dict(sliding_window=None, local_layers=()),
        "logit cap": dict(logit_softcap=None),
    },
    "gpt_neox": {
        "parallel residual": dict(parallel_residual=False),
        "partial rotary": dict(rotary_dim=None),
    },
    "phi3": {
        "partial rotary": dict(rotary_dim=None),
        "window": dict(sliding_window=None, local_layers=()),
    },
}


def scramble(model, std: float = 0.3):
    """Random weights everywhere (HF initialises biases to 0 and norm gains to 1 or 0)."""
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name.lower():
                p.copy_(0.5 + 0.3 * torch.rand(p.shape, generator=g))
            else:
                p.copy_(std * torch.randn(p.shape, generator=g))
    return model.eval()


def build(family: str, **changes):
    config_class, model_class, quirks = FAMILIES[family]
    config = getattr(transformers, config_class)(**(BASE | quirks | changes))
    config._attn_implementation = "eager"
    return scramble(getattr(transformers, model_class)(config))


@pytest.fixture(scope="module")
def models():
    """Each family's random model, built once for the module (the models are tiny)."""
    return {family: build(family) for family in FAMILIES}


def tokens(batch: int = 2, n: int = N) -> torch.Tensor:
    return torch.randint(3, VOCAB, (batch, n), generator=torch.Generator().manual_seed(2))


def run(model: Transformer, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    trace = Trace(only=("weights",))
    with torch.no_grad():
        logits = model(x, trace=trace)
    return logits, [trace[f"blocks.{l}.attn.weights"] for l in range(model.config.n_layers)]


@pytest.mark.parametrize("family", FAMILIES)
def test_logits_and_every_heads_weights_equal_transformers(models, family):
    hf = models[family]
    x = tokens()
    with torch.no_grad():
        ref = hf(x, output_attentions=True)
    ours = from_hf(hf)
    logits, weights = run(ours, x)
    torch.testing.assert_close(logits, ref.logits, **LOGITS)
    assert len(weights) == len(ref.attentions)
    for l, (mine, theirs) in enumerate(zip(weights, ref.attentions, strict=True)):
        assert mine.shape == theirs.shape == (2, 4, N, N)
        torch.testing.assert_close(mine, theirs, **WEIGHTS, msg=f"layer {l}")
    # OPT's position rows 0 and 1 are never read; OLMo's LayerNorms have no parameters in
    # transformers, and headlab holds each as a gain of 1 and a bias of 0
    d, L = hf.config.hidden_size, hf.config.num_hidden_layers
    offset = {"opt": -2 * d, "olmo": (2 * L + 1) * 2 * d}.get(family, 0)
    assert ours.num_params() == sum(p.numel() for p in hf.parameters()) + offset


def without(model: Transformer, change: dict | str) -> Transformer:
    """The converted model with one quirk switched off, the same weights otherwise."""
    if change == "zero":  # the attention's biases (Qwen2: W_Q, W_K, W_V; Qwen3: W_O too)
        other = Transformer(model.config)
        other.load_state_dict(model.state_dict())
        with torch.no_grad():
            for name, p in other.named_parameters():
                if name.endswith(("W_Q.bias", "W_K.bias", "W_V.bias", "W_O.bias")):
                    p.zero_()
        return other.eval()
    assert isinstance(change, dict)
    other = Transformer(replace(model.config, **change))
    other.load_state_dict(model.state_dict(), strict=False)  # qk-norm off: its gains unused
    return other.eval()


@pytest.mark.parametrize(
    ("family", "quirk"), [(f, q) for f, quirks in QUIRKS.items() for q in quirks]
)
def test_each_quirk_is_on_and_matters(models, family, quirk):
    ours = from_hf(models[family])
    x = tokens()
    logits, _ = run(ours, x)
    moved, _ = run(without(ours, QUIRKS[family][quirk]), x)
    assert (logits - moved).abs().max() > 1e-3, f"{family}: {quirk} changes nothing"


def test_windowed_layers_attend_to_their_last_keys_only(models):
    ours = from_hf(models["gemma3_text"])
    assert ours.config.local_layers == (0, 2) and ours.config.sliding_window == 5
    assert ours.config.n_kv_heads == 1 and ours.config.d_k == 16 != 32 // 4
    _, weights = run(ours, tokens())
    i, j = torch.arange(N)[:, None], torch.arange(N)[None, :]
    for l, w in enumerate(weights):
        assert w[..., (j > i).expand(N, N)].abs().max() == 0  # causal everywhere
        far = w[..., (j <= i - 5).expand(N, N)].abs().max()  # 5 or more keys back
        assert (far == 0) == (l in (0, 2)), f"layer {l}"  # local layers only


@pytest.mark.parametrize("family", ["gemma3_text", "mistral", "gemma2", "qwen3", "opt"])
def test_greedy_generation_with_the_kv_cache_equals_transformers(models, family):
    """Decoding past the window: each new token's query sees only its last w keys."""
    hf = models[family]
    prompt = tokens(1, 7)
    with torch.no_grad():
        expected = hf.generate(prompt, max_new_tokens=20, do_sample=False, min_new_tokens=20)
    mine = from_hf(hf).generate(prompt, 20)
    assert mine.tolist() == expected.tolist()


NAMES = {
    "bert": "BERT",
    "roberta": "RoBERTa",
    "xlm-roberta": "XLM-RoBERTa",
    "gpt2": "GPT-2",
    "opt": "OPT",
    "llama": "Llama",
    "qwen2": "Qwen2",
    "qwen3": "Qwen3",
    "mistral": "Mistral",
    "olmo": "OLMo",
    "gemma": "Gemma",
    "gemma2": "Gemma 2",
    "gemma3_text": "Gemma 3",
    "gpt_neox": "GPT-NeoX",
    "phi3": "Phi-3",
}
DOCS = Path(__file__).parents[2] / "docs"


def test_every_family_is_supported_and_listed():
    encoders = {"bert", "roberta", "xlm-roberta"}  # tests/interop/test_convert.py
    assert set(FAMILIES) | encoders | {"gpt2", "llama"} == set(SUPPORTED) == set(NAMES)
    assert zoo.SUPPORTED_FAMILIES == SUPPORTED  # the listing knows without importing torch
    for page in ("reference/models.md", "how-to/own-model.md"):  # the docs name every family
        text = " ".join((DOCS / page).read_text(encoding="utf-8").split())
        missing = [
            n
            for n in NAMES.values()
            if not re.search(rf"(?<![\w-]){re.escape(n)}(?![\w-]| \d)", text)
        ]
        assert not missing, f"docs/{page} does not name {missing}"


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (dict(word_embed_proj_dim=16), "a projection around the embedding"),
        (dict(do_layer_norm_before=False), "post-LN blocks"),
    ],
)
def test_opt_variants_headlab_does_not_compute_are_refused_with_the_reason(change, reason):
    with pytest.raises(ValueError, match=reason):
        from_hf(build("opt", **change))


def test_olmo_with_clamped_projections_is_refused_with_the_reason():
    with pytest.raises(ValueError, match=r"OLMo with clip_qkv=8\.0 \(queries, keys and values"):
        from_hf(build("olmo", clip_qkv=8.0))


def test_scaled_rope_variants_are_refused_with_the_family_named():
    linear = {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4}
    with pytest.raises(ValueError, match="Mistral rope_type 'linear': only the default RoPE"):
        from_hf(build("mistral", rope_parameters=linear))


# --- a checkpoint in a folder, loaded offline --------------------------------------------------


def saved(model, directory: Path) -> Path:
    """``save_pretrained`` into ``directory``, with the shipped tokenizer beside it."""
    model.save_pretrained(directory)
    shutil.copy(TOKENIZER, directory / "tokenizer.json")
    return directory


@pytest.mark.parametrize("family", ["gemma3_text", "qwen3"])
def test_a_folder_path_loads_offline_and_equals_transformers(models, tmp_path, monkeypatch, family):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "no-cache"))
    folder = saved(models[family], tmp_path / "my-model")
    model, tokenizer = zoo.load(str(folder))
    assert tokenizer.name == "my-model" and tokenizer.vocab_size == VOCAB
    x = tokens()
    with torch.no_grad():
        ref = models[family](x)
    torch.testing.assert_close(run(model, x)[0], ref.logits, **LOGITS)
    assert zoo.model_config(str(folder)) == model.config


def cli(*args: str, env_extra: dict | None = None) -> subprocess.CompletedProcess:
    import os

    src = str(Path(__file__).parents[2] / "src")
    env = os.environ | {"PYTHONPATH": src, "HF_HUB_OFFLINE": "1"} | (env_extra or {})
    return subprocess.run(
        [sys.executable, "-m", "headlab.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )


def test_the_cli_scores_the_heads_of_a_folder(models, tmp_path):
    folder = saved(models["qwen2"], tmp_path / "qwen")
    done = cli("heads", "--model", str(folder), "--json", "--no-content")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert len(report["heads"]) == 3 * 4 and report["n_kv_heads"] == 2


def test_an_unsupported_family_is_one_line_naming_the_supported(tmp_path):
    config = transformers.BloomConfig(vocab_size=VOCAB, hidden_size=16, n_layer=1, n_head=2)
    folder = saved(transformers.BloomForCausalLM(config), tmp_path / "bloom")  # ALiBi: no
    with pytest.raises(zoo.ModelNotAvailable, match="'bloom'.*" + ", ".join(SUPPORTED)):
        zoo.load(str(folder))
    done = cli("heads", "--model", str(folder))
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert ", ".join(SUPPORTED) in " ".join(done.stderr.split())
    assert len(done.stderr.strip().splitlines()) <= 3  # one sentence, however rich wraps it


def test_a_gemma3_folder_converts_to_a_checkpoint_accelerate_places(models, tmp_path):
    """The on-disk path for models larger than memory: converted block by block, dispatched,
    with the local layers' RoPE table beside the global one."""
    pytest.importorskip("accelerate")
    from headlab.convert import convert_checkpoint, dispatch

    folder = saved(models["gemma3_text"], tmp_path / "gemma")
    model = dispatch(convert_checkpoint(folder, tmp_path / "converted"), "sequential")
    assert model.rotary_local is not None
    x = tokens()
    with torch.no_grad():
        ref = models["gemma3_text"](x)
    torch.testing.assert_close(run(model, x)[0], ref.logits, **LOGITS)


def test_a_converted_model_saves_and_loads_with_its_variants(models, tmp_path):
    ours = from_hf(models["gemma3_text"])
    loaded = Transformer.load(ours.save(tmp_path / "saved"))
    assert loaded.config == ours.config and loaded.config.local_layers == (0, 2)
    x = tokens()
    torch.testing.assert_close(run(loaded, x)[0], run(ours, x)[0], atol=0, rtol=0)
    plain = json.loads((Path(__file__).parents[2] / "src/headlab/weights/config.json").read_text())
    assert ModelConfig.from_dict(plain).to_dict() == plain  # no variant keys when none is used


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        (dict(local_layers=(0,)), "local_layers need a sliding_window"),
        (dict(sliding_window=4, local_layers=(3,)), "local_layers must be in 0..1"),
        (dict(rotary_dim=10), "rotary_dim must be in 1..d_k=8"),
        (dict(rotary_dim=3), "even rotated width"),
        (dict(head_dim=0), "d_k must be a positive integer"),
        (dict(attn_softcap=-1.0), "attn_softcap must be positive"),
        (dict(parallel_residual=True, attn_only=True), "parallel_residual needs"),
    ],
)
def test_a_variant_that_cannot_work_is_refused_naming_what_would(change, needle):
    base = dict(vocab_size=10, d_model=32, n_layers=2, n_heads=4, positional="rotary")
    with pytest.raises(ValueError, match=needle):
        ModelConfig(**(base | change))
