"""Every head score: how much a head looks like a known head type, in PyTorch operations on
any device. :func:`pattern_scores` is what :func:`headlab.heads.analyse` runs: every score of a
set of heads at once, the target-mask scores through :func:`stacked_masses`. The functions
below it score one type at a time, for any query and key length (a KV cache too); the tests
hold them equal to it. On the CPU in float32, compiled loops compute the content score, each
row's argmax and its entropy (:mod:`headlab.heads.fast` decides where; they equal the
definition here).

Shape legend
    B   batch (probe sequences); scores are averaged over it
    h   heads (of one layer, or all layers' heads stacked)
    n   query positions; s key positions (s == n: analysis runs without a cache)

Every score is in [0, 1] and returns (h,) (the positional score also its offsets); docs/heads.md
has the full reference. Each type is
judged where it can act (:func:`mass_where_possible` over the rows that have a target from
:mod:`headlab.heads.targets`); ``causal`` is the model's ``config.causal``, never guessed.

    offset_mass          attention on i + δ: previous (−1), self (0), next (+1)      Voita 2019
    induction_score      THE induction score: Olsson et al.'s prefix matching over the queries
                         whose token occurred before, keys that are also copies left out
    induction_active_score  the same rows' attention on the copy's successor as a share of
                         the attention they do not rest on the first position (the label's)
    duplicate_score      attention on other copies of the query's token              Wang 2022
    positional_score     share of queries whose argmax is at the most common offset  Voita 2019
    content_score        the share of attention the head's own position profile does not explain
                         (:mod:`headlab.heads.content`)
    rare_word_score      share of queries whose argmax is the least frequent word    Voita 2019
    first_token_score    mean weight on the first token: an attention sink     Xiao 2023, Gu 2024
    key_mass_score       mean weight on marked keys (delimiters)                    Clark 2019
    diffuse_score        normalised entropy of each row
    *_mul_score          TransformerLens's "mul" scores, Σ(A ⊙ P)/ΣA over every query, kept
                         under their own names (previous_mul, duplicate_mul, induction_mul)
    stacked_masses       every target-mask score above at once, from a probe's TargetStack
    pattern_scores       all of them for one layer's heads on a probe's :class:`Targets`

Papers: Voita et al. 2019; Clark et al. 2019; Olsson et al. 2022; Wang et al. 2022; Xiao et al.
2023; Gu et al. 2024; TransformerLens (Nanda and Bloom 2022).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from headlab.heads import fast
from headlab.heads.content import content_score
from headlab.heads.targets import (
    Targets,
    TargetStack,
    as_batched,
    duplicate_token_pattern,
    induction_pattern,
    offset_pattern,
    positional_reach,
    previous_token_pattern,
    rarest_word,
    targets_of,
    token_rule_targets,
    visible_keys,
)


def mass_where_possible(weights: Tensor, target: Tensor) -> Tensor:
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
    valid = count > 0  # (B,)
    # the mean over the valid sequences with no branch on the values (it traces into a graph:
    # headlab.heads.switch.SwitchGraph); none valid gives 0 / 1
    total = torch.where(valid[:, None], per_seq.double(), 0.0).sum(dim=0)  # (h,)
    return (total / valid.sum().clamp_min(1)).float()


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
    B, _, n, s = A.shape
    return _positional(_first_argmax(A), positional_reach(B, n, s, causal, confounded))


def _positional(argmax: Tensor, reach: tuple[Tensor, Tensor, Tensor]) -> tuple[Tensor, Tensor]:
    """:func:`positional_score` from each query's argmax key (B, h, n) and the probe's
    :func:`headlab.heads.targets.positional_reach`; every sequence and head at once, on the
    argmax's device."""
    device = argmax.device
    ok, reachable, eligible = (t.to(device) for t in reach)  # (B, n, D), (D,), (D,)
    h, n = argmax.shape[1:]
    rel = argmax - torch.arange(n, device=device) + (n - 1)  # (B, h, n): the offset's column
    valid = ok.gather(2, rel.transpose(1, 2))  # (B, n, h): the argmax offset is counted
    counts = torch.zeros(h, ok.shape[-1], dtype=torch.long, device=device)
    counts.scatter_add_(
        1, rel.transpose(0, 1).reshape(h, -1), valid.permute(2, 0, 1).reshape(h, -1).long()
    )
    best = counts.masked_fill(~eligible, -1).argmax(dim=-1)  # (h,)
    score = counts.gather(-1, best[:, None])[:, 0].float() / reachable[best].clamp_min(1).float()
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
    return mass_where_possible(A, target.expand(A.shape[0], -1, -1))


