"""Every head type on hand-built heads with known answers, and every "where it can act" score
against a plain loop over its definition (docs/heads.md)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from headlab.heads import (
    LABELS,
    SINK_THRESHOLD,
    THRESHOLDS,
    TIERS,
    HeadReport,
    HeadScore,
    duplicate_score,
    induction_score,
    label_head,
    offset_mass,
    pattern_scores,
    rare_word_score,
    rare_word_targets,
    targets_of,
)
from headlab.measure import token_words

T = 8  # segment length: a start token, then ids 1..T twice
RARE = 5  # the token the rare-word head looks for (its "least frequent word")


def probe_tokens() -> torch.Tensor:
    """A start token, ids 1..T, then the same ids in another order: no fixed period, so no
    token rule coincides with a fixed offset."""
    second = torch.tensor([3, 7, 1, 5, 8, 2, 6, 4])
    return torch.cat([torch.tensor([0]), torch.arange(1, T + 1), second])[None]  # (1, 17)


def rule_pattern(tokens: list[int], rule) -> torch.Tensor:
    """(n, n) causal pattern: query i puts all its weight on key rule(tokens, i) (≤ i)."""
    n = len(tokens)
    A = torch.zeros(n, n)
    for i in range(n):
        j = rule(tokens, i)
        assert 0 <= j <= i
        A[i, j] = 1.0
    return A


def earlier(tokens: list[int], i: int) -> int:
    """The latest earlier position of token i, −1 if none."""
    return max((j for j in range(1, i) if tokens[j] == tokens[i]), default=-1)


def last_with(tokens: list[int], i: int, token: int) -> int:
    return max((j for j in range(1, i + 1) if tokens[j] == token), default=0)


RULES = {  # name → (rule, is it a token rule)
    "previous": (lambda t, i: max(i - 1, 0), False),
    "self": (lambda t, i: i, False),
    "positional": (lambda t, i: i - 3 if i >= 3 else 0, False),
    "induction": (lambda t, i: earlier(t, i) + 1 if earlier(t, i) > 0 else 0, True),
    "duplicate": (lambda t, i: max(earlier(t, i), 0), True),
    # a token rule with no name: token t looks at the latest token (t + 3) mod T, else rests
    "content": (lambda t, i: last_with(t, i, (t[i] + 2) % T + 1) if t[i] else 0, True),
    "rare_word": (lambda t, i: last_with(t, i, RARE), True),
    "first_token": (lambda t, i: 0, False),
}


def hand_built_scores():
    """Every rule as one head of a (1, h, n, n) pattern, scored like analyse does."""
    tokens = probe_tokens()
    n = tokens.shape[1]
    movable = torch.ones(1, n, dtype=torch.bool)
    movable[0, 0] = False
    heads = [rule_pattern(tokens[0].tolist(), rule) for rule, _ in RULES.values()]
    word_index = torch.arange(n)[None] - 1  # each token its own word, the start token none
    zipf = [[3.0 if int(t) != RARE else 1.0 for t in tokens[0, 1:]]]
    rare = rare_word_targets(word_index, zipf, causal=True)
    delimiters = torch.zeros(1, n, dtype=torch.bool)
    targets = targets_of(tokens, True, delimiters, ~movable, rare)
    by_type, offsets, rests = pattern_scores(torch.stack(heads)[None], targets)
    return by_type, offsets, rests


@pytest.fixture(scope="module")
def scored():
    return hand_built_scores()


@pytest.mark.parametrize("index", range(len(RULES)))
def test_each_hand_built_head_gets_its_label(scored, index):
    """A head built for one type passes that type's threshold and gets its label; every other
    named type stays below its threshold (but the other score of the same label: an induction
    head's share of the attention off the first token is 1 too)."""
    by_type, offsets, _ = scored
    kind = list(RULES)[index]
    values = {k: float(v[index]) for k, v in by_type.items()}
    assert values[kind] >= THRESHOLDS[kind], (kind, values)
    assert label_head(values, int(offsets[index])) == LABELS[kind]
    offset_heads = {"previous", "self", "positional"}  # their positional score is their evidence
    for other in TIERS[0]:
        if LABELS.get(other) == LABELS[kind]:
            continue
        if other in values and other != kind and not {kind, other} <= offset_heads | {"positional"}:
            assert values[other] < THRESHOLDS[other], (kind, other, values[other])


def test_hand_built_heads_score_exactly(scored):
    by_type, offsets, rests = scored
    names = list(RULES)
    at = {k: names.index(k) for k in names}
    # the induction head puts everything on its target on the 8 rows with an earlier copy
    assert by_type["induction"][at["induction"]].item() == pytest.approx(1.0)
    # ... and rests on the first token on the 9 rows without one (the "mul" score: 8/17)
    assert rests["induction"][at["induction"]].item() == pytest.approx(1.0)
    assert by_type["induction_mul"][at["induction"]].item() == pytest.approx(8 / 17)
    assert by_type["duplicate"][at["duplicate"]].item() == pytest.approx(1.0)
    assert by_type["previous"][at["previous"]].item() == pytest.approx(1.0)
    assert by_type["self"][at["self"]].item() == pytest.approx(1.0)  # query 0 has no choice
    assert offsets[at["positional"]].item() == -3
    assert by_type["positional"][at["positional"]].item() == pytest.approx(1.0)
    assert by_type["first_token"][at["first_token"]].item() == pytest.approx(1.0)
    # the rare-word head: every query after the first 5 (except the 5s themselves) hits
    assert by_type["rare_word"][at["rare_word"]].item() == pytest.approx(1.0)
    # positional heads do not follow tokens, and a head on the start token is no content head
    for kind in ("previous", "self", "positional", "first_token"):
        assert by_type["content"][at[kind]].item() == pytest.approx(0.0, abs=1e-6)


def loop_offset_mass(A: np.ndarray, shift: int, causal: bool) -> float:
    """Mean of A[i, i + shift] over the queries that see key i + shift and at least two keys."""
    n = A.shape[0]
    vals = []
    for i in range(n):
        visible = i + 1 if causal else n
        if visible >= 2 and 0 <= i + shift < visible:
            vals.append(A[i, i + shift])
    return float(np.mean(vals)) if vals else 0.0


def loop_prefix_matching(A: np.ndarray, tokens: np.ndarray) -> float:
    """Olsson et al.'s prefix matching as loops: over the queries whose token occurred before,
    the attention on the keys right after those earlier occurrences."""
    vals = []
    for i in range(len(tokens)):
        after = [j + 1 for j in range(i) if tokens[j] == tokens[i]]
        if after:
            vals.append(sum(A[i, k] for k in after))
    return float(np.mean(vals)) if vals else 0.0


def after_earlier_copy(tokens: np.ndarray, i: int, j: int) -> bool:
    return 1 <= j <= i and tokens[j - 1] == tokens[i]


def loop_duplicate(A: np.ndarray, tokens: np.ndarray, causal: bool) -> float:
    """Other copies of the query's token (earlier ones when causal), except keys that are also
    the token after an earlier copy; over the queries that have such a key."""
    vals = []
    for i in range(len(tokens)):
        copies = [j for j in range(len(tokens)) if j != i and tokens[j] == tokens[i]]
        copies = [
            j for j in copies if (j < i or not causal) and not after_earlier_copy(tokens, i, j)
        ]
        if copies:
            vals.append(sum(A[i, j] for j in copies))
    return float(np.mean(vals)) if vals else 0.0


def loop_induction(A: np.ndarray, tokens: np.ndarray) -> float:
    """The token after an earlier copy, except keys holding the query's own token."""
    vals = []
    for i in range(len(tokens)):
        after = [
            j
            for j in range(len(tokens))
            if after_earlier_copy(tokens, i, j) and tokens[j] != tokens[i]
        ]
        if after:
            vals.append(sum(A[i, j] for j in after))
    return float(np.mean(vals)) if vals else 0.0


def random_patterns(seed: int, causal: bool, B: int = 2, h: int = 3, n: int = 11):
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, 4, (B, n), generator=g)
    logits = torch.randn(B, h, n, n, generator=g) * 2
    if causal:
        logits = logits.masked_fill(~torch.ones(n, n, dtype=torch.bool).tril(), float("-inf"))
    return logits.softmax(-1), tokens


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("seed", range(3))
def test_where_possible_scores_match_plain_loops(seed, causal):
    A, tokens = random_patterns(seed, causal)
    B, h = A.shape[:2]

    def expect(fn):
        return [
            np.mean([fn(A[b, k].numpy(), tokens[b].numpy()) for b in range(B)]) for k in range(h)
        ]

    for shift in (-1, 0, 1):
        if causal and shift == 1:
            continue
        want = expect(lambda a, t, s=shift: loop_offset_mass(a, s, causal))
        assert offset_mass(A, shift, causal).tolist() == pytest.approx(want, abs=1e-6), shift
    assert duplicate_score(A, tokens, causal).tolist() == pytest.approx(
        expect(lambda a, t: loop_duplicate(a, t, causal)), abs=1e-6
    )
    if causal:
        assert induction_score(A, tokens).tolist() == pytest.approx(
            expect(loop_induction), abs=1e-6
        )


