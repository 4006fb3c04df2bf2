"""Head scores on hand-built attention patterns with known answers, and against a plain loop."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from headlab import Trace
from headlab.heads import (
    MUL_TYPES,
    SCORE_TYPES,
    THRESHOLDS,
    analyse,
    averaged_pattern,
    content_score,
    copies_pattern,
    diffuse_score,
    duplicate_mul_score,
    first_token_score,
    induction_mul_score,
    induction_pattern,
    key_mass_score,
    label_head,
    offset_mass,
    pattern_score,
    positional_score,
    previous_mul_score,
    shuffle_positions,
)
from headlab.measure import make_probe, repeated_random_tokens
from headlab.model import ModelConfig, Transformer


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
    assert previous_mul_score(perfect_previous(n)[None]).item() == pytest.approx((n - 1) / n)


def test_uniform_causal_head_previous_score_is_harmonic():
    n = 10
    expected = sum(1 / (i + 1) for i in range(1, n)) / n  # row i puts 1/(i+1) on i − 1
    assert previous_mul_score(causal_uniform(n)[None]).item() == pytest.approx(expected)


def test_scores_are_per_head_and_batch_averaged():
    n = 6
    A = torch.stack([perfect_previous(n), torch.eye(n)])  # head 0 previous, head 1 self
    batch = torch.stack([A, A])  # (2, 2, n, n)
    scores = previous_mul_score(batch)
    assert scores.shape == (2,)
    assert scores.tolist() == pytest.approx([(n - 1) / n, 0.0])
    # batch average: a second sequence where head 0 attends to itself halves its score
    batch[1, 0] = torch.eye(n)
    assert previous_mul_score(batch)[0].item() == pytest.approx((n - 1) / n / 2)


def test_induction_on_perfect_pattern_over_a_repeat():
    T = 5
    tokens = torch.tensor([7, 3, 9, 1, 4] * 2)
    n = 2 * T
    A = torch.eye(n)  # first half: nowhere to go, attends to itself
    for i in range(T, n):  # second half: the token after the earlier copy
        A[i] = 0
        A[i, i - T + 1] = 1
    assert induction_mul_score(A[None], tokens).item() == pytest.approx(T / n)
    # the same pattern is no duplicate-token head, and the duplicate pattern scores T/n there
    assert duplicate_mul_score(A[None], tokens).item() == pytest.approx(0.0)
    D = torch.eye(n)
    for i in range(T, n):
        D[i] = 0
        D[i, i - T] = 1
    assert duplicate_mul_score(D[None], tokens).item() == pytest.approx(T / n)
    assert induction_mul_score(D[None], tokens).item() == pytest.approx(0.0)


def test_duplicate_splits_between_several_earlier_copies():
    tokens = torch.tensor([5, 5, 5])
    A = causal_uniform(3)  # row 2 spends 2/3 on the two earlier 5s, row 1 spends 1/2
    assert duplicate_mul_score(A[None], tokens).item() == pytest.approx((0.5 + 2 / 3) / 3)


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
        "previous": previous_mul_score(A),
        "duplicate": duplicate_mul_score(A, tokens),
        "induction": induction_mul_score(A, tokens),
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
        previous_mul_score(torch.ones(4, 4))
    with pytest.raises(ValueError, match="do not match"):
        induction_mul_score(torch.ones(1, 2, 4, 4), torch.tensor([1, 2, 3]))


# --- the other scores, on hand-built patterns ---------------------------------------------------


def one_hot_rows(targets: list[int], s: int | None = None) -> torch.Tensor:
    """(n, s): query i puts all its attention on key targets[i]."""
    n = len(targets)
    A = torch.zeros(n, s or n)
    A[torch.arange(n), torch.tensor(targets)] = 1.0
    return A


def test_next_token_head():
    n = 6
    A = one_hot_rows([1, 2, 3, 4, 5, 0])  # last query wraps to 0: nothing after it
    # judged where it can act: the five queries that have a next token, all on it
    assert offset_mass(A[None], 1, causal=False).item() == pytest.approx(1.0)
    assert previous_mul_score(A[None]).item() == pytest.approx(0.0)
    # under a causal mask no query sees its next token: no row to judge, score 0
    assert offset_mass(causal_uniform(n)[None], 1, causal=True).item() == 0.0


def loop_positional(A: np.ndarray, causal: bool) -> tuple[float, int]:
    """Voita et al.'s positional score over the queries that can reach each offset, as loops:
    (score, δ) for the offset most queries' argmax falls on, among offsets reachable from at
    least half the queries that have a choice."""
    n, s = A.shape
    rows = [i for i in range(n) if (i + 1 if causal else s) >= 2]
    best = None
    for d in range(-(n - 1), s):
        reach = [i for i in rows if 0 <= i + d < (i + 1 if causal else s)]
        if len(reach) < max(1, len(rows) / 2):
            continue
        hits = sum(int(np.argmax(A[i])) == i + d for i in reach)
        if best is None or hits > best[0]:
            best = (hits, len(reach), d)
    assert best is not None
    return best[0] / best[1], best[2]


def test_positional_score_finds_the_offset_voita():
    n = 10
    plus2 = one_hot_rows([min(i + 2, n - 1) if i < n - 2 else 0 for i in range(n)])
    scores, offsets = positional_score(torch.stack([plus2, perfect_previous(n)]), causal=False)
    assert scores.tolist() == pytest.approx([1.0, 1.0])  # every query that has i ± δ uses it
    assert offsets.tolist() == [2, -1]
    sink = one_hot_rows([0] * n)  # always key 0: the offset differs for every query
    s, d = positional_score(sink[None], causal=True)
    assert (s.item(), d.item()) == pytest.approx(loop_positional(sink.numpy(), causal=True))
    assert s.item() < 0.25


@pytest.mark.parametrize("seed", range(3))
def test_positional_score_matches_a_plain_loop(seed):
    g = torch.Generator().manual_seed(seed)
    n = 12
    logits = torch.randn(3, n, n, generator=g) * 3
    for causal in (True, False):
        masked = logits.masked_fill(~torch.ones(n, n, dtype=torch.bool).tril(), float("-inf"))
        A = (masked if causal else logits).softmax(-1)
        scores, offsets = positional_score(A, causal)
        for h in range(3):
            want = loop_positional(A[h].numpy(), causal)
            assert (scores[h].item(), offsets[h].item()) == pytest.approx(want)


def test_positional_score_leaves_out_keys_a_token_rule_predicts():
    """Olsson et al.'s trap: on a sequence repeated with period T, an induction head's argmax
    sits at offset −(T − 1) on every second-copy query; without the rows a token rule explains
    it would pass as a positional head."""
    T = 6
    tokens = torch.cat([torch.tensor([0]), torch.arange(1, T + 1).repeat(4)])[None]
    n = tokens.shape[1]
    A = torch.zeros(n, n)
    A[:, 0] = 1.0  # resting on the first token until there is something to copy
    for i in range(T + 1, n):
        A[i] = 0
        A[i, i - T + 1] = 1.0
    plain, delta = positional_score(A[None], causal=True)
    assert delta.item() == -(T - 1) and plain.item() > 0.9
    rules = (copies_pattern(tokens) + induction_pattern(tokens)) > 0
    judged, _ = positional_score(A[None], causal=True, confounded=rules)
    assert judged.item() < 0.5


def test_first_token_and_delimiter_mass():
    n = 5
    A = torch.zeros(n, n)
    A[:, 0] = 0.5
    A[:, 3] = 0.25
    A[:, 4] = 0.25
    assert first_token_score(A[None]).item() == pytest.approx(0.5)
    delims = torch.tensor([False, False, False, True, False])
    assert key_mass_score(A[None], delims).item() == pytest.approx(0.25)


def test_diffuse_is_normalised_entropy():
    n = 8
    uniform = torch.full((n, n), 1 / n)
    assert diffuse_score(uniform[None], causal=False).item() == pytest.approx(1.0)
    assert diffuse_score(causal_uniform(n)[None], causal=True).item() == pytest.approx(1.0)
    assert diffuse_score(perfect_previous(n)[None], causal=True).item() == pytest.approx(
        0.0, abs=1e-6
    )
    half = torch.zeros(n, n)
    half[:, :2] = 0.5  # two keys of eight: entropy log 2 / log 8 = 1/3
    assert diffuse_score(half[None], causal=False).item() == pytest.approx(1 / 3)


def test_labels_follow_thresholds():
    base = dict.fromkeys(SCORE_TYPES, 0.0)
    assert label_head(base) == "mixed"
    assert label_head({**base, "previous": 0.9, "positional": 0.95}, offset=-1) == "previous-token"
    assert label_head({**base, "positional": 0.95}, offset=3) == "positional"
    assert label_head({**base, "positional": 0.95}, offset=0) == "current-token"
    assert label_head({**base, "induction": 0.6, "previous": 0.52}) == "induction"
    assert label_head({**base, "delimiter": THRESHOLDS["delimiter"]}) == "delimiter"
    assert label_head({**base, "diffuse": 0.95, "content": 0.1}) == "diffuse"
    # what a head does where it acts outranks where it rests, and a named rule outranks content
    assert label_head({**base, "induction": 0.55, "first_token": 0.99}) == "induction"
    assert label_head({**base, "content": 0.45, "first_token": 0.99}) == "content"
    assert label_head({**base, "content": 0.9, "duplicate": 0.55}) == "duplicate-token"
    assert label_head({**base, "first_token": 0.6, "diffuse": 0.95}) == "diffuse"  # margin .5 vs .2


def test_averaged_head_blurs_distinct_heads():
    n = 6
    A = torch.stack([perfect_previous(n), one_hot_rows([0] * n)])[None]  # prev head + sink head
    avg = averaged_pattern(A)
    assert avg.shape == (1, n, n)
    # half of the previous head's (n-1)/n, plus the sink's row 1 (whose key 0 is also previous)
    assert previous_mul_score(avg[:, None]).item() == pytest.approx(((n - 1) / n + 1 / n) / 2)
    # rows 0 and 1 of the previous head also land on key 0
    assert first_token_score(avg[:, None]).item() == pytest.approx((1 + 2 / n) / 2)


def test_shuffle_moves_only_movable_positions():
    tokens = torch.arange(10).repeat(2, 1)
    movable = torch.ones(2, 10, dtype=torch.bool)
    movable[:, 0] = movable[:, -1] = False
    order = shuffle_positions(tokens, movable, seed=3)
    assert (order[:, 0] == 0).all() and (order[:, -1] == 9).all()
    for row in order:
        assert sorted(row.tolist()) == list(range(10))
    assert not torch.equal(order[0], torch.arange(10))
    assert torch.equal(order, shuffle_positions(tokens, movable, seed=3))


# --- analyse on a real model ----------------------------------------------------------------


def test_analyse_scores_the_models_own_weights():
    model = Transformer(ModelConfig(vocab_size=40, d_model=32, n_layers=2, n_heads=4, max_len=32))
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.5)
    g = torch.Generator().manual_seed(1)
    tokens, _ = repeated_random_tokens(torch.arange(40), length=8, repeats=2, batch=3, generator=g)
    probe = make_probe("random-repeat", tokens, None)
    report = analyse(model.eval(), probe)
    assert len(report.heads) == 8 and report.patterns.shape == (2, 4, 16, 16)
    trace = Trace(only=("weights",))
    model(tokens, trace=trace)
    w1 = trace["blocks.1.attn.weights"]
    expected = induction_mul_score(w1, tokens)
    got = [report.head(1, h).scores["induction_mul"] for h in range(4)]
    assert got == pytest.approx(expected.tolist(), abs=1e-6)
    # prefix matching averages over the second copy only: twice the "mul" score on two copies
    got = [report.head(1, h).scores["induction"] for h in range(4)]
    assert got == pytest.approx((2 * expected).tolist(), abs=1e-6)
    torch.testing.assert_close(report.patterns[1], w1[0])
    for s in report.heads:
        assert all(0.0 <= v <= 1.0 + 1e-6 for v in s.scores.values())
        assert s.label == label_head(s.scores, s.offset)
        assert set(s.scores) >= set(MUL_TYPES)


def test_analyse_scores_content_from_the_probe_alone():
    """One forward on the probe's B sequences, no shuffled copy beside them: every layer's
    weights arrive with batch B, and the content score is content_score of those weights."""
    model = Transformer(ModelConfig(vocab_size=40, d_model=32, n_layers=2, n_heads=4, max_len=32))
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.5)
    g = torch.Generator().manual_seed(2)
    tokens, _ = repeated_random_tokens(torch.arange(40), length=8, repeats=2, batch=3, generator=g)
    probe = make_probe("random-repeat", tokens, None)
    batches: list[int] = []
    forward = model.hidden_states

    def counted(x, *args, **kwargs):
        batches.append(x.shape[0])
        return forward(x, *args, **kwargs)

    model.hidden_states = counted  # type: ignore[method-assign]
    report = analyse(model.eval(), probe)
    assert batches == [3]
    trace = Trace(only=("weights",))
    with torch.no_grad():
        forward(tokens, trace=trace)
    for layer in range(2):
        w = trace[f"blocks.{layer}.attn.weights"]
        want = content_score(w, causal=True, fixed=~probe.movable)
        got = [report.head(layer, h).scores["content"] for h in range(4)]
        assert got == pytest.approx(want.tolist(), abs=1e-6)


def test_a_probes_targets_are_built_once_and_let_go_with_it(monkeypatch) -> None:
    """analyse builds a probe's targets once and reads them again for the same probe (another
    call, another model); an equal but distinct probe, or the other causal setting, builds its
    own; a probe that is gone takes its targets with it."""
    import gc

    from headlab.heads import targets as T

    built: list[bool] = []
    real = T.build_targets
    monkeypatch.setattr(T, "build_targets", lambda p, c, r=True: built.append(c) or real(p, c, r))
    monkeypatch.setattr(T, "_LAST", [])
    g = torch.Generator().manual_seed(5)
    tokens, _ = repeated_random_tokens(torch.arange(30), length=6, repeats=3, batch=2, generator=g)
    probe = make_probe("random-repeat", tokens, None)
    config = ModelConfig(vocab_size=30, d_model=16, n_layers=2, n_heads=2, max_len=32)
    first = analyse(Transformer(config).eval(), probe)
    again = analyse(Transformer(config).eval(), probe)
    assert built == [True]
    assert T.probe_targets(probe, True) is T.probe_targets(probe, True)
    assert [s.scores for s in first.heads] != [s.scores for s in again.heads]  # two models
    T.probe_targets(probe, False)
    assert built == [True, False]
    twin = make_probe("random-repeat", tokens.clone(), None)
    assert T.probe_targets(twin, True) is not T.probe_targets(probe, True)
    assert built == [True, False, True, True]
    del probe, twin, first, again
    gc.collect()
    assert T._LAST == []
