"""The content score from the one forward: the share of a head's attention that its own position
profile (by offset, by key position; pooled over the probe, leave-one-out) does not explain.
Held to a plain-Python loop on random patterns and to hand-built heads with known answers."""

from __future__ import annotations

import pytest
import torch

from headlab.heads import content_score
from headlab.heads.labels import THRESHOLDS


def loop_content(A: torch.Tensor, causal: bool, fixed: torch.Tensor | None) -> list[float]:
    """The definition walked row by row for each head: A (B, h, n, n), fixed (B, n) bool or
    None → [content per head], with dictionaries of sums, weights and counts per profile
    cell (the profile is the w-weighted mean of the other rows' u there)."""
    B, h, n, _ = A.shape
    a = A.double().tolist()
    free = [[True] * n for _ in range(B)] if fixed is None else (~fixed).tolist()
    for row in free:  # the first position is never compared, whatever it holds
        row[0] = False
    out = []
    for head in range(h):
        rows = {}  # (b, i) → (w_i, {j: u_ij})
        every = 0  # the rows with two keys: each counts, a rest on fixed keys as explained
        for b in range(B):
            for i in range(n):
                keys = [j for j in range(n) if free[b][j] and (not causal or j <= i)]
                every += len(keys) >= 2
                w = sum(a[b][head][i][j] for j in keys)
                if len(keys) >= 2 and w > 0:
                    rows[b, i] = (w, {j: a[b][head][i][j] / w * len(keys) for j in keys})
        shares = []
        for cell in (lambda i, j: i - j, lambda i, j: j):
            total: dict[int, float] = {}  # Σ w u at each cell
            weight: dict[int, float] = {}  # Σ w
            count: dict[int, int] = {}  # how many rows
            for (_, i), (w, u) in rows.items():
                for j, v in u.items():
                    total[cell(i, j)] = total.get(cell(i, j), 0.0) + w * v
                    weight[cell(i, j)] = weight.get(cell(i, j), 0.0) + w
                    count[cell(i, j)] = count.get(cell(i, j), 0) + 1
            num = 0.0
            for (_, i), (w, u) in rows.items():
                kept = [j for j in u if count[cell(i, j)] > 1]
                if not kept:
                    continue
                p = {j: u[j] for j in kept}
                q = {j: (total[cell(i, j)] - w * u[j]) / (weight[cell(i, j)] - w) for j in kept}
                sp, sq = sum(p.values()), sum(q.values())
                # no mass to renormalise on one side: nothing of the row is explained
                overlap = sum(min(p[j] / sp, q[j] / sq) for j in kept) if sp and sq else 0.0
                num += w * (1 - overlap)
            shares.append(num / every if every else 0.0)
        out.append(min(max(min(shares), 0.0), 1.0))
    return out


def random_patterns(B: int, h: int, n: int, causal: bool, g: torch.Generator) -> torch.Tensor:
    """Softmax rows of random logits, some sharp, some flat, some zero in places: (B, h, n, n)."""
    logits = torch.randn(B, h, n, n, generator=g, dtype=torch.float64)
    logits = logits * torch.rand(1, h, 1, 1, generator=g, dtype=torch.float64) * 6
    if causal:
        logits = logits.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    A = logits.softmax(-1)
    A[0, 0, -1] = 0.0  # a row with no weight anywhere: skipped, not a division by zero
    A[0, 0, -1, 0] = 1.0
    return A


@pytest.mark.parametrize("causal", [True, False])
def test_vectorised_content_equals_the_loop(causal: bool) -> None:
    g = torch.Generator().manual_seed(7)
    for draw in range(12):
        B = 1 + draw % 3
        n = int(torch.randint(2, 12, (1,), generator=g))
        A = random_patterns(B, 3, n, causal, g)
        fixed = None
        if draw % 2:
            fixed = torch.rand(B, n, generator=g) < 0.25
            fixed[:, 0] = True  # a start token, as probes keep
        got = content_score(A, causal, fixed)
        want = loop_content(A, causal, fixed)
        assert got.tolist() == pytest.approx(want, abs=1e-6), (draw, B, n, causal)
        assert got.dtype == torch.float32 and got.shape == (3,)


def one_hot(B: int, n: int, key) -> torch.Tensor:
    """(B, 1, n, n): query i puts all its weight on key(i)."""
    A = torch.zeros(B, 1, n, n)
    for i in range(n):
        A[:, 0, i, key(i)] = 1.0
    return A