def test_induction_equals_prefix_matching_on_distinct_repeated_tokens():
    """On Olsson et al.'s probe (distinct tokens, repeated) no key is both a copy and the token
    after a copy, so the one induction score is their prefix-matching score (as loops) exactly."""
    g = torch.Generator().manual_seed(0)
    from headlab.measure import repeated_random_tokens

    tokens, _ = repeated_random_tokens(torch.arange(50), 7, 3, 2, g, prefix=(99,))
    logits = torch.randn(2, 3, 22, 22, generator=g)
    A = logits.masked_fill(~torch.ones(22, 22, dtype=torch.bool).tril(), float("-inf")).softmax(-1)
    want = [
        np.mean([loop_prefix_matching(A[b, k].numpy(), tokens[b].numpy()) for b in range(2)])
        for k in range(3)
    ]
    assert induction_score(A, tokens).tolist() == pytest.approx(want, abs=1e-6)


def test_a_run_of_one_token_is_no_evidence_for_induction():
    """In "x x x x" the token after an earlier x is an x: attending there is copying, self or
    induction alike, so no row of the run can judge an induction head."""
    tokens = torch.tensor([[0, 7, 7, 7, 7]])
    A = torch.tril(torch.ones(5, 5))
    A = (A / A.sum(-1, keepdim=True))[None, None]
    assert induction_score(A, tokens).item() == 0.0  # no row has a target left
    # Olsson's score counts the run: rows 2, 3, 4 put 1/3, 2/4 and 3/5 on keys after an x
    assert loop_prefix_matching(A[0, 0].numpy(), tokens[0].numpy()) == pytest.approx(
        (1 / 3 + 2 / 4 + 3 / 5) / 3
    )


