"""Head scores on hand-built attention patterns with known answers, and against a plain loop."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from headlab.heads import (
    duplicate_token_score,
    induction_score,
    pattern_score,
    previous_token_score,
)


def causal_uniform(n: int) -> torch.Tensor:
    """(n, n): each query spreads its attention evenly over itself and every earlier key."""
    A = torch.tril(torch.ones(n, n))
    return A / A.sum(-1, keepdim=True)


def perfect_previous(n: int) -> torch.Tensor:
    """(n, n): query i attends only to i − 1; query 0 (nothing earlier) to itself."""
    A = torch.zeros(n, n)
    A[0, 0] = 1.0
    A[torch.arange(1, n), torch.arange(0, n - 1)] = 1.0
    return A


def loop_mul_score(A: np.ndarray, tokens: np.ndarray, kind: str) -> float:
    """The TransformerLens "mul" definition written as loops over one (n, n) pattern."""
    n = A.shape[0]
    hit = 0.0
    for i in range(n):
        for j in range(n):
            if kind == "previous":
                target = j == i - 1
            elif kind == "duplicate":
                target = j < i and tokens[j] == tokens[i]
            else:  # induction: the key after an earlier copy of the query's token
                target = j >= 1 and j - 1 < i and tokens[j - 1] == tokens[i]
            hit += A[i, j] * target
    return hit / A.sum()


@pytest.mark.parametrize("n", [2, 5, 16])
def test_perfect_previous_token_head_scores_n_minus_1_over_n(n):
    assert previous_token_score(perfect_previous(n)[None]).item() == pytest.approx((n - 1) / n)


def test_uniform_causal_head_previous_score_is_harmonic():
    n = 10
    expected = sum(1 / (i + 1) for i in range(1, n)) / n  # row i puts 1/(i+1) on i − 1
    assert previous_token_score(causal_uniform(n)[None]).item() == pytest.approx(expected)


def test_scores_are_per_head_and_batch_averaged():
    n = 6
    A = torch.stack([perfect_previous(n), torch.eye(n)])  # head 0 previous, head 1 self
    batch = torch.stack([A, A])  # (2, 2, n, n)
    scores = previous_token_score(batch)
    assert scores.shape == (2,)
    assert scores.tolist() == pytest.approx([(n - 1) / n, 0.0])
    # batch average: a second sequence where head 0 attends to itself halves its score
    batch[1, 0] = torch.eye(n)
    assert previous_token_score(batch)[0].item() == pytest.approx((n - 1) / n / 2)


def test_induction_on_perfect_pattern_over_a_repeat():
    T = 5
    tokens = torch.tensor([7, 3, 9, 1, 4] * 2)
    n = 2 * T
    A = torch.eye(n)  # first half: nowhere to go, attends to itself
    for i in range(T, n):  # second half: the token after the earlier copy
        A[i] = 0
        A[i, i - T + 1] = 1
    assert induction_score(A[None], tokens).item() == pytest.approx(T / n)
    # the same pattern is no duplicate-token head, and the duplicate pattern scores T/n there
    assert duplicate_token_score(A[None], tokens).item() == pytest.approx(0.0)
    D = torch.eye(n)
    for i in range(T, n):
        D[i] = 0
        D[i, i - T] = 1
    assert duplicate_token_score(D[None], tokens).item() == pytest.approx(T / n)
    assert induction_score(D[None], tokens).item() == pytest.approx(0.0)


def test_duplicate_splits_between_several_earlier_copies():
    tokens = torch.tensor([5, 5, 5])
    A = causal_uniform(3)  # row 2 spends 2/3 on the two earlier 5s, row 1 spends 1/2
    assert duplicate_token_score(A[None], tokens).item() == pytest.approx((0.5 + 2 / 3) / 3)


@pytest.mark.parametrize("seed", range(3))
def test_scores_match_a_plain_loop_on_random_patterns(seed):
    g = torch.Generator().manual_seed(seed)
    B, h, n = 2, 3, 9
    tokens = torch.randint(0, 4, (B, n), generator=g)
    logits = torch.randn(B, h, n, n, generator=g).masked_fill(
        ~torch.tril(torch.ones(n, n, dtype=torch.bool)), float("-inf")
    )
    A = logits.softmax(-1)
    got = {
        "previous": previous_token_score(A),
        "duplicate": duplicate_token_score(A, tokens),
        "induction": induction_score(A, tokens),
    }
    for kind, scores in got.items():
        expected = [
            np.mean([loop_mul_score(A[b, hd].numpy(), tokens[b].numpy(), kind) for b in range(B)])
            for hd in range(h)
        ]
        assert scores.tolist() == pytest.approx(expected, abs=1e-6), kind


def test_scores_lie_in_unit_interval_and_zero_mass_scores_zero():
    A = torch.zeros(1, 2, 4, 4)
    A[0, 0] = perfect_previous(4)
    scores = pattern_score(A, torch.diag(torch.ones(3), -1))
    assert scores.tolist() == pytest.approx([0.75, 0.0])


def test_shape_errors_say_what_is_expected():
    with pytest.raises(ValueError, match=r"\(B, h, n, s\)"):
        previous_token_score(torch.ones(4, 4))
    with pytest.raises(ValueError, match="do not match"):
        induction_score(torch.ones(1, 2, 4, 4), torch.tensor([1, 2, 3]))
