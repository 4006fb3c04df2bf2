"""Composition scores (Elhage et al. 2021) against TransformerLens's published formula, computed
here on explicit d × d matrices built from the raw state dict; the random-matrix baseline against
explicit draws; the default model's induction circuit in its top K-composition pairs."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from headlab.heads import analyse
from headlab.heads.composition import composition_scores, random_baseline
from headlab.measure import build_probe
from headlab.model import ModelConfig, Transformer


def explicit_matrices(model: Transformer) -> tuple[list[list[torch.Tensor]], ...]:
    """Per layer and head, TransformerLens's W_OV = W_V W_O and W_QK = W_Q W_Kᵀ (d × d, float64)
    from the state dict, folded as its from_pretrained folds them: fold_ln scales the reading
    weights by the pre-norm's gain; for LayerNorm, center_weights centres them over d_model and
    center_writing_weights centres W_O's output."""
    c = model.config
    sd = {k: v.double() for k, v in model.state_dict().items()}
    dk, h, h_kv = c.d_k, c.n_heads, c.n_kv_heads or c.n_heads
    OV, QK = [], []
    for l in range(c.n_layers):
        p = f"blocks.{l}."
        gain = sd[p + "norm_attn.weight"] if c.norm == "pre" else torch.ones(c.d_model)
        centre = c.norm == "pre" and c.norm_kind == "layernorm"

        def reading(
            name: str, i: int, p: str = p, gain: torch.Tensor = gain, centre: bool = centre
        ) -> torch.Tensor:
            w = sd[p + f"attn.{name}.weight"][i * dk : (i + 1) * dk].T * gain[:, None]
            return w - w.mean(0, keepdim=True) if centre else w  # (d, d_k)

        ov, qk = [], []
        for i in range(h):
            g = i // (h // h_kv)
            wo = sd[p + "attn.W_O.weight"][:, i * dk : (i + 1) * dk].T  # (d_k, d)
            wo = wo - wo.mean(1, keepdim=True) if centre else wo
            ov.append(reading("W_V", g) @ wo)
            qk.append(reading("W_Q", i) @ reading("W_K", g).T)
        OV.append(ov)
        QK.append(qk)
    return OV, QK


def tl_score(a: torch.Tensor, b: torch.Tensor) -> float:
    """TransformerLens's composition_scores: ‖A B‖_F / (‖A‖_F ‖B‖_F)."""
    return float(torch.linalg.norm(a @ b) / (torch.linalg.norm(a) * torch.linalg.norm(b)))


def check_against_formula(model: Transformer) -> None:
    c = model.config
    OV, QK = explicit_matrices(model)
    got = composition_scores(model).scores
    L, h = c.n_layers, c.n_heads
    for a in range(L):
        for i in range(h):
            for b in range(L):
                for j in range(h):
                    if a >= b:
                        assert got["k"][a, i, b, j] == 0.0
                        continue
                    want = {
                        "q": tl_score(OV[a][i], QK[b][j]),
                        "k": tl_score(OV[a][i], QK[b][j].T),
                        "v": tl_score(OV[a][i], OV[b][j]),
                    }
                    for mode, value in want.items():
                        assert float(got[mode][a, i, b, j]) == pytest.approx(value, abs=1e-5)


CONFIGS = {
    "layernorm, MHA": dict(d_model=32, n_heads=4, positional="learned"),
    "rmsnorm, GQA": dict(
        d_model=32, n_heads=4, n_kv_heads=2, norm_kind="rmsnorm", positional="rotary"
    ),
    "post-norm": dict(d_model=24, n_heads=3, norm="post"),
    "one head, centred to rank d − 1": dict(d_model=8, n_heads=1),
}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_composition_scores_equal_the_formula_on_random_models(name):
    torch.manual_seed(3)
    model = Transformer(ModelConfig(vocab_size=20, n_layers=3, max_len=16, **CONFIGS[name]))
    with torch.no_grad():  # gains away from 1, so that the fold matters
        for block in model.blocks:
            norm = block.norm_attn
            if hasattr(norm, "weight"):
                norm.weight.uniform_(0.5, 1.5)
    check_against_formula(model)


def test_group_scores_equal_the_formula():
    """K- and V-group scores of a GQA model: ‖W_OV^a W_K^g‖ / (‖W_OV^a‖ ‖W_K^g‖)."""
    torch.manual_seed(4)
    model = Transformer(
        ModelConfig(
            vocab_size=20,
            n_layers=2,
            max_len=16,
            d_model=32,
            n_heads=4,
            n_kv_heads=2,
            norm_kind="rmsnorm",
        )
    )
    OV, _ = explicit_matrices(model)
    got = composition_scores(model).scores
    sd = {k: v.double() for k, v in model.state_dict().items()}
    gain = sd["blocks.1.norm_attn.weight"][:, None]
    for g in range(2):
        wk = sd["blocks.1.attn.W_K.weight"][g * 8 : (g + 1) * 8].T * gain
        wv = sd["blocks.1.attn.W_V.weight"][g * 8 : (g + 1) * 8].T * gain
        for i in range(4):
            assert float(got["k_group"][0, i, 1, g]) == pytest.approx(
                tl_score(OV[0][i], wk), abs=1e-5
            )
            assert float(got["v_group"][0, i, 1, g]) == pytest.approx(
                tl_score(OV[0][i], wv), abs=1e-5
            )


