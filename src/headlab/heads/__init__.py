"""Head scores and labels: how much each attention head looks like a known head type.

Shape legend
    B   batch (probe sequences); scores are averaged over it
    h   heads (of one layer, or all layers' heads stacked)
    n   query positions; s key positions (s == n: analysis runs without a cache)

Every score is in [0, 1]; docs/heads.md has the full reference. A is one head's pattern (rows sum
to 1), t the token ids. Each type is judged on the rows where it can act (a query with a choice
of keys and a target), its threshold below:

    previous     attention on i − 1                                0.5   Voita 2019
    next         attention on i + 1 (left out under a causal mask)  0.5   Clark 2019
    self         attention on i itself                             0.5
    duplicate    attention on other copies of t[i]                 0.5   Wang 2022
    induction    attention on the token after an earlier copy of t[i]: prefix matching,
                 over the queries whose token occurred before      0.5   Olsson 2022
                 (a key both rules predict, as in a run "x x x", counts for neither)
    positional   share of queries (that can reach i + δ) whose argmax is i + δ, for the
                 most common δ; pairs a token rule predicts left out     0.9   Voita 2019
    content      how much the pattern follows the tokens, not the positions, when they are
                 shuffled (headlab's definition, :func:`content_score`)    0.3
    rare_word    share of queries whose argmax is the sentence's least frequent word  0.5
    syntactic    margin over the best fixed-offset baseline on a dependency relation
                 (from :mod:`headlab.heads.syntax`)                      0.1   Voita 2019
    first_token  mean weight on the first token: an attention sink  0.5   Xiao 2023, Gu 2024
    delimiter    mean weight on special tokens after 0 and punctuation   0.5   Clark 2019
    diffuse      mean_i H(A_i) / log k_i, k_i the keys query i may see  0.9
TransformerLens's "mul" scores, Σ_ij A_ij P_ij / Σ_ij A_ij over every query, are kept as
previous_mul, duplicate_mul and induction_mul (never used for a label).
Label (:func:`label_head`): tier by tier — a named rule, then content, then where the head
rests (sink, delimiter, diffuse) — the type passing its threshold by the widest share of the way
to a perfect score; else "mixed". A positional head is named by its offset (−1 previous-token,
0 current-token, +1 next-token).

Papers: Voita et al. 2019; Clark et al. 2019; Olsson et al. 2022; Wang et al. 2022; Xiao et al.
2023; Gu et al. 2024; TransformerLens (Nanda and Bloom 2022).
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import Tensor

from headlab.measure import mass_where_possible


def _as_batched(weights: Tensor, tokens: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
    """Normalise (h, n, s) → (1, h, n, s) and (n,) → (1, n); check that they agree."""
    if weights.dim() == 3:
        weights = weights.unsqueeze(0)
    if weights.dim() != 4:
        raise ValueError(
            f"weights must be (B, h, n, s) or (h, n, s), got shape {tuple(weights.shape)}"
        )
    if tokens is not None:
        if tokens.dim() == 1:
            tokens = tokens.unsqueeze(0)
        B, n = weights.shape[0], weights.shape[2]
        if tokens.dim() != 2 or tokens.shape != (B, n):
            raise ValueError(
                f"tokens of shape {tuple(tokens.shape)} do not match weights "
                f"{tuple(weights.shape)}; expected (B, n) = ({B}, {n}) or ({n},) when B = 1"
            )
    return weights, tokens


def pattern_score(weights: Tensor, target: Tensor) -> Tensor:
    """TransformerLens "mul" score Σ(A ⊙ P)/ΣA per head, averaged over the batch.

    weights (B, h, n, s) or (h, n, s); target (n, s) or (B, n, s) of 0/1. Returns (h,).
    A sequence whose head has no attention mass at all (ΣA = 0) scores 0.
    """
    A, _ = _as_batched(weights)
    P = target.to(A.dtype)
    if P.dim() == 2:
        P = P.unsqueeze(0)  # (1, n, s)
    hit = torch.einsum("bhns,bns->bh", A, P.expand(A.shape[0], -1, -1))  # (B, h)
    return _ratio(hit, A.sum(dim=(-2, -1)))


def _ratio(hit: Tensor, total: Tensor) -> Tensor:
    """hit / total per (B, h), 0 where total is 0, averaged over the batch → (h,) float32."""
    per_seq = torch.where(total > 0, hit / total.clamp_min(1e-30), torch.zeros_like(hit))
    return per_seq.double().mean(dim=0).float()


def previous_token_pattern(n: int, s: int | None = None) -> Tensor:
    """(n, s) 0/1 target: query i → key i − 1."""
    s = n if s is None else s
    i = torch.arange(n)[:, None]
    j = torch.arange(s)[None, :]
    return (j == i - 1).float()  # (n, s)


def duplicate_token_pattern(tokens: Tensor) -> Tensor:
    """(B, n, n) 0/1 target from tokens (B, n): query i → every earlier j with the same token."""
    same = tokens[:, :, None] == tokens[:, None, :]  # (B, n, n)
    return torch.tril(same.float(), diagonal=-1)


def induction_pattern(tokens: Tensor) -> Tensor:
    """(B, n, n) 0/1 target: query i → key j when tokens[j − 1] == tokens[i] and j − 1 < i.

    The duplicate-token pattern shifted one key to the right (Olsson et al. 2022).
    """
    dup = duplicate_token_pattern(tokens)  # (B, n, n)
    shifted = torch.zeros_like(dup)
    shifted[:, :, 1:] = dup[:, :, :-1]
    return shifted


def previous_token_score(weights: Tensor) -> Tensor:
    """Share of attention on the previous token, per head: (B, h, n, s) or (h, n, s) → (h,)."""
    A, _ = _as_batched(weights)
    return pattern_score(A, previous_token_pattern(A.shape[-2], A.shape[-1]).to(A.device))


def duplicate_token_score(weights: Tensor, tokens: Tensor) -> Tensor:
    """Share of attention on earlier copies of the current token, per head → (h,)."""
    A, toks = _as_batched(weights, tokens)
    assert toks is not None
    return pattern_score(A, duplicate_token_pattern(toks))


def induction_score(weights: Tensor, tokens: Tensor) -> Tensor:
    """Share of attention on the token after an earlier copy of the current token → (h,).

    On repeated random tokens this is the prefix-matching score of Olsson et al. 2022.
    """
    A, toks = _as_batched(weights, tokens)
    assert toks is not None
    return pattern_score(A, induction_pattern(toks))


def next_token_score(weights: Tensor) -> Tensor:
    """Share of attention on the next token (i → i + 1), per head → (h,). Zero when causal."""
    A, _ = _as_batched(weights)
    n, s = A.shape[-2], A.shape[-1]
    i, j = torch.arange(n)[:, None], torch.arange(s)[None, :]
    return pattern_score(A, (j == i + 1).float().to(A.device))


def _visible_keys(A: Tensor) -> Tensor:
    """(n,) the number of keys each query may see: i + 1 (plus cached keys) under a causal
    mask, detected from an all-zero upper triangle, else every key."""
    n, s = A.shape[-2], A.shape[-1]
    causal = bool((torch.triu(A, diagonal=1 + s - n) == 0).all())
    return torch.arange(1, n + 1) + (s - n) if causal else torch.full((n,), s)


def positional_score(weights: Tensor, confounded: Tensor | None = None) -> tuple[Tensor, Tensor]:
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
    A, _ = _as_batched(weights)
    B, h, n, s = A.shape
    k = _visible_keys(A)  # (n,)
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


def offset_pattern(A: Tensor, shift: int) -> Tensor:
    """(1, n, s) 0/1 target: query i → key i + shift (−1 previous, 0 itself, +1 next)."""
    n, s = A.shape[-2], A.shape[-1]
    i, j = torch.arange(n)[:, None], torch.arange(s)[None, :]
    return (j == i + shift + (s - n)).float()[None]  # (1, n, s)


def offset_mass(weights: Tensor, shift: int) -> Tensor:
    """The attention on key i + shift, averaged over the queries that can see that key and
    have another to choose from → (h,): the previous-token (−1), self / current-token (0) and
    next-token (+1) scores where those heads can act (cf. the "mul" scores, which average
    over every query)."""
    A, _ = _as_batched(weights)
    k = _visible_keys(A)  # (n,)
    visible = torch.arange(A.shape[-1])[None, :] < k[:, None]  # (n, s)
    target = offset_pattern(A, shift)[0] * visible * (k >= 2)[:, None]  # (n, s)
    return mass_where_possible(A, target.expand(A.shape[0], -1, -1))


def copies_pattern(tokens: Tensor) -> Tensor:
    """(B, n, n) 0/1: query i → every other position j holding the same token, on either side."""
    same = tokens[:, :, None] == tokens[:, None, :]  # (B, n, n)
    return (same & ~torch.eye(tokens.shape[1], dtype=torch.bool)).float()


def token_rule_targets(tokens: Tensor, causal: bool) -> tuple[Tensor, Tensor]:
    """``(induction, duplicate)`` targets, each (B, n, n) 0/1, with the keys both rules predict
    left out of both.

    induction: the token right after an earlier copy of the query's token (Olsson et al.);
    duplicate: another copy of it (an earlier one under a causal mask). In a run of one token
    ("x x x") the key after an earlier copy *is* a copy, and may be the query itself: such a
    key tells neither rule from the other (nor from a current-token head), so it counts for
    neither; a query left with no target is a row where the head cannot be judged.
    """
    same = tokens[:, :, None] == tokens[:, None, :]  # (B, n, n), the diagonal included
    induction = induction_pattern(tokens) > 0
    duplicate = (duplicate_token_pattern(tokens) if causal else copies_pattern(tokens)) > 0
    return (induction & ~same).float(), (duplicate & ~induction).float()


def duplicate_where_possible(weights: Tensor, tokens: Tensor) -> Tensor:
    """The attention on other copies of the current token, averaged over the queries that can
    see one → (h,): the duplicate-token head where it can act. Under a causal mask (detected)
    the copies are the earlier ones (TransformerLens's target); a bidirectional head may also
    look at later copies. Keys the induction rule also predicts are left out
    (:func:`token_rule_targets`)."""
    A, toks = _as_batched(weights, tokens)
    assert toks is not None
    causal = bool((torch.triu(A, diagonal=1) == 0).all())
    return mass_where_possible(A, token_rule_targets(toks, causal)[1])


def induction_where_possible(weights: Tensor, tokens: Tensor) -> Tensor:
    """Olsson et al. 2022's prefix matching (:func:`headlab.measure.prefix_matching`) with the
    keys that are also copies of the query's token left out (:func:`token_rule_targets`) → (h,).
    On distinct repeated tokens (Olsson et al.'s probe) the two are the same number."""
    A, toks = _as_batched(weights, tokens)
    assert toks is not None
    return mass_where_possible(A, token_rule_targets(toks, causal=True)[0])


def rare_word_score(weights: Tensor, rare: Tensor, rows: Tensor) -> Tensor:
    """Voita et al. 2019's rare-word head: the share of queries whose most-attended key is the
    sequence's least frequent word → (h,).

    weights (B, h, n, s); rare (B, s) bool marks the pieces of the least frequent word(s);
    rows (B, n) bool the queries where such a head can act (see :func:`rare_word_targets`).
    Per sequence the share of its rows, then the mean over sequences that have any.
    """
    A, _ = _as_batched(weights)
    hit = rare.gather(1, A.argmax(dim=-1).flatten(1)).view(A.shape[:3])  # (B, h, n)
    count = rows.sum(-1)  # (B,)
    per_seq = (hit & rows[:, None]).sum(-1) / count.clamp_min(1)[:, None]  # (B, h)
    valid = count > 0
    if not valid.any():
        return torch.zeros(A.shape[1])
    return per_seq[valid].double().mean(dim=0).float()


def rare_word_targets(
    word_index: Tensor, zipf: list[list[float]], causal: bool
) -> tuple[Tensor, Tensor]:
    """``(rare (B, n), rows (B, n))`` for :func:`rare_word_score`.

    word_index (B, n): each token's word (−1 special); zipf: per sequence, each word's
    frequency on the Zipf scale (log10 per billion words; NaN for punctuation, which is not a
    word). The rare keys are the pieces of the word(s) with the lowest frequency; a query can
    act when it is an ordinary token outside that word that can see one of its pieces (any,
    or an earlier one under a causal mask).
    """
    B, n = word_index.shape
    rare = torch.zeros(B, n, dtype=torch.bool)
    for b in range(B):
        freq = torch.tensor(zipf[b], dtype=torch.float64)
        if freq.numel() == 0 or bool(freq.isnan().all()):
            continue
        lowest = freq.nan_to_num(nan=float("inf")).min()
        words = (freq == lowest).nonzero()[:, 0]
        rare[b] = torch.isin(word_index[b], words) & (word_index[b] >= 0)
    seen = rare.long().cumsum(-1) > 0 if causal else rare.any(-1, keepdim=True).expand(B, n)
    rows = seen & ~rare & (word_index >= 0)
    return rare, rows


def key_mass_score(weights: Tensor, keys: Tensor) -> Tensor:
    """Mean over queries of the attention on the marked keys: weights → (h,), keys (B, s) bool.

    The first-token score marks key 0 (BOS, [CLS]); the delimiter score marks special tokens
    and punctuation after position 0. Both are the "mul" score with P[i, j] = keys[j].
    """
    A, _ = _as_batched(weights)
    if keys.dim() == 1:
        keys = keys.unsqueeze(0)
    mass = A.sum(dim=-2)  # (B, h, s): attention each key receives, summed over queries
    hit = (mass * keys[:, None, :].to(A.device, A.dtype)).sum(-1)  # (B, h)
    return _ratio(hit, mass.sum(-1))


def first_token_score(weights: Tensor) -> Tensor:
    """Share of attention on position 0 (BOS / [CLS], an attention sink) → (h,)."""
    A, _ = _as_batched(weights)
    keys = torch.zeros(A.shape[0], A.shape[-1], dtype=torch.bool)
    keys[:, 0] = True
    return key_mass_score(A, keys)


def diffuse_score(weights: Tensor) -> Tensor:
    """Normalised entropy H(A_i) / log(k_i), averaged over queries with k_i ≥ 2 keys → (h,).

    k_i is the number of keys query i could attend to (its nonzero-able keys: all keys, or
    j ≤ i under a causal mask, detected from the upper triangle being exactly zero). 1 means
    uniform attention: an averaging head.
    """
    A, _ = _as_batched(weights)
    h, n, s = A.shape[1:]
    causal = bool((torch.triu(A, diagonal=1 + s - n) == 0).all())
    k = torch.arange(1, n + 1, dtype=A.dtype) + (s - n) if causal else torch.full((n,), float(s))
    entropy = -torch.special.xlogy(A, A).sum(-1)  # (B, h, n); 0 · log 0 = 0
    rows = k >= 2
    norm = entropy[..., rows] / k[rows].log()  # (B, h, rows)
    return norm.mean(dim=(0, 2)).float() if rows.any() else torch.zeros(h)


def content_score(
    weights: Tensor,
    shuffled: Tensor,
    order: Tensor,
    causal: bool | None = None,
    fixed: Tensor | None = None,
    tokens: Tensor | None = None,
) -> Tensor:
    """How much a head's pattern follows the tokens, not the positions, when they are shuffled.

    weights (B, h, n, n) on the original tokens; shuffled (B, h, n, n) on the same tokens
    reordered so that new position p holds the token from old position order[b, p]; fixed
    (B, n) bool marks the keys the shuffle never moves (BOS, [CLS], [SEP]). Map the shuffled
    pattern back to the old positions (back[i, j] = shuffled[σ⁻¹(i), σ⁻¹(j)]) and compare each
    query's row with overlap(p, q) = Σ_j min(p_j, q_j) ∈ [0, 1], both rows renormalised on
    the keys compared:

        by_token_i    = overlap(A_i, back_i) on K_i, the movable keys query i sees in both orders
        by_position_i = overlap(A_i, S_i) on the movable keys it sees
        content = Σ_i w_i · max(0, by_token_i − by_position_i) / Σ_i w_i,
        w_i = min(A_i(K_i), back_i(K_i)), the share of both rows that falls on K_i

    A head that attends by token identity keeps its pattern in token space (high first term,
    low second); a positional head keeps it in position space (the reverse); a uniform head
    is unchanged either way and scores 0. Attention on a fixed key agrees in both spaces
    whatever the head does, so it is left out: a head resting on the first token scores 0
    there (w_i ≈ 0) and is judged on the rows where it looks elsewhere. Returns (h,).

    Without a mask and with no fixed keys, K_i holds every key, w_i = 1 and the score is
    mean_i max(0, overlap(A_i, back_i) − overlap(A_i, S_i)). ``causal`` is detected from an
    all-zero upper triangle when None.
    """
    A, _ = _as_batched(weights)
    S, _ = _as_batched(shuffled)
    inverse = order.argsort(dim=-1)  # (B, n): old position → new position
    B, h, n, _ = A.shape
    idx = inverse[:, None, :].expand(B, h, n)
    back = S.gather(2, idx[..., None].expand(B, h, n, n))  # rows to old query order
    back = back.gather(3, idx[:, :, None, :].expand(B, h, n, n))  # columns to old key order
    if causal is None:
        causal = bool((torch.triu(A, diagonal=1) == 0).all() and (torch.triu(S, 1) == 0).all())
    pos = torch.arange(n, device=A.device)
    free = torch.ones(B, n, dtype=torch.bool) if fixed is None else ~fixed.bool()
    free = free[:, None, :].expand(B, n, n)  # (B, n, n): key j is movable
    seen = free & (pos[:, None] >= pos[None, :]) if causal else free  # keys ≤ i, movable
    both = seen & (inverse[:, :, None] >= inverse[:, None, :]) if causal else seen  # K_i
    by_position, _ = _overlap(A, S, seen[:, None].to(A.dtype))
    by_token, w = _overlap(A, back, both[:, None].to(A.dtype), tokens)
    gap = (by_token - by_position).clamp_min(0)
    per_seq = (w * gap).sum(-1) / w.sum(-1).clamp_min(1e-12)  # (B, h)
    return per_seq.mean(dim=0).float()


def _overlap(
    p: Tensor, q: Tensor, keys: Tensor, tokens: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """Σ_j min(p̂_j, q̂_j) of two rows renormalised on ``keys``, and min(p(keys), q(keys)):
    p, q (B, h, n, s), keys (B, 1, n, s) 0/1 → two (B, h, n). With ``tokens`` (B, s) the
    rows are compared over token ids (each id's keys pooled), not over key positions."""
    a, b = p * keys, q * keys
    if tokens is not None:
        ids = torch.unique(tokens, return_inverse=True)[1]  # (B, s): 0 … distinct − 1
        one_hot = torch.nn.functional.one_hot(ids).to(p.dtype)  # (B, s, distinct)
        a = torch.einsum("bhns,bsv->bhnv", a, one_hot)
        b = torch.einsum("bhns,bsv->bhnv", b, one_hot)
    mass_a, mass_b = a.sum(-1, keepdim=True), b.sum(-1, keepdim=True)  # (B, h, n, 1)
    overlap = torch.minimum(a / mass_a.clamp_min(1e-12), b / mass_b.clamp_min(1e-12)).sum(-1)
    return overlap, torch.minimum(mass_a, mass_b)[..., 0]


def averaged_pattern(weights: Tensor) -> Tensor:
    """The "averaged head" of a layer: the mean of its heads' patterns, (B, h, n, s) → (B, n, s).

    Shown next to the real heads, it is what single-pattern attention visualisations lose:
    distinct previous-token, sink and content heads blur into one smeared map.
    """
    A, _ = _as_batched(weights)
    return A.mean(dim=1)


# --- every head of a model, scored and labelled -------------------------------------------------

SCORE_TYPES = (
    "previous",
    "next",
    "self",
    "positional",
    "duplicate",
    "induction",
    "content",
    "rare_word",
    "syntactic",
    "first_token",
    "delimiter",
    "diffuse",
)
# TransformerLens's head detector ("mul", exclude_bos=False, exclude_current_token=False):
# reported under their own names, never used for labels
MUL_TYPES = ("previous_mul", "duplicate_mul", "induction_mul")

# Mass scores are shares of attention over the rows where a type can act, so 0.5 means "most
# of it"; positional is Voita et al.'s 90% of queries; syntactic is Voita et al.'s 10 points
# over the best fixed-offset baseline; content asks for a clear gap between the token and
# position explanations; diffuse for nearly uniform rows.
THRESHOLDS: dict[str, float] = {
    "previous": 0.5,
    "next": 0.5,
    "self": 0.5,
    "positional": 0.9,
    "duplicate": 0.5,
    "induction": 0.5,
    "content": 0.3,
    "rare_word": 0.5,
    "syntactic": 0.1,
    "first_token": 0.5,
    "delimiter": 0.5,
    "diffuse": 0.9,
}
SINK_THRESHOLD = 0.3  # Gu et al. 2024's ε: a head whose mean weight on the first token exceeds it

# Labels go tier by tier: what a head does where it acts by a named rule, then "follows the
# tokens" with no named rule, then where it rests (the first token, a delimiter, everywhere).
TIERS = (
    ("previous", "next", "self", "positional", "duplicate", "induction", "rare_word", "syntactic"),
    ("content",),
    ("first_token", "delimiter", "diffuse"),
)
LABELS = {
    "previous": "previous-token",
    "next": "next-token",
    "self": "current-token",
    "positional": "positional",
    "duplicate": "duplicate-token",
    "induction": "induction",
    "content": "content",
    "rare_word": "rare-word",
    "syntactic": "syntactic",
    "first_token": "sink",
    "delimiter": "delimiter",
    "diffuse": "diffuse",
}
OFFSET_LABELS = {-1: "previous-token", 0: "current-token", 1: "next-token"}


@dataclass(frozen=True)
class HeadScore:
    """One head's scores on a probe, and its label."""

    layer: int
    head: int
    label: str  # a LABELS value, or "mixed" when no score passes its threshold
    scores: dict[str, float]  # SCORE_TYPES (those measured) and MUL_TYPES → value in [0, 1]
    offset: int  # the relative offset of the positional score (e.g. −1 = previous token)
    # where the head rests on the rows its label's score leaves out: the mean weight on the
    # first token there (induction, duplicate-token, rare-word), or on the keys a shuffle
    # cannot move (content); None for the other labels
    rest: float | None = None
    relation: str = ""  # the dependency relation of the syntactic score, when measured

    def to_dict(self) -> dict:
        out = {
            "layer": self.layer,
            "head": self.head,
            "label": self.label,
            "offset": self.offset,
            "scores": {k: round(v, 4) for k, v in self.scores.items()},
            "rest": None if self.rest is None else round(self.rest, 4),
        }
        if self.relation:
            out["relation"] = self.relation
        return out


# The page's head types → the score that picks the best head of that type.
BEST_TYPES = {
    "previous-token": "previous",
    "positional": "positional",
    "current-token": "self",
    "induction": "induction",
    "duplicate-token": "duplicate",
    "content": "content",
    "rare-word": "rare_word",
    "syntactic": "syntactic",
    "sink": "first_token",
}


@dataclass(frozen=True)
class HeadReport:
    """Every head of a model on one probe (see :func:`analyse`).

    ``patterns`` and ``averaged_patterns`` hold the first probe sequence's weights when every
    head's pattern was kept (the default); an analysis that keeps only some heads' patterns
    (``analyse(keep=…)``, for long inputs) leaves them None and puts those in ``selected``.
    :meth:`pattern` reads either. The scores are averaged over every sequence of the probe.
    """

    probe: str
    tokens: list[str]  # display labels of the first sequence
    ids: list[int]  # its token ids
    heads: list[HeadScore]  # layer-major order
    patterns: Tensor | None  # (L, h, n, n): each head's weights on the first sequence
    averaged_patterns: Tensor | None  # (L, n, n): each layer's averaged head on it
    averaged: list[HeadScore]  # per layer, the averaged head scored the same way (head = −1)
    text: str = ""  # the text of a text probe
    # (layer, head) → (n, n) pattern of the heads asked for by analyse(keep=…); head −1 = averaged
    selected: dict[tuple[int, int], Tensor] = field(default_factory=dict)
    # key/value heads of the model (grouped-query attention: query head i reads K/V head
    # i // (h / n_kv_heads)); None: one per query head
    n_kv_heads: int | None = None

    def pattern(self, layer: int, head: int) -> Tensor:
        """The (n, n) pattern of head ``head`` of layer ``layer`` (−1: the averaged head) on
        the first sequence; a KeyError says which heads were kept."""
        if (layer, head) in self.selected:
            return self.selected[(layer, head)]
        if self.patterns is not None and self.averaged_patterns is not None:
            return self.averaged_patterns[layer] if head < 0 else self.patterns[layer, head]
        kept = ", ".join(f"{l}.{h}" for l, h in self.selected) or "none"
        raise KeyError(f"the pattern of head {layer}.{head} was not kept; kept: {kept}")

    def head(self, layer: int, head: int) -> HeadScore:
        return next(s for s in self.heads if s.layer == layer and s.head == head)

    @property
    def best(self) -> dict[str, dict[str, Any]]:
        """For each type in :data:`BEST_TYPES`, the head with the highest score of that type
        among the heads labelled that type, or among all heads when none is (``labelled``
        false): the best example of the label, not a head that another label describes
        better."""
        best = {}
        for kind, score in BEST_TYPES.items():
            scored = [s for s in self.heads if score in s.scores]
            labelled = [s for s in scored if s.label == kind]
            if scored:
                top = max(labelled or scored, key=lambda s: s.scores[score])
                value = top.scores[score]
                best[kind] = {"layer": top.layer, "head": top.head, "score": round(value, 4),
                              "passes_threshold": value >= THRESHOLDS[score],
                              "label": top.label, "labelled": bool(labelled)}  # fmt: skip
        return best

    @property
    def sinks(self) -> list[dict[str, Any]]:
        """Per layer, Gu et al. 2024's sink share: the fraction of its heads whose mean weight
        on the first token exceeds :data:`SINK_THRESHOLD`, and which heads those are."""
        layers = sorted({s.layer for s in self.heads})
        out = []
        for layer in layers:
            heads = [s for s in self.heads if s.layer == layer]
            sinks = [s.head for s in heads if s.scores["first_token"] > SINK_THRESHOLD]
            out.append({"layer": layer, "share": round(len(sinks) / len(heads), 4),
                        "heads": sinks})  # fmt: skip
        return out

    def to_dict(self, patterns: bool = False) -> dict[str, Any]:
        """JSON-ready scores and labels; with ``patterns`` also every head's weights (rounded
        to 4 decimals) and each layer's averaged head."""
        out: dict[str, Any] = {
            "probe": self.probe,
            "tokens": self.tokens,
            "ids": self.ids,
            "heads": [s.to_dict() for s in self.heads],
            "n_kv_heads": self.n_kv_heads or sum(1 for s in self.heads if s.layer == 0),
            "averaged": [s.to_dict() for s in self.averaged],
            "best": self.best,
            "thresholds": dict(THRESHOLDS),
            "sinks": {"threshold": SINK_THRESHOLD, "layers": self.sinks},
        }
        if patterns:
            if self.patterns is None or self.averaged_patterns is None:
                raise ValueError(
                    "this report kept only some heads' patterns; analyse with keep=None"
                )
            out["weights"] = self.patterns.numpy().round(4)
            out["averaged_weights"] = self.averaged_patterns.numpy().round(4)
        return out


def label_head(scores: dict[str, float], offset: int = 0) -> str:
    """The label of a head from its scores: tier by tier (:data:`TIERS`), the type that passes
    its threshold by the widest margin, measured as the share of the way from the threshold
    to a perfect score, (score − threshold) / (1 − threshold); "mixed" when none passes.

    A positional head is named by its offset: −1 previous-token, 0 current-token, +1
    next-token; any other offset is "positional".
    """
    for tier in TIERS:
        passing = {
            k: (scores[k] - THRESHOLDS[k]) / (1 - THRESHOLDS[k])
            for k in tier
            if k in scores and scores[k] >= THRESHOLDS[k]
        }
        if passing:
            best = max(passing, key=lambda k: passing[k])
            if best == "positional":
                return OFFSET_LABELS.get(offset, "positional")
            return LABELS[best]
    return "mixed"


def mul_scores(weights: Tensor, tokens: Tensor) -> dict[str, Tensor]:
    """TransformerLens's "mul" scores (every query counts): weights (B, h, n, n) → {name: (h,)}."""
    return {
        "previous_mul": previous_token_score(weights),
        "duplicate_mul": duplicate_token_score(weights, tokens),
        "induction_mul": induction_score(weights, tokens),
    }


def resting_weight(weights: Tensor, idle: Tensor) -> Tensor:
    """The mean weight on the first token over the rows marked ``idle`` (B, n) → (h,)."""
    return mass_where_possible(weights[..., :1], idle[..., None])  # key 0 only: (B, h, n, 1)


def pattern_scores(
    weights: Tensor,
    tokens: Tensor,
    delimiters: Tensor,
    shuffled: Tensor | None = None,
    order: Tensor | None = None,
    fixed: Tensor | None = None,
    rare: tuple[Tensor, Tensor] | None = None,
) -> tuple[dict[str, Tensor], Tensor, dict[str, Tensor]]:
    """Every score of a set of heads: weights (B, h, n, n), tokens and delimiters (B, n).

    ``shuffled``/``order`` feed :func:`content_score` (``fixed``: the keys the shuffle does not
    move) and ``rare`` (from :func:`rare_word_targets`) :func:`rare_word_score`; without them
    "content" and "rare_word" are left out. Pure in the weights of one layer, so a caller may
    score layer by layer. Returns ``({type: (h,)}, offsets (h,), {type: rest (h,)})``.
    """
    A, toks = _as_batched(weights, tokens)
    assert toks is not None
    token_rules = (copies_pattern(toks) + induction_pattern(toks)) > 0  # (B, n, n)
    positional, offsets = positional_score(A, confounded=token_rules)
    causal = bool((torch.triu(A, diagonal=1) == 0).all())
    scores = {
        "previous": offset_mass(A, -1),
        **({} if causal else {"next": offset_mass(A, 1)}),  # no next token to see when causal
        "self": offset_mass(A, 0),
        "positional": positional,
        "duplicate": duplicate_where_possible(A, toks),
        "induction": induction_where_possible(A, toks),
    }
    # the rows each token rule can act on (a target left after token_rule_targets)
    induction_rows, duplicate_rows = (t.sum(-1) > 0 for t in token_rule_targets(toks, causal))
    rests = {
        "duplicate": resting_weight(A, ~duplicate_rows),
        "induction": resting_weight(A, ~induction_rows),
    }
    if shuffled is not None and order is not None:
        scores["content"] = content_score(A, shuffled, order, fixed=fixed, tokens=toks)
        if fixed is not None:
            rests["content"] = key_mass_score(A, fixed)
    if rare is not None:
        scores["rare_word"] = rare_word_score(A, *rare)
        rests["rare_word"] = resting_weight(A, ~rare[1])
    scores["first_token"] = first_token_score(A)
    scores["delimiter"] = key_mass_score(A, delimiters)
    scores["diffuse"] = diffuse_score(A)
    return {**scores, **mul_scores(A, toks)}, offsets, rests


def shuffle_positions(tokens: Tensor, movable: Tensor, seed: int = 0) -> Tensor:
    """order (B, n): a seeded permutation per sequence that moves only the movable positions."""
    g = torch.Generator().manual_seed(seed)
    B, n = tokens.shape
    order = torch.arange(n).repeat(B, 1)  # (B, n)
    for b in range(B):
        free = movable[b].nonzero()[:, 0]
        order[b, free] = free[torch.randperm(free.numel(), generator=g)]
    return order


REST_OF_LABEL = {"duplicate-token": "duplicate", "induction": "induction", "rare-word": "rare_word",
                 "content": "content"}  # fmt: skip

SyntacticScores = dict[tuple[int, int], tuple[float, str]]  # (layer, head) → (margin, relation)


def _scored(
    layer: int, head: int, by_type: dict, offsets: list, rests: dict, i: int, syntactic: Any
) -> HeadScore:
    values = {k: float(v[i]) for k, v in by_type.items()}
    relation = ""
    if syntactic is not None and head >= 0:
        margin, relation = syntactic.get((layer, head), (0.0, ""))
        values["syntactic"] = max(0.0, float(margin))
    label = label_head(values, int(offsets[i]))
    kind = REST_OF_LABEL.get(label)
    rest = float(rests[kind][i]) if kind in rests else None
    return HeadScore(layer, head, label, values, int(offsets[i]), rest, relation)


def rare_targets_of(probe: Any, causal: bool) -> tuple[Tensor, Tensor] | None:
    """The rare-word targets of a text probe from wordfreq's English table: None without
    wordfreq, or for token probes (random ids are no sentence; their "words" have no
    frequency worth the name)."""
    from headlab.measure import word_zipf

    if not getattr(probe, "text", "") or getattr(probe, "word_index", None) is None:
        return None
    try:
        zipf = [word_zipf(words) for words in probe.words]
    except ModuleNotFoundError:
        return None
    return rare_word_targets(probe.word_index, zipf, causal)


# --- streaming: one layer at a time ---------------------------------------------------------------

# keep=None: every head's pattern; else the (layer, head) pairs whose patterns to keep (head −1 =
# the layer's averaged head), e.g. set() for scores only
Keep = Collection[tuple[int, int]] | None


@dataclass(frozen=True)
class LayerScores:
    """One layer reduced to numbers: what :func:`layer_scorer` keeps of its (B, h, n, n) weights."""

    scores: dict[str, Tensor]  # score type → (h + 1,): the layer's h heads, then its averaged head
    offsets: Tensor  # (h + 1,) the positional score's offsets
    kept: dict[int, Tensor]  # head (−1 = averaged) → (n, n) pattern on the first sequence
    rests: dict[str, Tensor] = field(default_factory=dict)  # type → (h + 1,) resting weight


def layer_scorer(
    probe: Any,
    order: Tensor | None,
    keep: Keep = None,
    rare: tuple[Tensor, Tensor] | None = None,
) -> Callable[[int, Tensor], LayerScores]:
    """The per-layer reduction of :func:`analyse`: ``score(layer, weights) → LayerScores``.

    weights (B or 2B, h, n, n) are one layer's patterns on ``probe.tokens`` (B, n), followed,
    when ``order`` (B, n) is given, by the patterns on the same tokens shuffled by ``order``
    (for the content score); ``rare`` are the rare-word targets (:func:`rare_targets_of`).
    Each head and the layer's averaged head are scored with :func:`pattern_scores`, on the
    CPU in float32, whatever device the layer ran on.
    """
    B = probe.tokens.shape[0]
    fixed = ~probe.movable

    def score(layer: int, weights: Tensor) -> LayerScores:
        w = weights.float().cpu()  # (B or 2B, h, n, n)
        h = w.shape[1]
        flat = torch.cat([w, averaged_pattern(w)[:, None]], dim=1)  # (·, h + 1, n, n)
        shuffled = flat[B:] if order is not None else None
        by_type, offsets, rests = pattern_scores(
            flat[:B], probe.tokens, probe.delimiters, shuffled, order, fixed, rare
        )
        heads = range(-1, h) if keep is None else [i for l, i in keep if l == layer]
        kept = {i: flat[0, h if i < 0 else i].clone() for i in heads}
        return LayerScores(by_type, offsets, kept, rests)

    return score


def analyse(
    model: Any,
    probe: Any,
    seed: int = 0,
    content: bool = True,
    keep: Keep = None,
    progress: Callable[[int, int], None] | None = None,
    stream: bool = True,
    syntactic: SyntacticScores | None = None,
) -> HeadReport:
    """Run ``model`` on ``probe`` and score and label every (layer, head) and each layer's
    averaged head: the one head analysis the CLI, the server and the experiments call.

    The content score needs the probe's tokens in shuffled positions too: one forward pass
    holds both, side by side (batch 2B), so it costs a second sequence per probe sequence.
    ``content=False`` runs the probe alone and leaves "content" out of the scores. The
    rare-word score needs the ``wordfreq`` package (``headlab[syntax]``) and a text probe;
    ``syntactic`` gives each head's margin over the offset baseline on its best relation
    (:meth:`headlab.heads.syntax.SyntaxReport.margins`), measured on a parsed text.
    Each layer's weights are scored as that layer runs and then dropped
    (:func:`headlab.measure.reduce_patterns`), so the extra memory is about one layer's
    (2B, h, n, n) plus the patterns kept: every head's by default, only ``keep``'s otherwise
    (``keep=()`` for scores alone). ``progress(done, L)`` is called after each layer.
    ``stream=False`` holds every layer's weights first and scores them after the pass (the
    path streaming replaced; the benchmark and tests compare the two).
    model: a :class:`headlab.model.Transformer` (load it with :mod:`headlab.zoo`); probe: a
    :class:`headlab.measure.Probe` (build it with :func:`headlab.measure.build_probe`).
    """
    from headlab.measure import reduce_patterns, run_patterns

    tokens = probe.tokens
    order = shuffle_positions(tokens, probe.movable, seed)
    run = torch.cat([tokens, tokens.gather(1, order)]) if content else tokens  # (2B or B, n)
    rare = rare_targets_of(probe, bool(getattr(model.config, "causal", True)))
    score = layer_scorer(probe, order if content else None, keep, rare)
    if stream:
        layers = reduce_patterns(model, run, score, progress)
    else:
        layers = [score(l, w) for l, w in enumerate(run_patterns(model, run))]
    report = _report(probe, layers, keep, syntactic)
    return replace(report, n_kv_heads=getattr(model.config, "n_kv_heads", None))


def _report(
    probe: Any, layers: list[LayerScores], keep: Keep, syntactic: SyntacticScores | None = None
) -> HeadReport:
    """The HeadReport of a probe from its layers' scores (layer-major; averaged heads apart)."""
    L, h = len(layers), layers[0].offsets.shape[0] - 1
    scores = {k: torch.cat([s.scores[k] for s in layers]).tolist() for k in layers[0].scores}
    rests = {k: torch.cat([s.rests[k] for s in layers]).tolist() for k in layers[0].rests}
    offsets = torch.cat([s.offsets for s in layers]).tolist()
    heads = [_scored(l, i, scores, offsets, rests, l * (h + 1) + i, syntactic)
             for l in range(L) for i in range(h)]  # fmt: skip
    averaged = [_scored(l, -1, scores, offsets, rests, l * (h + 1) + h, None) for l in range(L)]
    if keep is None:
        patterns = torch.stack([torch.stack([s.kept[i] for i in range(h)]) for s in layers])
        avg = torch.stack([s.kept[-1] for s in layers])
        return HeadReport(probe.name, list(probe.labels), probe.tokens[0].tolist(), heads,
                          patterns, avg, averaged, getattr(probe, "text", ""))  # fmt: skip
    selected = {(l, i): p for l, s in enumerate(layers) for i, p in s.kept.items()}
    return HeadReport(probe.name, list(probe.labels), probe.tokens[0].tolist(), heads, None,
                      None, averaged, getattr(probe, "text", ""), selected)  # fmt: skip
