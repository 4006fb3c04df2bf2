"""Streaming head analysis: layer-by-layer scores equal scoring every layer's kept weights at once,
and no layer's weights outlive the layer."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch

from headlab import Trace
from headlab.heads import (
    analyse,
    averaged_pattern,
    pattern_scores,
    targets_of,
)
from headlab.measure import make_probe, reduce_patterns, run_patterns
from headlab.model import ModelConfig, Transformer


def random_model(causal: bool) -> Transformer:
    """3 layers of 4 query heads sharing 2 key/value heads, rotary, with large random weights."""
    cfg = ModelConfig(
        vocab_size=50,
        d_model=32,
        n_layers=3,
        n_heads=4,
        n_kv_heads=2,
        positional="rotary",
        causal=causal,
        max_len=64,
    )
    model = Transformer(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.4)
    return model


def probe_of(tokens: torch.Tensor):
    return make_probe("text", tokens, None)


def keep_everything_oracle(model, probe):
    """The analysis as it was before streaming: every layer's weights kept, then all L·h heads
    and L averaged heads scored in one call."""
    tokens = probe.tokens
    B, n = tokens.shape
    w = run_patterns(model, tokens).transpose(0, 1)  # (B, L, h, n, n)
    L, h = w.shape[1], w.shape[2]
    avg = averaged_pattern(w.flatten(0, 1)).view(B, L, n, n)
    flat = torch.cat([w.reshape(-1, L * h, n, n), avg], dim=1)  # (B, L·h + L, n, n)
    targets = targets_of(tokens, model.config.causal, probe.delimiters, ~probe.movable)
    scores, offsets, _ = pattern_scores(flat, targets)
    return scores, offsets, w[0], avg[0]


@pytest.mark.parametrize("causal", [True, False])
def test_streaming_scores_equal_the_keep_everything_path(causal):
    model = random_model(causal)
    tokens = torch.randint(0, 50, (2, 24), generator=torch.Generator().manual_seed(3))
    tokens[:, 10] = 7  # a repeated token gives the duplicate/induction scores something to see
    probe = probe_of(tokens)
    scores, offsets, patterns, avg = keep_everything_oracle(model, probe)
    report = analyse(model, probe)
    L, h = 3, 4
    for s in report.heads:
        i = s.layer * h + s.head
        assert s.offset == int(offsets[i])
        for kind, value in s.scores.items():
            assert value == pytest.approx(float(scores[kind][i]), abs=1e-6), (kind, s)
    for s in report.averaged:
        assert s.scores["previous"] == pytest.approx(float(scores["previous"][L * h + s.layer]))
    assert report.patterns is not None and report.averaged_patterns is not None
    assert torch.equal(report.patterns, patterns) and torch.equal(report.averaged_patterns, avg)


def test_keep_holds_only_the_heads_asked_for():
    model = random_model(causal=True)
    probe = probe_of(torch.randint(0, 50, (1, 20)))
    full = analyse(model, probe)
    some = analyse(model, probe, keep={(1, 2), (0, -1)})
    assert some.patterns is None and set(some.selected) == {(1, 2), (0, -1)}
    assert torch.equal(some.pattern(1, 2), full.pattern(1, 2))
    assert torch.equal(some.pattern(0, -1), full.pattern(0, -1))
    with pytest.raises(KeyError, match="was not kept"):
        some.pattern(2, 0)
    assert [s.scores for s in some.heads] == [s.scores for s in full.heads]
    assert analyse(model, probe, keep=()).selected == {}


def test_no_layers_weights_outlive_the_layer():
    """While layer l is reduced, the weights of layers 0..l−1 are already freed: the trace keeps
    nothing, so at most one layer's (B, h, n, n) is alive at a time."""
    model = random_model(causal=True)
    tokens = torch.randint(0, 50, (2, 16))
    refs: list[weakref.ref] = []
    alive_before: list[int] = []

    def reduce(layer: int, w: torch.Tensor) -> float:
        gc.collect()
        alive_before.append(sum(r() is not None for r in refs))
        refs.append(weakref.ref(w))
        return float(w.sum())

    done: list[tuple[int, int]] = []
    sums = reduce_patterns(model, tokens, reduce, progress=lambda d, L: done.append((d, L)))
    assert alive_before == [0, 0, 0]
    assert done == [(1, 3), (2, 3), (3, 3)]
    trace = Trace(only=("weights",))
    model(tokens, trace=trace)
    expected = [float(trace[f"blocks.{l}.attn.weights"].sum()) for l in range(3)]
    assert sums == pytest.approx(expected)


@pytest.mark.parametrize("dispatched", [False, True])
def test_the_forward_stops_after_the_last_layers_weights(dispatched):
    """Nothing after the last layer's weights runs (that layer's MLP, the final norm), and each
    layer's weights are those of the whole forward; a model dispatched by accelerate (an
    ``hf_device_map``) runs to the end, its hooks seeing each block whole. The model is
    untouched: a whole forward afterwards gives the same logits as before."""
    model = random_model(causal=True)
    if dispatched:
        model.hf_device_map = {"": "cpu"}
    tokens = torch.randint(0, 50, (2, 16), generator=torch.Generator().manual_seed(5))
    trace = Trace(only=("weights",))
    with torch.no_grad():
        model(tokens, trace=trace)
        before = model(tokens)
    ran: list[str] = []
    hooks = [
        model.blocks[-1].mlp.register_forward_hook(lambda *_: ran.append("mlp")),
        model.final_norm.register_forward_hook(lambda *_: ran.append("final norm")),
    ]
    weights = run_patterns(model, tokens)  # (L, B, h, n, n)
    for hook in hooks:
        hook.remove()
    assert ran == (["mlp", "final norm"] if dispatched else [])
    for l in range(3):
        assert torch.equal(weights[l], trace[f"blocks.{l}.attn.weights"])
    with torch.no_grad():
        assert torch.equal(model(tokens), before)


def test_a_reducing_trace_stores_what_the_reducer_returns():
    seen: list[str] = []

    def reduce(name: str, t: torch.Tensor):
        seen.append(name)
        return None if name.endswith("x") else t.sum(-1)

    trace = Trace(reduce=reduce).scope("blocks.0")
    trace.record("x", torch.ones(2, 3)).record("y", torch.ones(2, 3))
    assert seen == ["blocks.0.x", "blocks.0.y"]
    assert list(trace) == ["blocks.0.y"] and torch.equal(trace["blocks.0.y"], torch.full((2,), 3.0))