def test_random_baseline_matches_explicit_random_matrices():
    """Means of independent explicit draws (d × d products of Gaussian factors) agree with the
    baseline's within the sampling error of both."""
    d, dk, draws = 32, 8, 200
    base = random_baseline(d, dk, draws)
    g = torch.Generator().manual_seed(123)
    scores = {"k": [], "v": [], "k_group": []}
    for _ in range(draws):
        V, Q, K, V2 = (torch.randn(d, dk, generator=g, dtype=torch.float64) for _ in range(4))
        O, O2 = (torch.randn(dk, d, generator=g, dtype=torch.float64) for _ in range(2))
        scores["k"].append(tl_score(V @ O, (Q @ K.T).T))
        scores["v"].append(tl_score(V @ O, V2 @ O2))
        scores["k_group"].append(tl_score(V @ O, K))
    for mode, values in scores.items():
        mean, sd = base[mode]
        assert sd == pytest.approx(np.std(values, ddof=1), rel=0.3)
        assert abs(mean - np.mean(values)) < 4 * sd * np.sqrt(2 / draws), mode


def test_default_model_scores_equal_the_formula(default):
    check_against_formula(default[0])


def test_top_k_composition_pairs_are_previous_token_to_induction(default):
    """Olsson et al. 2022's circuit: the default model's three strongest K-composition pairs run
    from its previous-token head to its induction heads, each far above random matrices."""
    model, tokenizer = default
    c = model.config
    report = analyse(model, build_probe("random-repeat", tokenizer, c.max_len, c.vocab_size))
    labels = {(s.layer, s.head): s.label for s in report.heads}
    comp = composition_scores(model)
    top = comp.top("k", 3)
    for pair in top:
        assert labels[tuple(pair["from"])] == "previous-token", pair
        assert labels[tuple(pair["to"])] == "induction", pair
        assert pair["above_baseline"] and pair["score"] > 2 * comp.baseline["k"][0]


@pytest.mark.parametrize("change", ["W_K", "norm gain", "in place, same storage"])
def test_scores_are_kept_for_the_same_weights_and_recomputed_when_they_change(change, monkeypatch):
    """Asking again about the same weights (this model or a copy) reads them, not the products:
    no recomputation, equal scores, tensors of its own; a change to anything the scores read
    (a key projection, a norm's gain, an in-place edit) computes them again, equal to the
    formula; a change they do not read (an MLP weight) does not."""
    import copy

    from headlab.heads import composition

    torch.manual_seed(5)
    config = ModelConfig(vocab_size=20, n_layers=3, max_len=16, **CONFIGS["rmsnorm, GQA"])
    model = Transformer(config)
    monkeypatch.setattr(composition, "_KEPT", type(composition._KEPT)())  # none kept yet
    computed = []
    real = composition._composition_scores
    monkeypatch.setattr(composition, "_composition_scores", lambda m: computed.append(1) or real(m))
    first = composition_scores(model)
    again, twin = composition_scores(model), composition_scores(copy.deepcopy(model))
    assert len(computed) == 1
    for mode, scores in first.scores.items():
        assert torch.equal(again.scores[mode], scores) and torch.equal(twin.scores[mode], scores)
    k = first.scores["k"].clone()
    again.scores["k"].zero_()  # a caller's edit stays its own
    assert torch.equal(composition_scores(model).scores["k"], k) and bool(k.any())
    with torch.no_grad():
        model.blocks[2].mlp.W_out.weight.mul_(3.0)
    composition_scores(model)
    assert len(computed) == 1
    with torch.no_grad():
        if change == "W_K":
            model.blocks[1].attn.W_K.weight.copy_(torch.randn_like(model.blocks[1].attn.W_K.weight))
        elif change == "norm gain":
            model.blocks[2].norm_attn.weight.uniform_(0.5, 1.5)
        else:
            model.blocks[0].attn.W_O.weight[0, 0] += 1.0
    changed = composition_scores(model)
    assert len(computed) == 2
    assert any(not torch.equal(changed.scores[m], first.scores[m]) for m in first.scores)
    check_against_formula(model)


def test_scores_too_large_to_keep_are_computed_each_time(monkeypatch):
    """Past the size limit (80 layers × 64 heads would keep 0.5 GB) nothing is kept: each
    call computes, and the scores still equal the formula."""
    from headlab.heads import composition

    monkeypatch.setattr(composition, "_KEPT", type(composition._KEPT)())
    monkeypatch.setattr(composition, "_KEPT_BYTES", 100)
    torch.manual_seed(6)
    model = Transformer(ModelConfig(vocab_size=20, n_layers=3, max_len=16, **CONFIGS["post-norm"]))
    computed = []
    real = composition._composition_scores
    monkeypatch.setattr(composition, "_composition_scores", lambda m: computed.append(1) or real(m))
    composition_scores(model)
    check_against_formula(model)
    assert len(computed) == 2 and len(composition._KEPT) == 0
