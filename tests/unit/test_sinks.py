"""Streaming with attention sinks (Xiao et al. 2023): the sink cache against a direct loop that
recomputes every query's attention from scratch over its kept keys, at cache-slot positions."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import Tensor

from headlab.attention import merge_heads, repeat_kv, split_heads
from headlab.model import ModelConfig, Transformer

ROOT = Path(__file__).resolve().parents[2]


def tiny(**overrides: object) -> Transformer:
    """A random rotary GQA model with MLPs, in float64 so that comparisons are tight."""
    torch.manual_seed(0)
    fields: dict = dict(
        vocab_size=40,
        d_model=32,
        n_layers=2,
        n_heads=4,
        n_kv_heads=2,
        max_len=16,
        positional="rotary",
        init_std=0.3,
    )
    fields.update(overrides)
    return Transformer(ModelConfig(**fields)).double().eval()


def kept_keys(i: int, sinks: int, window: int) -> list[int]:
    """Text positions query i sees: the first ``sinks`` and the last ``window`` up to i."""
    return sorted(set(range(min(sinks, i + 1))) | set(range(max(0, i - window + 1), i + 1)))


def reference_logits(
    model: Transformer, tokens: Tensor, sinks: int, window: int, slots: bool = True
) -> Tensor:
    """(1, N) → (1, N, V) by a direct loop: each query of each layer attends to its kept keys,
    rotated at cache slots (``slots``) or at their places in the text."""
    x = model.embed(tokens)  # (1, N, d_model)
    N = tokens.shape[1]
    rope = model.rotary
    assert rope is not None
    for block in model.blocks:
        attn = block.attn
        a_in = block.norm_attn(x)
        q = split_heads(attn.W_Q(a_in), attn.n_heads)  # (1, h, N, d_k)
        k = split_heads(attn.W_K(a_in), attn.n_kv_heads)  # (1, h_kv, N, d_k)
        v = split_heads(attn.W_V(a_in), attn.n_kv_heads)
        g = attn.n_heads // attn.n_kv_heads
        rows = []
        for i in range(N):
            kept = kept_keys(i, sinks, window)
            places = list(range(len(kept))) if slots else kept
            qi = rope(q[:, :, i : i + 1], places[-1])  # (1, h, 1, d_k)
            ki = torch.cat(
                [rope(k[:, :, j : j + 1], p) for j, p in zip(kept, places, strict=True)], dim=2
            )
            scores = qi @ repeat_kv(ki, g).transpose(-2, -1) / math.sqrt(attn.d_k)
            rows.append(torch.softmax(scores, dim=-1) @ repeat_kv(v[:, :, kept], g))
        x = x + attn.W_O(merge_heads(torch.cat(rows, dim=2)))
        if block.mlp is not None:
            x = x + block.mlp(block.norm_mlp(x))
    return model.unembed(model.final_norm(x))


def stream_logits(model: Transformer, tokens: Tensor, sinks: int, window: int) -> Tensor:
    return model(tokens, cache=model.new_sink_cache(tokens.shape[0], sinks, window))


@pytest.mark.parametrize(("sinks", "window"), [(2, 6), (1, 5), (4, 3), (0, 7)])
def test_sink_cache_equals_direct_reference_past_the_context(sinks: int, window: int) -> None:
    model = tiny()
    tokens = torch.randint(0, 40, (1, 40), generator=torch.Generator().manual_seed(1))
    got = stream_logits(model, tokens, sinks, window)
    want = reference_logits(model, tokens, sinks, window)
    torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9)


def test_no_sinks_is_a_plain_sliding_window_at_text_positions() -> None:
    model = tiny()
    tokens = torch.randint(0, 40, (1, 36), generator=torch.Generator().manual_seed(2))
    got = stream_logits(model, tokens, 0, 6)
    want = reference_logits(model, tokens, 0, 6, slots=False)
    torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9)


def test_sinks_are_not_a_sliding_window() -> None:
    """Until the window fills the two agree; past it, keeping 2 sinks changes the logits."""
    model = tiny()
    tokens = torch.randint(0, 40, (1, 30), generator=torch.Generator().manual_seed(3))
    sinks = stream_logits(model, tokens, 2, 6)
    plain = stream_logits(model, tokens, 0, 6)
    torch.testing.assert_close(sinks[:, :6], plain[:, :6], rtol=1e-9, atol=1e-9)
    assert (sinks[:, 10:] - plain[:, 10:]).abs().max() > 1e-3


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_a_window_as_long_as_the_text_is_the_full_cache_bit_for_bit(dtype: torch.dtype) -> None:
    model = tiny().to(dtype)
    tokens = torch.randint(0, 40, (2, 16), generator=torch.Generator().manual_seed(4))
    assert torch.equal(stream_logits(model, tokens, 2, 16), model(tokens))
    full, sink = model.new_cache(2, 16), model.new_sink_cache(2, 3, 20)
    for t in range(16):  # token by token, as decoding runs
        a = model(tokens[:, t : t + 1], cache=full)
        b = model(tokens[:, t : t + 1], cache=sink)
        assert torch.equal(a, b), t
    prompt = tokens[:, :5]
    assert torch.equal(model.generate(prompt, 11, window=16), model.generate(prompt, 11))
    assert torch.equal(model.generate(prompt, 11, window=12, sinks=4), model.generate(prompt, 11))


def test_generation_with_sinks_equals_recomputing_from_scratch() -> None:
    model = tiny()
    prompt = torch.randint(0, 40, (1, 9), generator=torch.Generator().manual_seed(5))
    out = model.generate(prompt, 30, window=6, sinks=2)  # 39 tokens, context 16
    seq = prompt
    for _ in range(30):
        nxt = reference_logits(model, seq, 2, 6)[:, -1].argmax(-1, keepdim=True)
        seq = torch.cat([seq, nxt], dim=1)
    assert torch.equal(out, seq)


def test_memory_stays_flat_over_four_windows() -> None:
    model = tiny()
    sinks, window = 2, 6
    cache = model.new_sink_cache(1, sinks, window)
    tokens = torch.randint(
        0, 40, (1, 4 * window + sinks), generator=torch.Generator().manual_seed(6)
    )
    sizes = []
    for t in range(tokens.shape[1]):
        model(tokens[:, t : t + 1], cache=cache)
        sizes.append([(tuple(c.k.shape), tuple(c.v.shape), c.nbytes) for c in cache])
        assert cache[0].length == min(t + 1, sinks + window)
    assert all(s == sizes[0] for s in sizes)
    assert cache[0].k.shape[2] == sinks + window
    assert cache[0].dropped == tokens.shape[1] - sinks - window


def test_sink_cache_refuses_what_it_cannot_do() -> None:
    with pytest.raises(ValueError, match="learned position"):
        tiny(positional="learned").new_sink_cache(1, 2, 4)
    with pytest.raises(ValueError, match="sinks >= 0"):
        tiny().new_sink_cache(1, -1, 4)
    with pytest.raises(ValueError, match="window >= 1"):
        tiny().new_sink_cache(1, 2, 0)


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    return subprocess.run(
        [sys.executable, "-m", "headlab.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )


def test_generate_cli_streams_past_the_default_models_context() -> None:
    """The default model's context is 64 tokens; with --window it writes 100 past a long prompt."""
    done = _cli(
        "generate",
        "--prompt",
        "To be, or not to be: " * 8,
        "--max-new-tokens",
        "100",
        "--window",
        "32",
        "--sinks",
        "4",
        "--json",
    )
    assert done.returncode == 0, done.stderr
    import json

    result = json.loads(done.stdout)
    assert len(result["prompt_ids"]) + len(result["new_ids"]) > 64
    assert result["window"] == 32 and result["sinks"] == 4


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--sinks", "4"), "--sinks needs --window"),
        (("--window", "0"), "--window"),
        (("--window", "1000000"), "sinks + window must be 1..64"),
    ],
)
def test_generate_cli_rejects_bad_streaming_options(args: tuple[str, ...], message: str) -> None:
    done = _cli("generate", "--prompt", "hello", *args)
    assert done.returncode == 2
    assert message in done.stderr and "Traceback" not in done.stderr


def test_experiment_sinks_quick_json(tmp_path: Path) -> None:
    """`headlab experiment sinks --quick --json`: its full-cache perplexity is the plain forward
    pass's (the stretch fits the default model's context), the figure is written."""
    import json

    import torch.nn.functional as F

    from headlab import zoo
    from headlab.experiments import sinks

    done = _cli("experiment", "sinks", "--quick", "--json", "--out", str(tmp_path / "run"))
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    (m,) = result["models"]
    model, tokenizer = zoo.load("default")
    ids = sinks.stretch(tokenizer, sinks.QUICK.plans[0])
    with torch.no_grad():
        nll = F.cross_entropy(model(ids)[0, :-1], ids[0, 1:])
    assert m["full_cache"]["ppl"] == pytest.approx(math.exp(float(nll)), rel=1e-5)
    assert {(r["sinks"], r["window"]) for r in m["runs"]} == {(0, 16), (4, 16)}
    assert [r["layer"] for r in m["sink_share"]] == [0, 1]
    assert (tmp_path / "run" / "sinks.png").is_file()
    assert json.loads((tmp_path / "run" / "results.json").read_text())["models"] == [m]
