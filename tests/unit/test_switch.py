"""Switching a set of heads off together (headlab.heads.switch): one head against
headlab.heads.effects.ablate_heads, a set against a hand-written ablation (hooks on W_O's input,
no head mask), and the default model's induction circuit broken by its previous-token head."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from headlab import Trace
from headlab.heads import analyse, induction_score
from headlab.heads.effects import ablate_heads
from headlab.heads.switch import switch_off
from headlab.measure import build_probe

SET = [(0, 0), (0, 3), (1, 3), (1, 5)]  # heads of both layers, a later one fed by an earlier one


@pytest.fixture(scope="module")
def single(default, repeat):
    return {mode: ablate_heads(default[0], repeat, mode=mode) for mode in ("mean", "zero")}


def hand_ablated(model, tokens, heads, mode):
    """Logits (B, n, V) and attention weights L × (B, h, n, n) of one forward with ``heads``
    replaced in W_O's input by zeros or by their mean over every position of the intact run."""
    L, dk = model.config.n_layers, model.config.d_k
    clean = Trace(only=("head_out",))
    with torch.no_grad():
        model(tokens, trace=clean)
    handles = []
    for layer in range(L):
        mine = [i for l, i in heads if l == layer]
        if not mine:
            continue
        mean = clean[f"blocks.{layer}.attn.head_out"].mean(dim=(0, 2))  # (h, d_k)

        def fill(module, args, mine=mine, mean=mean):
            merged = args[0].clone()  # (B, n, h · d_k)
            for i in mine:
                merged[..., i * dk : (i + 1) * dk] = 0.0 if mode == "zero" else mean[i]
            return (merged,)

        handles.append(model.blocks[layer].attn.W_O.register_forward_pre_hook(fill))
    trace = Trace(only=("weights",))
    try:
        with torch.no_grad():
            logits = model(tokens, trace=trace)
    finally:
        for handle in handles:
            handle.remove()
    return logits, [trace[f"blocks.{l}.attn.weights"] for l in range(L)]


@pytest.mark.parametrize("mode", ["mean", "zero"])
def test_one_head_switched_off_is_ablate_heads_for_that_head(default, repeat, single, mode):
    """For each of the 16 heads alone, the switched-off run's losses and induction scores are
    the rows ablate_heads measured for it, and the intact run is its clean run."""
    a = single[mode]
    for layer, head in a.heads:
        s = switch_off(default[0], repeat, [(layer, head)], mode)
        row = a.index(layer, head)
        assert torch.allclose(s.off.losses, a.losses[row], atol=1e-5), (layer, head)
        assert torch.allclose(s.off.induction, a.induction[row], atol=1e-5), (layer, head)
        assert torch.allclose(s.intact.losses, a.clean_losses, atol=1e-5)
        assert torch.allclose(s.intact.induction, a.clean_induction, atol=1e-5)


@pytest.mark.parametrize("mode", ["mean", "zero"])
def test_a_set_switched_off_equals_a_hand_written_ablation(default, repeat, mode):
    """Four heads of both layers at once: predictions, losses, patterns and induction scores
    equal one forward with hooks overwriting those heads' slices of W_O's input."""
    model, tokens = default[0], repeat.tokens
    s = switch_off(model, repeat, SET, mode, k=7)
    logits, weights = hand_ablated(model, tokens, SET, mode)
    probs = logits.softmax(dim=-1)
    top = probs.topk(7, dim=-1)
    assert torch.equal(s.off.top_ids, top.indices)
    assert torch.allclose(s.off.top_probs, top.values, atol=1e-5)
    losses = F.cross_entropy(
        logits[:, :-1].flatten(0, 1), tokens[:, 1:].flatten(), reduction="none"
    ).view(tokens.shape[0], -1)
    assert torch.allclose(s.off.losses, losses, atol=1e-5)
    assert torch.allclose(s.off.weights, torch.stack(weights), atol=1e-5)
    want = torch.stack([induction_score(w, tokens) for w in weights])
    assert torch.allclose(s.off.induction, want, atol=1e-5)
    # the intact run is the plain forward
    intact_logits, intact_weights = hand_ablated(model, tokens, [], mode)
    assert torch.equal(s.intact.top_ids, intact_logits.softmax(-1).topk(7, dim=-1).indices)
    assert torch.allclose(s.intact.weights, torch.stack(intact_weights), atol=1e-6)
    # the loss on the repeat is the mean over the rows of a query seen before
    repeat_rows = s.repeat_rows
    assert 0 < int(repeat_rows.sum()) < repeat_rows.numel()
    assert s.losses()["repeat"]["off"] == pytest.approx(float(losses[repeat_rows].mean()), abs=1e-5)
    assert s.losses()["all"]["off"] == pytest.approx(float(losses.mean()), abs=1e-5)


