"""The vectorised scoring (headlab.heads.scores.pattern_scores on a probe's stacked targets)
against the per-target computation it replaced, kept here as the reference: every score
function called one target at a time, a Python loop over sequences in the positional score,
and the content score as :func:`headlab.heads.content_score` (its own loop oracle is in
test_content_score.py). Random attention patterns, causal and bidirectional, several sequences,
with rare words, delimiters and fixed keys: equal to 1e-6."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

from headlab.heads.scores import content_score, pattern_scores, stacked_masses
from headlab.heads.targets import (
    Targets,
    as_batched,
    duplicate_token_pattern,
    induction_pattern,
    offset_pattern,
    previous_token_pattern,
    rare_word_targets,
    targets_of,
    token_rule_targets,
    visible_keys,
)

# --- the reference: the per-target scoring as it was -----------------------------------------


def reference_mass(weights: Tensor, target: Tensor) -> Tensor:
    """The attention each head puts on its target keys, averaged over the rows that have one:
    weights (B, h, n, s), target (B, n, s) 0/1 → (h,).

    A head type is judged where its behaviour is possible: a row with no target key (the first
    token for a previous-token head, a token never seen before for an induction head) does not
    count. Per sequence the mean over its rows with a target, then the mean over the sequences
    that have any; 0 for a head with no such row at all.
    """
    target = target.to(weights.dtype)
    rows = target.sum(-1) > 0  # (B, n)
    hit = (weights * target[:, None]).sum(-1)  # (B, h, n)
    count = rows.sum(-1)  # (B,)
    per_seq = (hit * rows[:, None]).sum(-1) / count.clamp_min(1)[:, None]  # (B, h)
    valid = count > 0
    if not valid.any():
        return torch.zeros(weights.shape[1])
    return per_seq[valid].double().mean(dim=0).float()


def reference_active(weights: Tensor, target: Tensor) -> Tensor:
    """The target's share of the attention its rows do not put on key 0, one sequence and
    head at a time: Σ over rows with a target of the target mass / Σ of (row total − weight on
    key 0), 0 where that is 0; the mean over sequences with such a row → (h,)."""
    B, h = weights.shape[:2]
    out = torch.zeros(h, dtype=torch.float64)
    seqs = [b for b in range(B) if target[b].sum() > 0]
    for b in seqs:
        rows = target[b].sum(-1) > 0
        for k in range(h):
            A = weights[b, k].double()[rows]
            hit = float((A * target[b][rows].double()).sum())
            active = float(A.sum() - A[:, 0].sum())
            out[k] += min(hit / active, 1.0) if active > 0 else 0.0
    return (out / max(len(seqs), 1)).float()


def pattern_score(weights: Tensor, target: Tensor) -> Tensor:
    """TransformerLens "mul" score Σ(A ⊙ P)/ΣA per head, averaged over the batch.

    weights (B, h, n, s) or (h, n, s); target (n, s) or (B, n, s) of 0/1. Returns (h,).
    A sequence whose head has no attention mass at all (ΣA = 0) scores 0.
    """
    A, _ = as_batched(weights)
    P = target.to(A.dtype)
    if P.dim() == 2:
        P = P.unsqueeze(0)  # (1, n, s)
    hit = torch.einsum("bhns,bns->bh", A, P.expand(A.shape[0], -1, -1))  # (B, h)
    return _ratio(hit, A.sum(dim=(-2, -1)))


def _ratio(hit: Tensor, total: Tensor) -> Tensor:
    """hit / total per (B, h), 0 where total is 0, averaged over the batch → (h,) float32."""
    per_seq = torch.where(total > 0, hit / total.clamp_min(1e-30), torch.zeros_like(hit))
    return per_seq.double().mean(dim=0).float()


# --- TransformerLens's "mul" scores: every query counts; reported, never used for a label -----


def previous_mul_score(weights: Tensor) -> Tensor:
    """Share of attention on the previous token, per head: (B, h, n, s) or (h, n, s) → (h,)."""
    A, _ = as_batched(weights)
    return pattern_score(A, previous_token_pattern(A.shape[-2], A.shape[-1]).to(A.device))


def duplicate_mul_score(weights: Tensor, tokens: Tensor) -> Tensor:
    """Share of attention on earlier copies of the current token, per head → (h,)."""
    A, toks = as_batched(weights, tokens)
    assert toks is not None
    return pattern_score(A, duplicate_token_pattern(toks))


def induction_mul_score(weights: Tensor, tokens: Tensor) -> Tensor:
    """Share of attention on the token after an earlier copy of the current token, over every
    query → (h,): TransformerLens's induction score. Rows with nothing to copy count too, so
    an ideal head scores the share of rows that have a target (about 0.75 on 4 copies)."""
    A, toks = as_batched(weights, tokens)
    assert toks is not None
    return pattern_score(A, induction_pattern(toks))


def mul_scores(weights: Tensor, targets: Targets) -> dict[str, Tensor]:
    """TransformerLens's "mul" scores of weights (B, h, n, n) on a probe's targets."""
    A, _ = as_batched(weights)
    return {
        "previous_mul": previous_mul_score(A),
        "duplicate_mul": pattern_score(A, targets.duplicate_mul),
        "induction_mul": pattern_score(A, targets.induction_mul),
    }


# --- the scores labels are made of -----------------------------------------------------------


def positional_score(
    weights: Tensor, causal: bool, confounded: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """Voita et al. 2019's positional head test: where does each query's maximum attention fall?

    For each head and relative offset δ, the share of the queries that can reach δ (key i + δ
    exists and is visible) whose argmax key is at i + δ; reported for the δ with the most such
    queries. Queries with a single visible key (the first one, under a causal mask) have no
    choice and are left out, and so are offsets reachable from fewer than half the remaining
    queries (a sink on key 0 would otherwise be "perfect" at δ = −(n − 1), reached once).
    ``confounded`` (B, n, s) bool marks (query, key) pairs a token rule also predicts (an
    earlier copy, the token after it): they count neither way, so that on a probe repeated
    with a fixed period an induction head is not mistaken for a head at offset −period + 1
    (Olsson et al. 2022's trap). Pooled over the batch. Returns ``(score (h,), offset (h,))``.
    """
    A, _ = as_batched(weights)
    B, h, n, s = A.shape
    k = visible_keys(n, s, causal)  # (n,)
    i = torch.arange(n)[:, None]
    key = i + torch.arange(-(n - 1), s)[None, :]  # (n, D): the key at each offset δ
    ok = (key >= 0) & (key < k[:, None]) & (k[:, None] >= 2)  # (n, D): reachable, with a choice
    ok = ok.expand(B, n, -1).clone()  # (B, n, D)
    if confounded is not None:
        clash = confounded.gather(2, key.clamp(0, s - 1).expand(B, n, -1))  # (B, n, D)
        ok &= ~clash
    reach = ok.sum(dim=(0, 1))  # (D,): queries that can reach δ
    rel = A.argmax(dim=-1) - i[:, 0] + (n - 1)  # (B, h, n): column of the argmax offset
    counts = torch.zeros(h, n + s - 1, dtype=torch.long)
    for b in range(B):
        valid = ok[b].gather(1, rel[b].T)  # (n, h): the argmax offset is counted
        counts.scatter_add_(1, rel[b], valid.T.long())
    eligible = reach >= max(1.0, float((k >= 2).sum() * B) / 2)
    best = counts.masked_fill(~eligible, -1).argmax(dim=-1)  # (h,)
    score = counts.gather(-1, best[:, None])[:, 0].float() / reach[best].clamp_min(1).float()
    return score, best - (n - 1)


def offset_mass(weights: Tensor, shift: int, causal: bool) -> Tensor:
    """The attention on key i + shift, averaged over the queries that can see that key and
    have another to choose from → (h,): the previous-token (−1), self / current-token (0) and
    next-token (+1) scores where those heads can act (cf. the "mul" scores, which average
    over every query)."""
    A, _ = as_batched(weights)
    n, s = A.shape[-2:]
    k = visible_keys(n, s, causal)  # (n,)
    visible = torch.arange(s)[None, :] < k[:, None]  # (n, s)
    target = offset_pattern(n, s, shift)[0] * visible * (k >= 2)[:, None]  # (n, s)
    return reference_mass(A, target.expand(A.shape[0], -1, -1))


def duplicate_score(weights: Tensor, tokens: Tensor, causal: bool) -> Tensor:
    """The attention on other copies of the current token, averaged over the queries that can
    see one → (h,): the duplicate-token head where it can act. Under a causal mask the copies
    are the earlier ones (TransformerLens's target); a bidirectional head may also look at
    later copies. Keys the induction rule also predicts are left out (:func:`token_rule_targets`).
    """
    A, toks = as_batched(weights, tokens)
    assert toks is not None
    return reference_mass(A, token_rule_targets(toks, causal)[1])


def induction_score(weights: Tensor, tokens: Tensor) -> Tensor:
    """The induction score headlab labels by, quotes and draws: Olsson et al. 2022's prefix
    matching (for every query whose token occurred before, the attention on the tokens right
    after those earlier occurrences, averaged over such queries only), with the keys that are
    also copies of the query's token left out (:func:`token_rule_targets`) → (h,).

    An ideal induction head scores 1; on distinct repeated tokens (Olsson et al.'s probe) no key
    is both, and this is their prefix-matching score exactly. TransformerLens's score, which
    counts every query, is :func:`induction_mul_score`.
    """
    A, toks = as_batched(weights, tokens)
    assert toks is not None
    return reference_mass(A, token_rule_targets(toks, causal=True)[0])


def rare_word_score(weights: Tensor, rare: Tensor, rows: Tensor) -> Tensor:
    """Voita et al. 2019's rare-word head: the share of queries whose most-attended key is the
    sequence's least frequent word → (h,).

    weights (B, h, n, s); rare (B, s) bool marks the pieces of the least frequent word(s);
    rows (B, n) bool the queries where such a head can act (see :func:`rare_word_targets`).
    Per sequence the share of its rows, then the mean over sequences that have any.
    """
    A, _ = as_batched(weights)
    hit = rare.gather(1, A.argmax(dim=-1).flatten(1)).view(A.shape[:3])  # (B, h, n)
    count = rows.sum(-1)  # (B,)
    per_seq = (hit & rows[:, None]).sum(-1) / count.clamp_min(1)[:, None]  # (B, h)
    valid = count > 0
    if not valid.any():
        return torch.zeros(A.shape[1])
    return per_seq[valid].double().mean(dim=0).float()


def key_mass_score(weights: Tensor, keys: Tensor) -> Tensor:
    """Mean over queries of the attention on the marked keys: weights → (h,), keys (B, s) bool.

    The first-token score marks key 0 (BOS, [CLS]); the delimiter score marks special tokens
    and punctuation after position 0. Both are the "mul" score with P[i, j] = keys[j].
    """
    A, _ = as_batched(weights)
    if keys.dim() == 1:
        keys = keys.unsqueeze(0)
    mass = A.sum(dim=-2)  # (B, h, s): attention each key receives, summed over queries
    hit = (mass * keys[:, None, :].to(A.device, A.dtype)).sum(-1)  # (B, h)
    return _ratio(hit, mass.sum(-1))


def first_token_score(weights: Tensor) -> Tensor:
    """Share of attention on position 0 (BOS / [CLS], an attention sink) → (h,)."""
    A, _ = as_batched(weights)
    keys = torch.zeros(A.shape[0], A.shape[-1], dtype=torch.bool)
    keys[:, 0] = True
    return key_mass_score(A, keys)


def diffuse_score(weights: Tensor, causal: bool) -> Tensor:
    """Normalised entropy H(A_i) / log(k_i), averaged over queries with k_i ≥ 2 keys → (h,).

    k_i is the number of keys query i could attend to (all keys, or j ≤ i plus the cached keys
    under a causal mask). 1 means uniform attention: an averaging head.
    """
    A, _ = as_batched(weights)
    h, n, s = A.shape[1:]
    k = visible_keys(n, s, causal).to(A.dtype)
    entropy = -torch.special.xlogy(A, A).sum(-1)  # (B, h, n); 0 · log 0 = 0
    rows = k >= 2
    norm = entropy[..., rows] / k[rows].log()  # (B, h, rows)
    return norm.mean(dim=(0, 2)).float() if rows.any() else torch.zeros(h)


def resting_weight(weights: Tensor, idle: Tensor) -> Tensor:
    """The mean weight on the first token over the rows marked ``idle`` (B, n) → (h,)."""
    return reference_mass(weights[..., :1], idle[..., None])  # key 0 only: (B, h, n, 1)


def reference_pattern_scores(
    weights: Tensor, targets: Targets, content: bool = True
) -> tuple[dict[str, Tensor], Tensor, dict[str, Tensor]]:
    """Every score of a set of heads: weights (B, h, n, n) on the probe whose ``targets``
    (:func:`headlab.heads.targets.build_targets`) were built once for it.

    ``content`` adds :func:`content_score`, and the targets' rare words
    :func:`rare_word_score`; without them "content" and "rare_word" are left out. Pure in the
    weights of one layer, so a caller may score layer by layer. Returns
    ``({type: (h,)}, offsets (h,), {type: where the head rests off its rows (h,)})``.
    """
    A, _ = as_batched(weights, targets.tokens)
    causal, t = targets.causal, targets
    positional, offsets = positional_score(A, causal, confounded=t.token_rules)
    scores = {
        "previous": offset_mass(A, -1, causal),
        **({} if causal else {"next": offset_mass(A, 1, causal)}),  # nothing to see when causal
        "self": offset_mass(A, 0, causal),
        "positional": positional,
        "duplicate": reference_mass(A, t.duplicate),
        "induction": reference_mass(A, t.induction),
        "induction_active": reference_active(A, t.induction),
    }
    rests = {
        "duplicate": resting_weight(A, ~t.duplicate_rows),
        "induction": resting_weight(A, ~t.induction_rows),
    }
    if content:
        scores["content"] = content_score(A, causal, t.fixed)
        left_out = t.fixed.clone()  # the keys the content score leaves out: these and the first
        left_out[:, 0] = True
        rests["content"] = key_mass_score(A, left_out)
    if t.rare is not None:
        scores["rare_word"] = rare_word_score(A, *t.rare)
        rests["rare_word"] = resting_weight(A, ~t.rare[1])
    scores["first_token"] = first_token_score(A)
    scores["delimiter"] = key_mass_score(A, t.delimiters)
    scores["diffuse"] = diffuse_score(A, causal)
    return {**scores, **mul_scores(A, t)}, offsets, rests


# --- the tests -------------------------------------------------------------------------------


def random_case(B: int, h: int, n: int, causal: bool, seed: int):
    """Random patterns (sharp and flat rows, a head with a dead row) on random tokens with
    repeats, and the targets of a probe with delimiters, fixed keys and a rare word per
    sequence."""
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, max(3, n // 3), (B, n), generator=g)
    scale = torch.rand(B, h, 1, 1, generator=g) * 6
    logits = torch.randn(B, h, n, n, generator=g) * scale
    if causal:
        logits = logits.masked_fill(~torch.ones(n, n, dtype=torch.bool).tril(), float("-inf"))
    weights = logits.softmax(-1)
    weights[0, 0, n // 2] = 0.0  # a row with no attention mass at all
    movable = torch.rand(B, n, generator=g) > 0.15
    movable[:, 0] = False
    delimiters = torch.rand(B, n, generator=g) > 0.8
    word_index = torch.arange(n)[None].expand(B, n) - 1
    zipf = [[float(torch.rand(1, generator=g)) * 5 for _ in range(n - 1)] for _ in range(B)]
    rare = rare_word_targets(word_index, zipf, causal)
    targets = targets_of(tokens, causal, delimiters, ~movable, rare)
    return weights, targets


CASES = [
    (1, 4, 9, True, 0),
    (2, 5, 17, False, 1),
    (3, 3, 30, True, 2),
    (1, 12, 64, False, 3),
    (2, 7, 40, True, 4),
    (1, 2, 2, True, 5),
]


@pytest.mark.parametrize(("B", "h", "n", "causal", "seed"), CASES)
def test_vectorised_scores_equal_the_per_target_reference(B, h, n, causal, seed):
    A, targets = random_case(B, h, n, causal, seed)
    scores, offsets, rests = pattern_scores(A, targets)
    want, want_offsets, want_rests = reference_pattern_scores(A, targets)
    assert scores.keys() == want.keys() and rests.keys() == want_rests.keys()
    for got, ref in ((scores, want), (rests, want_rests)):
        for kind in ref:
            assert torch.allclose(got[kind], ref[kind], rtol=0, atol=1e-6), kind
    assert torch.equal(offsets, want_offsets)


def test_a_probe_without_rare_words_or_content_leaves_them_out():
    A, t = random_case(2, 3, 12, True, 6)
    plain = targets_of(t.tokens, True)
    scores, _, rests = pattern_scores(A, plain, content=False)
    want, _, want_rests = reference_pattern_scores(A, plain, content=False)
    assert scores.keys() == want.keys() and "content" not in scores and "rare_word" not in scores
    for kind in want:
        assert torch.allclose(scores[kind], want[kind], rtol=0, atol=1e-6), kind
    assert rests.keys() == want_rests.keys()


def test_a_type_with_no_row_anywhere_scores_zero():
    """Distinct tokens: no induction or duplicate row in any sequence, so those score 0 and
    the head rests wherever it looks on every row (the reference's zeros)."""
    tokens = torch.arange(10).repeat(2, 1)
    A = torch.rand(2, 3, 10, 10).tril().softmax(-1)
    masses = stacked_masses(A, targets_of(tokens, True).stack)
    assert torch.equal(masses["induction"], torch.zeros(3))
    assert torch.equal(masses["duplicate"], torch.zeros(3))
    assert torch.allclose(
        masses["rest:induction"], reference_mass(A[..., :1], torch.ones(2, 10, 1)), atol=1e-6
    )


def test_double_precision_weights_are_scored_too():
    """The stacked targets are float32; weights in float64 are scored all the same."""
    A, targets = random_case(2, 3, 12, True, 7)
    got = pattern_scores(A.double(), targets)[0]
    want = reference_pattern_scores(A.double(), targets)[0]
    for kind in want:
        assert torch.allclose(got[kind].double(), want[kind].double(), atol=1e-6), kind


@pytest.mark.parametrize("threads", [1, 2, 5])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("n", [9, 126, 200])
def test_the_argmax_the_scores_read_picks_the_first_of_equal_maxima(dtype, n, threads):
    """The positional and rare-word scores read each query's argmax key from compiled loops
    (float32 on the CPU; argmax itself otherwise): equal to torch's argmax (the first of equal
    maxima) on rows full of ties: uniform rows, rows of zeros, one-hot rows, maxima repeated at
    random places, a hair apart, and a NaN; on PyTorch's threads or the caller's alone."""
    from headlab.heads.scores import _first_argmax

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        g = torch.Generator().manual_seed(11 + n)
        A = torch.randint(0, 3, (2, 3, 4, n), generator=g).to(dtype) / 4  # many ties
        A[0, 0] = 1 / n  # uniform rows
        A[0, 1] = 0.0  # no weight anywhere
        A[1, 2, :, 5] = 1.0  # one key
        A[1, 0, :, 7] = torch.nextafter(A[1, 0, :, 7].amax(), torch.tensor(2.0, dtype=dtype))
        A[1, 0, :, 3] = A[1, 0, :, 7]  # the same maximum earlier in the row
        half = torch.tensor(0.5, dtype=dtype)
        A[1, 1, :, 4] = torch.nextafter(half, torch.tensor(0.0, dtype=dtype))
        A[1, 1, :, 8] = 0.5  # a larger maximum a hair above, later in the row
        A[0, 2, 1, 6] = float("nan")  # a broken row: its first NaN, as argmax says
        assert torch.equal(_first_argmax(A), A.argmax(-1))
        B = torch.rand(2, 2, 3, n, generator=g, dtype=dtype)
        assert torch.equal(_first_argmax(B), B.argmax(-1))
        assert torch.equal(_first_argmax(B.transpose(1, 2)), B.transpose(1, 2).argmax(-1))
        with pytest.raises((ValueError, IndexError)):  # no keys: no argmax, as torch says
            _first_argmax(torch.zeros(1, 2, 3, 0, dtype=dtype))
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("threads", [1, 2])
def test_the_entropy_the_diffuse_score_reads_equals_float64_logs(threads):
    """Each row's Σ A log A from the compiled loops (their own float32 log) against float64
    PyTorch on rows of sharp, flat and zero weights, weights below the least normal float
    among them (taken as it, so 0 · log = 0), and rows of every length up to 300 keys; and
    the diffuse score of float32 weights (the loops) equals that of float64 (PyTorch)."""
    from headlab.heads.scores import _row_stats

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        g = torch.Generator().manual_seed(13)
        for n in (1, 2, 7, 126, 300):
            A = torch.rand(2, 3, 5, n, generator=g) ** torch.tensor([1.0, 8.0, 40.0])[:, None, None]
            A[0, 0, 0] = 0.0  # a row of zeros
            A[0, 1, 1, 0] = 1e-41  # a subnormal weight
            A[1, 2] /= A[1, 2].sum(-1, keepdim=True)  # softmax-like rows
            A = A.float()
            _, plogp = _row_stats(A)
            A64 = A.double()
            want = (A64.clamp_min(torch.finfo(torch.float32).tiny).log() * A64).sum(-1)
            assert torch.allclose(plogp.double(), want, rtol=2e-6, atol=2e-6), n
        for causal in (True, False):
            A = torch.rand(2, 4, 40, 40, generator=g) ** 6
            if causal:
                A = A.tril()
            A = A / A.sum(-1, keepdim=True)
            got = diffuse_score(A.float(), causal).double()
            want = diffuse_score(A.double(), causal).double()
            assert torch.allclose(got, want, atol=1e-6), causal
    finally:
        torch.set_num_threads(before)
