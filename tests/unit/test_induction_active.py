"""An induction head that rests: the induction share of the attention a head does not rest on
the first position (headlab.heads.scores.induction_active_score), and the label rule that
judges an induction head by it (headlab.heads.labels.NEEDS).

Held to a hand computation on a small hand-made pattern, to the rule as docs/heads.md writes
it, and, on the shipped default model, to twelve repeated sentences that appear nowhere else
in the repository (nobody tuned the rule on them): an induction head is labelled on at least
eleven, only ever a head that Olsson et al.'s probe (repeated random tokens) labels induction
too, and random weights of the same shape earn no induction label on them.
"""

from __future__ import annotations

import pytest
import torch

from headlab.heads import (
    NEEDS,
    decide,
    induction_active_score,
    induction_score,
    pattern_scores,
    qualifies,
    targets_of,
)

# --- a hand-made pattern ---------------------------------------------------------------------
# Three sequences of six tokens, a start token (0) first. Sequence 0 repeats "1 2": query 4 (a
# 1) can copy key 2, query 5 (a 2) key 3. Sequence 1 repeats nothing: no row to judge. In
# sequence 2, query 3 (a 5) can copy key 2, query 4 (a 6) key 3.
TOKENS = torch.tensor([[0, 1, 2, 3, 1, 2], [0, 1, 2, 3, 4, 5], [0, 5, 6, 5, 6, 7]])
# (sequence, query) → {key: weight} for the rows that do not rest wholly on key 0; head 0 copies
# and rests, head 1 rests almost wholly and gives the copy the little left
ROWS = {
    0: {
        (0, 4): {0: 0.6, 2: 0.36, 3: 0.04},
        (0, 5): {0: 0.5, 3: 0.45, 4: 0.05},
        (2, 3): {0: 0.8, 2: 0.2},
        (2, 4): {0: 0.2, 3: 0.4, 1: 0.4},
    },
    1: {
        (0, 4): {0: 0.9, 2: 0.1},
        (0, 5): {0: 0.92, 3: 0.08},
    },
}


def hand_pattern() -> torch.Tensor:
    """(3, 2, 6, 6): every row on key 0 but those of :data:`ROWS`; causal, rows summing to 1."""
    A = torch.zeros(3, 2, 6, 6)
    A[..., 0] = 1.0
    for head, rows in ROWS.items():
        for (b, i), keys in rows.items():
            A[b, head, i] = 0.0
            for j, w in keys.items():
                assert j <= i
                A[b, head, i, j] = w
    assert torch.allclose(A.sum(-1), torch.ones(3, 2, 6))
    return A


# The same numbers worked by hand. Head 0: sequence 0 puts 0.36 + 0.45 = 0.81 on the copies'
# successors out of 0.4 + 0.5 = 0.9 off key 0, a share of 0.9; sequence 2 puts 0.2 + 0.4 = 0.6
# out of 0.2 + 0.8 = 1.0, a share of 0.6; the mean over the two sequences with a row is 0.75
# (pooling them would give 1.41 / 1.9 = 0.742). Its plain induction score: (0.405 + 0.3) / 2.
# Head 1: 0.18 of 0.18, a share of 1.0, in sequence 0; nothing off key 0 in sequence 2, a share
# of 0: the mean 0.5. Its plain score: (0.09 + 0) / 2.
HAND_ACTIVE = [0.75, 0.5]
HAND_PLAIN = [(0.405 + 0.3) / 2, 0.09 / 2]


def test_the_share_off_the_first_token_equals_the_hand_computation() -> None:
    A = hand_pattern()
    assert induction_active_score(A, TOKENS).tolist() == pytest.approx(HAND_ACTIVE, abs=1e-6)
    assert induction_score(A, TOKENS).tolist() == pytest.approx(HAND_PLAIN, abs=1e-6)
    scores, _, _ = pattern_scores(A, targets_of(TOKENS, causal=True))
    assert scores["induction_active"].tolist() == pytest.approx(HAND_ACTIVE, abs=1e-6)
    assert scores["induction"].tolist() == pytest.approx(HAND_PLAIN, abs=1e-6)


def test_the_copying_head_that_rests_is_an_induction_head_and_the_one_that_parks_a_sink() -> None:
    """Head 0 spends most of its attention on key 0 (first-token score 0.89) and most of the
    rest on the copy: an induction head (the old rule, plain score 0.35 < 0.5, called it a
    sink). Head 1 gives the copy all it does not park, but that is 0.045 of its attention:
    a sink."""
    A = hand_pattern()
    scores, offsets, _ = pattern_scores(A, targets_of(TOKENS, causal=True))
    heads = [{k: float(v[h]) for k, v in scores.items()} for h in range(2)]
    assert heads[0]["first_token"] > 0.5 and heads[1]["first_token"] > 0.5
    first = decide(heads[0], int(offsets[0]))
    assert (first.label, first.kind) == ("induction", "induction_active")
    without = {k: v for k, v in heads[0].items() if k != "induction_active"}
    assert decide(without, int(offsets[0])).label == "sink"  # the rule before
    assert decide(heads[1], int(offsets[1])).label == "sink"