def test_the_previous_token_head_off_breaks_induction(default, repeat):
    """The default model's previous-token heads switched off (as analyse labels them on the
    repeat): the loss on the repeat rises by nats, every induction head's score falls below
    half, and its pattern changes; switching off a current-token head instead leaves the repeat's
    loss within 0.5."""
    model = default[0]
    labels = {(s.layer, s.head): s.label for s in analyse(model, repeat).heads}
    previous = [lh for lh, label in labels.items() if label == "previous-token"]
    induction = [lh for lh, label in labels.items() if label == "induction"]
    assert previous and induction, "the default model has no induction circuit to break"
    s = switch_off(model, repeat, previous)
    assert s.losses()["repeat"]["rise"] > 2.0
    for l, i in induction:
        assert s.off.induction[l, i] < 0.5 * s.intact.induction[l, i]
        assert (s.off.weights[l, :, i] - s.intact.weights[l, :, i]).abs().max() > 0.3
    # a head's pattern is made before its output is switched off: its own layer's are unchanged
    first = min(l for l, _ in previous)
    assert torch.equal(s.off.weights[first], s.intact.weights[first])
    current = next(lh for lh, label in labels.items() if label == "current-token")
    other = switch_off(model, repeat, [current]).losses()["repeat"]
    assert abs(other["rise"]) < 0.5


def test_the_answer_as_json(default, repeat):
    """to_dict: both runs' predictions as token strings, the losses, the switched-off heads."""
    model, tokenizer = default
    s = switch_off(model, repeat, [(1, 3), (0, 0), (0, 0)], "zero", k=3)
    d = s.to_dict(tokenizer.token_strings)
    assert d["off"] == [[0, 0], [1, 3]] and d["mode"] == "zero"
    assert len(d["intact"]["predictions"]) == repeat.n
    first = d["switched_off"]["predictions"][5]
    assert [p["id"] for p in first] == s.off.top_ids[0, 5].tolist()
    assert [p["token"] for p in first] == tokenizer.token_strings(s.off.top_ids[0, 5].tolist())
    assert d["loss"]["repeat"]["off"] == round(s.losses()["repeat"]["off"], 4)
    assert len(d["intact"]["weights"]) == model.config.n_layers


def test_a_text_that_repeats_nothing_has_no_repeat_loss(default):
    model, tokenizer = default
    c = model.config
    probe = build_probe("text", tokenizer, c.max_len, c.vocab_size, "Birds fly south in winter.")
    s = switch_off(model, probe, [(0, 0)])
    assert s.losses()["repeat"] is None
    assert s.losses()["all"]["off"] == pytest.approx(float(s.off.losses.mean()))


@pytest.mark.parametrize(
    ("heads", "mode", "k", "said"),
    [
        ([(2, 0)], "mean", 5, "head 2.0 does not exist; layers 0..1, heads 0..7"),
        ([(0, 8)], "mean", 5, "head 0.8 does not exist"),
        ([(-1, 0)], "mean", 5, "head -1.0 does not exist"),
        ([(0, 0)], "half", 5, "valid modes are mean, zero"),
        ([(0, 0)], "mean", 0, "keep 1 to 1024 predictions"),
    ],
)
def test_bad_requests_say_what_is_valid(default, repeat, heads, mode, k, said):
    with pytest.raises(ValueError, match=said):
        switch_off(default[0], repeat, heads, mode, k)


def test_a_model_that_predicts_no_next_token_is_refused(repeat):
    from headlab.model import ModelConfig, Transformer

    config = ModelConfig(
        vocab_size=1024, d_model=16, n_layers=1, n_heads=2, max_len=64, causal=False
    )
    model = Transformer(config)
    with pytest.raises(ValueError, match="needs a causal model"):
        switch_off(model, repeat, [(0, 0)])


def test_the_losses_count_every_sequence_of_the_probe(default):
    """Random tokens repeated (several sequences): the loss on the repeat is the mean over the
    repeated rows of every sequence, and says how many rows that is; the JSON says how many
    sequences the losses are over."""
    from headlab.heads.evidence import loss_rows

    model, tokenizer = default
    c = model.config
    probe = build_probe("random-repeat", tokenizer, c.max_len, c.vocab_size, seed=3)
    assert probe.tokens.shape[0] > 1
    s = switch_off(model, probe, [(0, 0)], "zero")
    rows = loss_rows(probe, causal=True)["induction"]
    loss = s.losses()
    assert loss["repeat"]["rows"] == int(rows.sum()) > int(rows[0].sum())
    assert loss["repeat"]["off"] == pytest.approx(float(s.off.losses[rows].mean()), abs=1e-6)
    assert loss["all"]["rows"] == s.off.losses.numel()
    d = s.to_dict(tokenizer.token_strings)
    assert d["sequences"] == probe.tokens.shape[0]
    assert d["loss"]["repeat"]["rows"] == int(rows.sum())
    assert len(d["repeat_rows"]) == probe.n - 1