def duplicate_score(weights: Tensor, tokens: Tensor, causal: bool) -> Tensor:
    """The attention on other copies of the current token, averaged over the queries that can
    see one → (h,): the duplicate-token head where it can act. Under a causal mask the copies
    are the earlier ones (TransformerLens's target); a bidirectional head may also look at
    later copies. Keys the induction rule also predicts are left out (:func:`token_rule_targets`).
    """
    A, toks = as_batched(weights, tokens)
    assert toks is not None
    return mass_where_possible(A, token_rule_targets(toks, causal)[1])


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
    return mass_where_possible(A, token_rule_targets(toks, causal=True)[0])


def induction_active_score(weights: Tensor, tokens: Tensor) -> Tensor:
    """The induction target's share of a head's active attention, the attention it does not
    rest on the first position (key 0), over the rows :func:`induction_score` counts → (h,).

    Per sequence Σᵢ Σⱼ Aᵢⱼ Pᵢⱼ / Σᵢ (Σⱼ Aᵢⱼ − Aᵢ₀) over its rows i that have a target (P: the
    induction target, which never holds key 0), then the mean over the sequences that have
    any; 0 for a sequence whose rows rest all their attention on key 0. A head that copies
    where it can and parks the rest of those rows on the first token (an attention sink, Xiao
    et al. 2023) scores near 1 however much it parks: the copy is its job, key 0 its rest.
    TransformerLens's ``detect_head(…, exclude_bos=True)`` takes attention on the first token
    out of its measure alike. The labels use it only beside a minimum of the plain score
    (:data:`headlab.heads.labels.NEEDS`): a head that parks nearly all stays a sink.
    """
    A, toks = as_batched(weights, tokens)
    assert toks is not None
    target = token_rule_targets(toks, causal=True)[0].to(A.dtype)  # (B, n, s)
    rows = target.sum(-1) > 0  # (B, n)
    hit = ((A * target[:, None]).sum(-1) * rows[:, None]).sum(-1)  # (B, h)
    active = ((A.sum(-1) - A[..., 0]) * rows[:, None]).sum(-1)  # (B, h)
    return _active_mean(hit, active, rows.any(-1))


def _active_mean(hit: Tensor, active: Tensor, valid: Tensor) -> Tensor:
    """hit / active per (B, h), 0 where active is 0 and at most 1 (float rounding), averaged
    over the sequences ``valid`` (B,) bool marks → (h,); 0 where none is. No branch on the
    values: the static site exports it (:class:`ScoreGraph`)."""
    share = torch.where(active > 0, hit / active.clamp_min(1e-30), 0.0).clamp_max(1.0)
    total = (share.double() * valid[:, None]).sum(0)  # (h,)
    return (total / valid.sum().clamp_min(1)).float()


def rare_word_score(weights: Tensor, rare: Tensor, rows: Tensor) -> Tensor:
    """Voita et al. 2019's rare-word head: the share of queries whose most-attended key is the
    sequence's least frequent word → (h,).

    weights (B, h, n, s); rare (B, s) bool marks the pieces of the least frequent word(s);
    rows (B, n) bool the queries where such a head can act (see :func:`rare_word_targets`).
    Per sequence the share of its rows, then the mean over sequences that have any.
    """
    A, _ = as_batched(weights)
    return _rare_word(_first_argmax(A), rare, rows)


def _rare_word(argmax: Tensor, rare: Tensor, rows: Tensor) -> Tensor:
    """:func:`rare_word_score` from each query's argmax key (B, h, n)."""
    rare, rows = rare.to(argmax.device), rows.to(argmax.device)
    hit = rare.gather(1, argmax.flatten(1)).view(argmax.shape)  # (B, h, n)
    count = rows.sum(-1)  # (B,)
    per_seq = (hit & rows[:, None]).sum(-1) / count.clamp_min(1)[:, None]  # (B, h)
    valid = count > 0  # the sequences with a row: the mean over them, 0 where none has one
    total = (per_seq.double() * valid[:, None]).sum(0)  # (h,): exact, a few float32 shares
    return (total / valid.sum().clamp_min(1)).float()


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
    return _diffuse(_row_stats(A)[1], A.shape[-1], causal)