def test_the_minimum_of_the_plain_score_and_the_floor_gate_the_share() -> None:
    plain, least = NEEDS["induction_active"]
    assert (plain, least) == ("induction", 0.25)
    head = {"induction": 0.25, "induction_active": 0.8, "first_token": 0.7}
    assert decide(head).label == "induction"
    assert decide({**head, "induction": 0.2499}).label == "sink"
    assert decide({**head, "induction_active": 0.4999}).label == "sink"
    assert decide(head, floors={"induction_active": 0.81}).label == "sink"
    assert decide(head, floors={"induction_active": 0.79}).label == "induction"
    # an induction score that passes by itself needs no share: the rule before still holds
    assert decide({"induction": 0.6, "first_token": 0.7}).label == "induction"
    assert not qualifies("induction_active", {"induction_active": 0.9})  # no plain score


def test_a_head_that_never_rests_scores_its_plain_share() -> None:
    """Nothing on key 0: the share of the attention off it is the plain score itself."""
    g = torch.Generator().manual_seed(3)
    tokens = torch.tensor([[0, 4, 5, 6, 4, 5, 6, 7]])
    logits = torch.randn(1, 3, 8, 8, generator=g)
    logits[..., 0] = float("-inf")
    logits = logits.masked_fill(~torch.ones(8, 8, dtype=torch.bool).tril(), float("-inf"))
    logits[:, :, 0, 0] = 0.0  # the first query has only key 0
    A = logits.softmax(-1)
    A[:, :, 0] = 0.0  # … and its row is never judged (no earlier copy)
    assert torch.allclose(induction_active_score(A, tokens), induction_score(A, tokens), atol=1e-6)


# --- the shipped model on sentences nobody tuned on ------------------------------------------
# Ordinary sentences, each typed twice as the page's text box gets it ("S S"); none appears
# anywhere else in the repository. The default model takes 64 tokens, so each is 8-14 words.
SENTENCES = [
    "The library lends laptops to students during exam week.",
    "My uncle grows tomatoes and beans behind his small house.",
    "The bus was full, so Anna walked to school in the rain.",
    "We painted the kitchen a pale blue last spring.",
    "A tall man in a grey coat asked me for directions to the bank.",
    "Two ducks swam slowly across the quiet pond near the farm.",
    "After lunch the teacher read a story about a brave fox.",
    "Our flight leaves at noon, so we should pack tonight.",
    "The baby finally fell asleep after a long warm bath.",
    "Ben lost his keys again and had to climb through the window.",
    "The shop on Main Street sells old maps and postcards.",
    "Every Sunday my grandmother bakes apple pie for the whole family.",
]
RANDOM_SEEDS = (0, 1, 2, 3, 4)


@pytest.fixture(scope="module")
def sentence_labels(default, tmp_path_factory):
    """For the trained model (labels gated by the random-weights floors, as the page and the
    CLI label) and for each random model of its shape (thresholds alone: the easier test to
    pass), every sentence's heads labelled induction; and the heads the random-repeat probe
    labels induction. Floors are kept in a temporary cache."""
    from headlab.heads.baselines import label_heads, random_model
    from headlab.measure import build_probe

    model, tokenizer = default
    c = model.config

    def probe(text: str | None, name: str = "text"):
        return build_probe(name, tokenizer, c.max_len, c.vocab_size, text)

    def induction(report) -> set[tuple[int, int]]:
        return {(s.layer, s.head) for s in report.heads if s.label == "induction"}

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HEADLAB_CACHE", str(tmp_path_factory.mktemp("cache")))
        trained = [induction(label_heads(model, probe(f"{s} {s}"))) for s in SENTENCES]
        olsson = induction(label_heads(model, probe(None, "random-repeat")))
        randoms = {
            seed: [
                induction(label_heads(random_model(model, seed), probe(f"{s} {s}"), floors=False))
                for s in SENTENCES
            ]
            for seed in RANDOM_SEEDS
        }
    return trained, olsson, randoms


@pytest.mark.slow
def test_an_induction_head_is_labelled_on_repeated_sentences_nobody_tuned_on(sentence_labels):
    trained, olsson, _ = sentence_labels
    assert sum(bool(heads) for heads in trained) >= 11, trained
    for heads in trained:  # no head the random-repeat probe does not call induction too
        assert heads <= olsson, (heads, olsson)


@pytest.mark.slow
def test_random_weights_of_the_shipped_shape_earn_no_induction_label_on_them(sentence_labels):
    _, _, randoms = sentence_labels
    assert randoms == {seed: [set()] * len(SENTENCES) for seed in RANDOM_SEEDS}
