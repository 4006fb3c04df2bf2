"""Each head's card: scores beside their baselines, ablation effects, compositions and one
sentence with the measured numbers; the induction circuit drawn from them (default model)."""

from __future__ import annotations

import re

import pytest

from headlab.heads.circuit import CONFIRMED, induction_circuit
from headlab.heads.evidence import evidence
from headlab.measure import build_probe


@pytest.fixture(scope="module")
def cards(default):
    model, tokenizer = default
    c = model.config
    return evidence(model, build_probe("repeat", tokenizer, c.max_len, c.vocab_size))


def numbers(text: str) -> list[float]:
    return [float(x) for x in re.findall(r"[-+]?\d+\.\d+", text)]


def test_the_previous_token_card_says_what_backs_it(cards):
    """ "0.99 of its attention on the previous token, 0.06 with random weights; ablating it drops
    head 1.x's induction score from Y to Z": every number is the card's own measurement."""
    card = cards.card(0, 0)
    d = card.to_dict()
    assert d["label"] == "previous-token"
    text = d["evidence"]
    assert text.startswith(f"{d['scores']['previous']:.2f} of its attention on the previous token")
    assert f"{d['baselines']['previous']['random']['mean']:.2f} with random weights" in text
    drop = d["ablation"]["induction_scores"][0]
    assert f"head {drop['head'][0]}.{drop['head'][1]}'s induction score" in text
    assert numbers(text)[-2:] == [round(drop["from"], 2), round(drop["to"], 2)]
    assert drop["to"] < drop["from"] / 10


def test_induction_cards_quote_the_later_copy_loss(cards):
    """Each induction card leads with the score its label rests on, the share of the attention
    the head does not rest on the first token that goes to the token after an earlier copy,
    and all its attention there beside it; then what ablating it costs a later copy's tokens.
    Six heads share the copying, so not each one matters alone (1.2 and 1.7, labelled by the
    same rule as on repeated random tokens, raise the loss about as much as the layer's median
    head): at least three raise it by more than three times that."""
    strong = 0
    for card in cards.cards:
        if card.score.label != "induction":
            continue
        d = card.to_dict()
        active, plain = d["scores"]["induction_active"], d["scores"]["induction"]
        assert d["evidence"].startswith(f"{active:.2f} of the attention it does not rest on the")
        assert f"({plain:.2f} of all its attention)" in d["evidence"]
        rise = d["ablation"]["later_copy"]
        assert "a later copy's tokens" in d["evidence"]
        assert numbers(d["evidence"])[-2:] == [
            round(rise["loss_rise"], 2),
            round(rise["layer_median"], 2),
        ]
        strong += rise["loss_rise"] > 3 * rise["layer_median"] > 0
    assert strong >= 3


def test_cards_carry_baselines_compositions_and_costs(cards, default):
    model, _ = default
    d = cards.to_dict()
    assert len(d["heads"]) == model.config.n_layers * model.config.n_heads
    assert d["ablation"]["forwards"] == 1 + model.config.n_layers
    head = d["heads"][8]  # 1.0
    assert set(head["baselines"]["induction"]) == {"random", "shuffled"}
    into = head["compositions"]["into"]
    assert into and into[0]["score"] >= into[-1]["score"]
    assert {"baselines", "scores", "composition", "ablation"} <= set(d["seconds"])


def test_the_default_models_induction_circuit(default):
    """Previous-token head 0.0 feeds every induction head: K-composition above the random
    floor, and its ablation takes each induction score below half."""
    model, tokenizer = default
    c = model.config
    circuit = induction_circuit(
        model, build_probe("random-repeat", tokenizer, c.max_len, c.vocab_size)
    )
    assert [p["head"] for p in circuit.previous] == [[0, 0]]
    assert len(circuit.induction) >= 3
    assert len(circuit.drawn) == len(circuit.induction)
    for e in circuit.edges:
        assert e["k_composition"] >= circuit.k_floor
        s = e["induction_score"]
        assert s["ablated"] <= CONFIRMED * s["clean"]
    assert circuit.forwards == 2