def _diffuse(plogp: Tensor, s: int, causal: bool) -> Tensor:
    """:func:`diffuse_score` from each row's Σ_j A_ij log A_ij (B, h, n), s keys."""
    n = plogp.shape[-1]
    # the rows with k_i ≥ 2 keys are the last ones (k_i grows with i): a slice, whatever n
    first = max(0, n - s + 1) if causal else 0
    rows = torch.arange(first, n, device=plogp.device)
    k = (rows + 1 + (s - n) if causal else torch.full_like(rows, s)).to(plogp.dtype)  # k_i
    norm = -plogp.index_select(-1, rows) / k.log()  # (B, h, rows)
    return torch.where((k >= 2).any(), norm.mean(dim=(0, 2)), 0.0).float()


def averaged_pattern(weights: Tensor) -> Tensor:
    """The "averaged head" of a layer: the mean of its heads' patterns, (B, h, n, s) → (B, n, s).

    Shown next to the real heads, it is what single-pattern attention visualisations lose:
    distinct previous-token, sink and content heads blur into one smeared map.
    """
    A, _ = as_batched(weights)
    return A.mean(dim=1)


def stacked_masses(weights: Tensor, stack: TargetStack) -> dict[str, Tensor]:
    """Every target-mask score of weights (B, h, n, n) on a probe's :class:`TargetStack`, each
    (h,), in a fixed handful of tensor operations whatever the number of heads or targets: the
    token targets by one batched contraction, the one-key-per-query targets by one gather, the
    marked keys and the induction rows' active attention from the column sums (over every row,
    and over the induction rows, by one product), then one weighted sum over rows and one over
    sequences: three passes over the weights.

    Equal (to float rounding) to :func:`mass_where_possible` for the targets averaged over their
    rows and to :func:`pattern_score` / :func:`key_mass_score` for the others; and
    "induction_active" to :func:`induction_active_score`.
    """
    B, h, n, _ = weights.shape
    dense = torch.einsum("bhij,kbij->kbhi", weights, stack.dense.to(weights))  # (K, B, h, n)
    index = stack.picks.T.expand(B, h, n, -1).to(weights.device)  # (B, h, n, P)
    picked = weights.gather(-1, index).permute(3, 0, 1, 2)  # (P, B, h, n)
    rows = stack.row_weight.to(weights)
    per_row = torch.einsum("kbhi,kbi->kbh", torch.cat([dense, picked]), rows)
    k = stack.names.index("induction")
    # the attention each key receives (B, h, s) from every row, and from the induction rows
    # weighted as that score weighs them: one product, one pass over the weights
    select = torch.stack([torch.ones_like(rows[k]), rows[k]], 1)[:, None]  # (B, 1, 2, n)
    mass, induction_mass = torch.matmul(select, weights).unbind(2)  # (B, h, s) each
    marked = torch.einsum("bhs,cbs->cbh", mass, stack.columns.to(weights))  # (C, B, h)
    total = mass.sum(-1)  # (B, h)
    per_total = torch.where(total > 0, 1 / total.clamp_min(1e-30), torch.zeros_like(total))
    hit = torch.cat([per_row, marked])  # (K + P + C, B, h)
    ratio = stack.ratio.to(weights.device)[:, None, None]
    per_seq = hit * torch.where(ratio, per_total, 1.0)
    seq_weight = stack.seq_weight.to(hit.device)
    mean = torch.einsum("kbh,kb->kh", per_seq.double(), seq_weight).float()
    out = dict(zip(stack.names, mean.unbind(0), strict=True))
    # the induction rows' mass over their active attention (induction_active_score): the row
    # weights are equal within a sequence, so the ratio of the two row means is the ratio of sums
    active = induction_mass.sum(-1) - induction_mass[..., 0]  # (B, h): all but key 0's
    out["induction_active"] = _active_mean(per_seq[k], active, seq_weight[k] > 0)
    return out


def _first_argmax(weights: Tensor) -> Tensor:
    """``weights.argmax(-1)`` (the first of equal maxima) for attention weights (…, s), ≥ 0
    → (…,) long."""
    return _row_stats(weights)[0]


def _row_stats(weights: Tensor) -> tuple[Tensor, Tensor]:
    """Each row's first argmax (…,) long and Σ_j A_j log A_j (…,) (0 · log 0 = 0: a weight
    below the least normal float counts as it) of attention weights (…, s), ≥ 0: the positional
    and rare-word scores read the argmax, the diffuse score the entropy. On the CPU in float32
    compiled loops compute the same in one pass that reads each row once
    (:func:`headlab.heads.kernels.row_stats`, where :func:`headlab.heads.fast.usable`)."""
    if fast.usable(weights):
        from headlab.heads.kernels import row_stats_parallel

        argmax, plogp = row_stats_parallel(weights.detach().contiguous().numpy())
        return torch.from_numpy(argmax), torch.from_numpy(plogp)
    logs = weights.clamp_min(torch.finfo(weights.dtype).tiny).log()
    return weights.argmax(-1), (logs * weights).sum(-1)