@pytest.mark.parametrize("causal", [True, False])
def test_uniform_and_fixed_offset_heads_score_zero(causal: bool) -> None:
    n = 20
    fixed = torch.zeros(2, n, dtype=torch.bool)
    fixed[:, 0] = True
    visible = torch.tril(torch.ones(n, n)) if causal else torch.ones(n, n)
    uniform = (visible / visible.sum(-1, keepdim=True)).expand(2, 1, n, n)
    assert content_score(uniform, causal).item() == pytest.approx(0.0, abs=1e-6)
    assert content_score(uniform, causal, fixed).item() == pytest.approx(0.0, abs=1e-6)
    # previous-token, current-token and offset −3 heads; a row without its key rests on the
    # start token (fixed), as trained heads do, and so does not count
    for shift in (1, 0, 3):
        head = one_hot(2, n, lambda i, s=shift: i - s if i - s >= 1 else 0)
        assert content_score(head, causal, fixed).item() == pytest.approx(0.0, abs=1e-6), shift
    nxt = one_hot(2, n, lambda i: i + 1 if i + 1 < n else 0)  # the next token, seen both ways
    if not causal:
        assert content_score(nxt, causal, fixed).item() == pytest.approx(0.0, abs=1e-6)


@pytest.mark.parametrize("causal", [True, False])
def test_a_head_on_one_key_position_scores_zero(causal: bool) -> None:
    n = 16
    fixed = torch.zeros(3, n, dtype=torch.bool)
    fixed[:, 0] = True
    head = one_hot(3, n, lambda i: 2 if (i >= 2 or not causal) else 0)
    assert content_score(head, causal, fixed).item() == pytest.approx(0.0, abs=1e-6)
    # by offset it is not explained: the key-position profile is what wins
    assert content_score(head, causal, fixed).item() < 0.5


def copies_head(tokens: torch.Tensor, causal: bool) -> torch.Tensor:
    """(B, 1, n, n): every other copy of the query's token (earlier ones when causal), else the
    start token (position 0): a head that reads token identity."""
    B, n = tokens.shape
    A = torch.zeros(B, 1, n, n)
    for b in range(B):
        for i in range(n):
            js = [
                j
                for j in range(1, n)
                if j != i and tokens[b, j] == tokens[b, i] and (not causal or j < i)
            ] or [0]
            A[b, 0, i, js] = 1 / len(js)
    return A


@pytest.mark.parametrize("causal", [True, False])
def test_a_head_that_follows_tokens_on_random_text_scores_high(causal: bool) -> None:
    g = torch.Generator().manual_seed(3)
    tokens = torch.randint(1, 8, (3, 40), generator=g)  # random tokens with many repeats
    tokens[:, 0] = 0
    fixed = tokens == 0
    assert content_score(copies_head(tokens, causal), causal, fixed).item() > 0.5
    # the next token's value: A_ij ∝ [token_j == token_i + 1], a rule on identity alone
    follow = (tokens[:, None, :, None] % 7 + 1 == tokens[:, None, None, :]).float()
    follow[..., 0] = 1e-6  # rows without such a key rest on the start token
    if causal:
        follow = follow * torch.tril(torch.ones(40, 40))
    follow = follow / follow.sum(-1, keepdim=True)
    assert content_score(follow, causal, fixed).item() > 0.5


def test_a_sink_head_does_not_count_and_rows_are_pooled_over_the_batch() -> None:
    n = 12
    fixed = torch.zeros(2, n, dtype=torch.bool)
    fixed[:, 0] = True
    sink = torch.zeros(2, 1, n, n)
    sink[..., 0] = 1.0
    assert content_score(sink, True, fixed).item() == 0.0  # no weight on movable keys at all
    # a sink that looks at the previous token on a few rows is judged on those rows only
    mostly = sink.clone()
    mostly[:, 0, 5:8] = 0.0
    mostly[:, 0, 5:8, 0] = 0.9
    for i in range(5, 8):
        mostly[:, 0, i, i - 1] = 0.1
    assert content_score(mostly, True, fixed).item() == pytest.approx(0.0, abs=1e-6)
    # one sequence alone cannot explain row 5's key 4 by another row at that key position;
    # by offset, rows 6 and 7 do: pooling over rows and sequences is what explains it
    assert content_score(mostly[:1], True, fixed[:1]).item() == pytest.approx(0.0, abs=1e-6)
    # leave-one-out: a pattern seen once, in a row of its own, is not explained by itself
    odd = mostly[:1].clone()
    odd[0, 0, 9] = 0.0
    odd[0, 0, 9, 3] = 1.0  # offset 6 and key 3: no other row looks there
    # at least row 9's whole weight, unexplained, over the 10 rows with two movable keys
    got = content_score(odd, True, fixed[:1]).item()
    assert got == pytest.approx(loop_content(odd, True, fixed[:1])[0], abs=1e-6)
    assert got >= 0.1 - 1e-6