@pytest.mark.parametrize("seed", range(2))
def test_mul_scores_in_the_report_equal_their_formula(seed):
    """The TransformerLens-compatible scores (detect_head, "mul", exclude_bos=False,
    exclude_current_token=False) stay in every report: Σ(A ⊙ P) / Σ A, written as loops."""
    A, tokens = random_patterns(seed, causal=True)
    B, h, n, _ = A.shape
    by_type, _, _ = pattern_scores(A, targets_of(tokens, causal=True))
    targets = {
        "previous_mul": lambda t, i, j: j == i - 1,
        "duplicate_mul": lambda t, i, j: j < i and t[j] == t[i],
        "induction_mul": lambda t, i, j: 1 <= j <= i and t[j - 1] == t[i],
    }
    for name, target in targets.items():
        want = []
        for k in range(h):
            per_seq = []
            for b in range(B):
                a, t = A[b, k].numpy(), tokens[b].tolist()
                hit = sum(a[i, j] for i in range(n) for j in range(n) if target(t, i, j))
                per_seq.append(hit / a.sum())
            want.append(np.mean(per_seq))
        assert by_type[name].tolist() == pytest.approx(want, abs=1e-6), name


def test_rare_word_targets_and_score_by_hand():
    # words: the(0) keeper(1) ' s(1) fed(2) , (3) lighthouse(4) ; "keeper" is the rarest
    word_index = torch.tensor([[-1, 0, 1, 1, 2, 3, 4]])
    zipf = [[7.7, 2.5, 4.9, float("nan"), 3.0]]
    rare, rows = rare_word_targets(word_index, zipf, causal=True)
    assert rare.tolist() == [[False, False, True, True, False, False, False]]
    # rows after the first piece of "keeper", outside it, not special: fed , lighthouse
    assert rows.tolist() == [[False, False, False, False, True, True, True]]
    A = torch.zeros(1, 1, 7, 7)
    A[0, 0, :, 0] = 1.0
    A[0, 0, 4, 3] = A[0, 0, 5, 2] = 1.0  # two of the three rows look at a piece of "keeper"
    A[0, 0, 4, 0] = A[0, 0, 5, 0] = 0.0
    assert rare_word_score(A, rare, rows).item() == pytest.approx(2 / 3)
    bidirectional = rare_word_targets(word_index, zipf, causal=False)[1]
    assert bidirectional.tolist() == [[False, True, False, False, True, True, True]]


def test_token_words_by_hand():
    text = "The keeper's dog, tired."
    # a byte-level BPE split with a start token; offsets as such a tokenizer reports them
    offsets = [
        (0, 0),
        (0, 3),
        (3, 7),
        (7, 10),
        (10, 12),
        (12, 16),
        (16, 17),
        (17, 19),
        (19, 23),
        (23, 24),
    ]
    special = [True] + [False] * 9
    index, words = token_words(text, offsets, special)
    assert words == ["The", "keeper's", "dog", ",", "tired", "."]
    assert index == [-1, 0, 1, 1, 1, 2, 3, 4, 4, 5]


def test_sink_share_per_layer():
    def head(layer: int, h: int, first: float) -> HeadScore:
        return HeadScore(layer, h, "mixed", {"first_token": first}, 0)

    heads = [head(0, 0, 0.1), head(0, 1, 0.2), head(1, 0, 0.9), head(1, 1, SINK_THRESHOLD + 0.01)]
    empty = {"tokens": [], "ids": [], "averaged": []}
    patterns = {"patterns": torch.zeros(2, 2, 1, 1), "averaged_patterns": torch.zeros(2, 1, 1)}
    report = HeadReport(probe="text", heads=heads, **empty, **patterns)
    assert report.sinks == [
        {"layer": 0, "share": 0.0, "heads": []},
        {"layer": 1, "share": 1.0, "heads": [0, 1]},
    ]