def pattern_scores(
    weights: Tensor,
    targets: Targets,
    content: bool = True,
) -> tuple[dict[str, Tensor], Tensor, dict[str, Tensor]]:
    """Every score of a set of heads: weights (B, h, n, n) on the probe whose ``targets``
    (:func:`headlab.heads.targets.build_targets`) were built once for it.

    ``content`` includes :func:`content_score` (from these weights alone), and the targets'
    rare words :func:`rare_word_score`; without them "content" and "rare_word" are left out.
    Pure in the weights of one layer, so a caller may score layer by layer. The target-mask
    scores come from :func:`stacked_masses` on the targets' stack (built once per probe). Returns
    ``({type: (h,)}, offsets (h,), {type: where the head rests off its rows (h,)})``.
    """
    A, _ = as_batched(weights, targets.tokens)
    causal, t = targets.causal, targets
    argmax, plogp = _row_stats(A)  # (B, h, n) each
    positional, offsets = _positional(argmax, t.stack.reach)
    m = stacked_masses(A, t.stack)
    scores = {
        "previous": m["previous"],
        **({} if causal else {"next": m["next"]}),  # nothing to see when causal
        "self": m["self"],
        "positional": positional,
        "duplicate": m["duplicate"],
        "induction": m["induction"],
        "induction_active": m["induction_active"],
    }
    rests = {"duplicate": m["rest:duplicate"], "induction": m["rest:induction"]}
    if content:
        scores["content"] = content_score(A, causal, t.fixed)
        rests["content"] = m["rest:content"]
    if t.rare is not None:
        scores["rare_word"] = _rare_word(argmax, *t.rare)
        rests["rare_word"] = m["rest:rare_word"]
    scores["first_token"] = m["first_token"]
    scores["delimiter"] = m["delimiter"]
    scores["diffuse"] = _diffuse(plogp, A.shape[-1], causal)
    mul = {k: m[k] for k in ("previous_mul", "duplicate_mul", "induction_mul")}
    return {**scores, **mul}, offsets, rests


class ScoreGraph(nn.Module):
    """:func:`pattern_scores` as a module with tensors in and out: every score of a set of heads
    on one probe, the probe's text-dependent choices (earlier copies, delimiters, fixed keys, the
    rarest word) computed inside it from its inputs, with no Python branch on their values. The
    static site exports it (inside :class:`headlab.site.SiteGraph`, by ``torch.export``) for any
    length up to the model's context, so the browser's scores are :func:`analyse`'s.

    forward(weights (B, H, n, n), tokens (B, n) int64, delimiters (B, n) bool, fixed (B, n)
    bool, word_index (B, n) int64 (−1: no word), zipf (B, n) float (each token's word
    frequency, NaN: none; :func:`headlab.heads.targets.rarest_word`)) → scores (T, H),
    offsets (H,), rests (R, H), in the order of :attr:`score_names` and :attr:`rest_names`.
    """

    def __init__(self, causal: bool, content: bool = True) -> None:
        super().__init__()
        self.causal, self.content = causal, content
        # the names, in pattern_scores' own order, read off one call on a two-token probe
        tokens = torch.zeros(1, 2, dtype=torch.long)
        flags = torch.zeros(1, 2, dtype=torch.bool)
        weights = torch.full((1, 1, 2, 2), 0.5)
        scores, _, rests = self.scores(weights, tokens, flags, flags, tokens, torch.zeros(1, 2))
        self.score_names, self.rest_names = tuple(scores), tuple(rests)

    def scores(
        self,
        weights: Tensor,
        tokens: Tensor,
        delimiters: Tensor,
        fixed: Tensor,
        word_index: Tensor,
        zipf: Tensor,
    ) -> tuple[dict[str, Tensor], Tensor, dict[str, Tensor]]:
        """:func:`pattern_scores` on the targets built from these inputs."""
        rare = rarest_word(word_index, zipf, self.causal)
        targets = targets_of(tokens, self.causal, delimiters, fixed, rare)
        return pattern_scores(weights, targets, self.content)

    def forward(
        self,
        weights: Tensor,
        tokens: Tensor,
        delimiters: Tensor,
        fixed: Tensor,
        word_index: Tensor,
        zipf: Tensor,
    ) -> tuple[Tensor, Tensor, Tensor]:
        scores, offsets, rests = self.scores(weights, tokens, delimiters, fixed, word_index, zipf)
        return torch.stack(list(scores.values())), offsets, torch.stack(list(rests.values()))