def test_rows_that_barely_look_at_movable_keys_barely_shape_the_profile() -> None:
    """A head resting on the start token on most rows, with a faint random leftover there, and
    on the previous token on the others: the profile is weighted by each row's share on the
    movable keys, so the faint rows neither count nor blur the previous-token profile."""
    g = torch.Generator().manual_seed(4)
    n = 24
    fixed = torch.zeros(2, n, dtype=torch.bool)
    fixed[:, 0] = True
    head = torch.rand(2, 1, n, n, generator=g).tril() * 1e-4
    head[..., 0] = 1.0
    looks = torch.arange(2, n, 3)  # every third row looks at the previous token instead
    head[:, 0, looks] = 0.0
    head[:, 0, looks, looks - 1] = 1.0
    head = head / head.sum(-1, keepdim=True)
    got = content_score(head, True, fixed).item()
    assert got == pytest.approx(loop_content(head, True, fixed)[0], abs=1e-6)
    assert got < 0.01
    # the same faint rows at full strength are a random head, which no profile explains
    loud = torch.rand(2, 1, n, n, generator=g).tril()
    loud[..., 0] = 0.0
    loud = loud / loud.sum(-1, keepdim=True).clamp_min(1e-12)
    assert content_score(loud, True, fixed).item() > 0.2


@pytest.mark.parametrize("causal", [True, False])
def test_a_rule_that_rests_on_an_ordinary_first_token_scores_zero(causal: bool) -> None:
    """Without a start token (a probe of ordinary tokens only, as a model without BOS sees),
    heads still rest on the first position: the previous token plus a rest there is a rule,
    so the first position is never compared, fixed keys given or not."""
    n = 20
    head = torch.zeros(2, 1, n, n)
    for i in range(n):
        head[:, 0, i, 0] += 0.6
        head[:, 0, i, max(i - 1, 0) if causal else (i - 1) % n] += 0.4
    for fixed in (None, torch.zeros(2, n, dtype=torch.bool)):
        got = content_score(head, causal, fixed).item()
        assert got == pytest.approx(0.0, abs=1e-6)
        assert got == pytest.approx(loop_content(head, causal, fixed)[0], abs=1e-6)


def test_a_rest_on_the_start_token_counts_as_explained() -> None:
    """A head that rests 90% on the start token and spreads the rest at random: position
    explains the rest on the start token, so at most the other 10% can be unexplained, and the
    head stays far from the content threshold, where a head reading the same keys at full
    strength passes it."""
    g = torch.Generator().manual_seed(5)
    n = 24
    fixed = torch.zeros(2, n, dtype=torch.bool)
    fixed[:, 0] = True
    logits = torch.randn(2, 1, n, n, generator=g) * 4  # sharp rows, each on its own keys
    logits[..., 0] = -torch.inf
    spread = logits.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), -torch.inf)
    spread = spread.softmax(-1).nan_to_num(0.0)  # row 0 has no movable key: all zeros
    resting = spread * 0.1
    resting[..., 0] += 0.9
    rested = content_score(resting, True, fixed).item()
    assert rested == pytest.approx(loop_content(resting, True, fixed)[0], abs=1e-6)
    assert rested <= 0.1 + 1e-6
    assert content_score(spread, True, fixed).item() > THRESHOLDS["content"] > rested


def test_a_content_heads_rest_is_its_weight_on_the_keys_the_score_leaves_out() -> None:
    """The rest a content head reports is its weight on what the score leaves out: the fixed
    keys and the first position, which counts even where no fixed key is given (a probe of
    ordinary tokens), held to the first-token score computed on its own."""
    from headlab.heads import first_token_score, key_mass_score, pattern_scores
    from headlab.heads.targets import targets_of

    g = torch.Generator().manual_seed(6)
    tokens = torch.randint(0, 9, (2, 18), generator=g)
    A = random_patterns(2, 3, 18, True, g).float()
    _, _, rests = pattern_scores(A, targets_of(tokens, causal=True))
    assert rests["content"].tolist() == pytest.approx(first_token_score(A).tolist(), abs=1e-6)
    fixed = torch.zeros(2, 18, dtype=torch.bool)
    fixed[:, 5] = True
    _, _, rests = pattern_scores(A, targets_of(tokens, causal=True, fixed=fixed))
    left_out = fixed.clone()
    left_out[:, 0] = True
    want = key_mass_score(A, left_out)
    assert rests["content"].tolist() == pytest.approx(want.tolist(), abs=1e-6)


def test_the_masks_shared_across_layers_follow_each_probe() -> None:
    """The keys each query sees are built once per probe and shared by its layers: calls that
    alternate between probes of one shape (other fixed keys, none, the other mask) each get
    their own answer, the one the loop gives."""
    g = torch.Generator().manual_seed(8)
    B, n = 2, 9
    A = random_patterns(B, 2, n, True, g)
    one = torch.zeros(B, n, dtype=torch.bool)
    one[:, 0] = True
    other = one.clone()
    other[1, 4] = True
    for fixed, causal in [(one, True), (other, True), (None, True), (one, False), (one, True)]:
        got = content_score(A, causal, fixed).tolist()
        assert got == pytest.approx(loop_content(A, causal, fixed), abs=1e-6), (fixed, causal)
