"""Head scores and labels: how much each attention head looks like a known head type.

Shape legend
    B   batch (probe sequences); scores are averaged over it
    h   heads (of one layer, or all layers' heads stacked)
    n   query positions; s key positions (s == n: analysis runs without a cache)

Every score is in [0, 1]; docs/heads.md has the full reference. A is one head's pattern (rows sum
to 1), t the token ids.

Pattern scores, TransformerLens's head detector with its "mul" measure:
    score = Σ_ij A_ij · P_ij / Σ_ij A_ij     (a perfect previous-token head scores (n − 1)/n)
    previous     P[i, j] = 1 if j = i − 1                          threshold 0.5  Voita 2019
    next         P[i, j] = 1 if j = i + 1                          threshold 0.5  Clark 2019
    duplicate    P[i, j] = 1 if j < i and t[j] = t[i]               threshold 0.4  Wang 2022
    induction    P[i, j] = 1 if j − 1 < i and t[j − 1] = t[i]       threshold 0.4  Olsson 2022
    first_token  P[i, j] = 1 if j = 0 (BOS, [CLS])                  threshold 0.5  Clark 2019
    delimiter    P[i, j] = 1 if key j > 0 is special or punctuation threshold 0.5  Clark 2019
Other scores:
    positional   share of queries whose argmax_j A_ij − i equals the most common offset δ
                 (reported with δ)                                  threshold 0.9  Voita 2019
    content      mean_i max(0, overlap(A_i, back_i) − overlap(A_i, S_i)) where S is the pattern
                 on the tokens shuffled in position, back is S mapped to the original positions
                 and overlap(p, q) = Σ_j min(p_j, q_j): the pattern follows the tokens, not the
                 positions (headlab's definition; causal heads compare over the keys a query
                 sees in both orders, see content_score)            threshold 0.3
    diffuse      mean_i H(A_i) / log k_i, k_i the keys query i may see   threshold 0.9
Label: the type passing its threshold by the widest margin, else "mixed"; positional with
δ = ∓1 is called previous-/next-token.

Papers: Voita et al. 2019; Clark et al. 2019; Olsson et al. 2022; Wang et al. 2022;
TransformerLens (Nanda and Bloom 2022).
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor


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


def positional_score(weights: Tensor) -> tuple[Tensor, Tensor]:
    """Voita et al. 2019's positional head test: where does each query's maximum attention fall?

    For each head, the fraction of queries whose argmax key is at relative offset δ, for the
    most common δ; averaged over the batch (δ taken from the pooled counts). Returns
    ``(score (h,), offset (h,) int)``.
    """
    A, _ = _as_batched(weights)
    B, _, n, s = A.shape
    h = A.shape[1]
    rel = A.argmax(dim=-1) - torch.arange(n, device=A.device) + (n - 1)  # (B, h, n), ≥ 0
    rel = rel.transpose(0, 1).reshape(h, B * n)  # (h, B·n)
    counts = torch.zeros(h, n + s - 1, dtype=torch.long, device=A.device)
    counts.scatter_add_(1, rel, torch.ones_like(rel))  # (h, n+s−1): offsets −(n−1)..s−1
    best = counts.argmax(dim=-1)  # (h,)
    return counts.gather(-1, best[:, None])[:, 0].float() / (B * n), best - (n - 1)


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
    weights: Tensor, shuffled: Tensor, order: Tensor, causal: bool | None = None
) -> Tensor:
    """How much a head's pattern follows the tokens, not the positions, when they are shuffled.

    weights (B, h, n, n) on the original tokens; shuffled (B, h, n, n) on the same tokens
    reordered so that new position p holds the token from old position order[b, p]. Map the
    shuffled pattern back to the old positions (back[i, j] = shuffled[σ⁻¹(i), σ⁻¹(j)]) and
    compare each query's row with overlap(p, q) = Σ_j min(p_j, q_j) ∈ [0, 1]:

        content = mean_i max(0, overlap(A_i, back_i) − overlap(A_i, S_i))

    A head that attends by token identity keeps its pattern in token space (high first term,
    low second); a positional head keeps it in position space (the reverse). A uniform or
    fixed-sink head is unchanged either way and scores 0. Returns (h,).

    Causal heads (``causal``; detected from an all-zero upper triangle when None): the shuffle
    also changes which keys a query may see, so the token-space overlap is taken over the keys
    it sees in both orders, K_i, each row renormalised there, and query i weighs
    w_i = min(A_i(K_i), back_i(K_i)), the share of both rows that falls on K_i:

        content = Σ_i w_i · max(0, overlap(Â_i, b̂ack_i) − overlap(A_i, S_i)) / Σ_i w_i

    Without a mask K_i holds every key, w_i = 1, and the two formulas agree.
    """
    A, _ = _as_batched(weights)
    S, _ = _as_batched(shuffled)
    inverse = order.argsort(dim=-1)  # (B, n): old position → new position
    B, h, n, _ = A.shape
    idx = inverse[:, None, :].expand(B, h, n)
    back = S.gather(2, idx[..., None].expand(B, h, n, n))  # rows to old query order
    back = back.gather(3, idx[:, :, None, :].expand(B, h, n, n))  # columns to old key order
    by_position = torch.minimum(A, S).sum(-1)  # (B, h, n)
    if causal is None:
        causal = bool((torch.triu(A, diagonal=1) == 0).all() and (torch.triu(S, 1) == 0).all())
    if not causal:
        by_token = torch.minimum(A, back).sum(-1)  # (B, h, n)
        return (by_token - by_position).clamp_min(0).mean(dim=(0, 2)).float()
    pos = torch.arange(n, device=A.device)
    seen = (pos[:, None] >= pos[None, :]) & (inverse[:, :, None] >= inverse[:, None, :])
    seen = seen[:, None].to(A.dtype)  # (B, 1, n, n): K_i, the keys seen in both orders
    a, b = A * seen, back * seen
    mass_a, mass_b = a.sum(-1, keepdim=True), b.sum(-1, keepdim=True)  # (B, h, n, 1)
    by_token = torch.minimum(a / mass_a.clamp_min(1e-12), b / mass_b.clamp_min(1e-12)).sum(-1)
    w = torch.minimum(mass_a, mass_b)[..., 0]  # (B, h, n)
    gap = (by_token - by_position).clamp_min(0)
    per_seq = (w * gap).sum(-1) / w.sum(-1).clamp_min(1e-12)  # (B, h)
    return per_seq.mean(dim=0).float()


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
    "positional",
    "first_token",
    "delimiter",
    "duplicate",
    "induction",
    "content",
    "diffuse",
)

# A head is labelled with the type it passes by the widest margin over its threshold. The
# mass scores are shares of attention, so 0.5 means "most of the head's attention"; the
# positional threshold is Voita et al.'s 90% of queries; diffuse needs nearly uniform rows.
THRESHOLDS: dict[str, float] = {
    "previous": 0.5,
    "next": 0.5,
    "positional": 0.9,
    "first_token": 0.5,
    "delimiter": 0.5,
    "duplicate": 0.4,
    "induction": 0.4,
    "content": 0.3,
    "diffuse": 0.9,
}

LABELS = {
    "previous": "previous-token",
    "next": "next-token",
    "positional": "positional",
    "first_token": "first-token",
    "delimiter": "delimiter",
    "duplicate": "duplicate-token",
    "induction": "induction",
    "content": "content",
    "diffuse": "diffuse",
}


@dataclass(frozen=True)
class HeadScore:
    """One head's scores on a probe, and its label."""

    layer: int
    head: int
    label: str  # a LABELS value, or "mixed" when no score passes its threshold
    scores: dict[str, float]  # SCORE_TYPES → value in [0, 1]
    offset: int  # the relative offset of the positional score (e.g. −1 = previous token)

    def to_dict(self) -> dict:
        return {
            "layer": self.layer,
            "head": self.head,
            "label": self.label,
            "offset": self.offset,
            "scores": {k: round(v, 4) for k, v in self.scores.items()},
        }


# The page's head types → the score that picks the best head of that type.
BEST_TYPES = {
    "previous-token": "previous",
    "positional": "positional",
    "induction": "induction",
    "content": "content",
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
        """For each type in :data:`BEST_TYPES`, the head with the highest score of that type."""
        best = {}
        for kind, score in BEST_TYPES.items():
            scored = [s for s in self.heads if score in s.scores]
            if scored:
                top = max(scored, key=lambda s: s.scores[score])
                value = top.scores[score]
                best[kind] = {"layer": top.layer, "head": top.head, "score": round(value, 4),
                              "passes_threshold": value >= THRESHOLDS[score]}  # fmt: skip
        return best

    def to_dict(self, patterns: bool = False) -> dict[str, Any]:
        """JSON-ready scores and labels; with ``patterns`` also every head's weights (rounded
        to 4 decimals) and each layer's averaged head."""
        out: dict[str, Any] = {
            "probe": self.probe,
            "tokens": self.tokens,
            "ids": self.ids,
            "heads": [s.to_dict() for s in self.heads],
            "averaged": [s.to_dict() for s in self.averaged],
            "best": self.best,
            "thresholds": dict(THRESHOLDS),
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
    """The label of the type whose score passes its threshold by the widest margin, or "mixed".

    A positional head whose offset is −1 or +1 is labelled previous-/next-token (Voita et al.
    2019 found positional heads point to exactly those).
    """
    passing = {k: scores[k] - t for k, t in THRESHOLDS.items() if scores.get(k, 0.0) >= t}
    if not passing:
        return "mixed"
    best = max(passing, key=lambda k: passing[k])
    if best == "positional" and offset in (-1, 1):
        return LABELS["previous" if offset == -1 else "next"]
    return LABELS[best]


def pattern_scores(
    weights: Tensor,
    tokens: Tensor,
    delimiters: Tensor,
    shuffled: Tensor | None = None,
    order: Tensor | None = None,
) -> tuple[dict[str, Tensor], Tensor]:
    """Every score of a set of heads: weights (B, h, n, n), tokens and delimiters (B, n).

    ``shuffled``/``order`` feed :func:`content_score`; without them "content" is left out.
    Returns ``({type: (h,)}, offsets (h,))``.
    """
    A, toks = _as_batched(weights, tokens)
    assert toks is not None
    positional, offsets = positional_score(A)
    scores = {
        "previous": previous_token_score(A),
        "next": next_token_score(A),
        "positional": positional,
        "first_token": first_token_score(A),
        "delimiter": key_mass_score(A, delimiters),
        "duplicate": duplicate_token_score(A, toks),
        "induction": induction_score(A, toks),
    }
    if shuffled is not None and order is not None:
        scores["content"] = content_score(A, shuffled, order)
    scores["diffuse"] = diffuse_score(A)
    return scores, offsets


def shuffle_positions(tokens: Tensor, movable: Tensor, seed: int = 0) -> Tensor:
    """order (B, n): a seeded permutation per sequence that moves only the movable positions."""
    g = torch.Generator().manual_seed(seed)
    B, n = tokens.shape
    order = torch.arange(n).repeat(B, 1)  # (B, n)
    for b in range(B):
        free = movable[b].nonzero()[:, 0]
        order[b, free] = free[torch.randperm(free.numel(), generator=g)]
    return order


def _scored(layer: int, head: int, scores: dict[str, list], offsets: list, i: int) -> HeadScore:
    values = {k: float(v[i]) for k, v in scores.items()}
    return HeadScore(layer, head, label_head(values, int(offsets[i])), values, int(offsets[i]))


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


def layer_scorer(
    probe: Any, order: Tensor | None, keep: Keep = None
) -> Callable[[int, Tensor], LayerScores]:
    """The per-layer reduction of :func:`analyse`: ``score(layer, weights) → LayerScores``.

    weights (B or 2B, h, n, n) are one layer's patterns on ``probe.tokens`` (B, n), followed,
    when ``order`` (B, n) is given, by the patterns on the same tokens shuffled by ``order``
    (for the content score). Each head and the layer's averaged head are scored with
    :func:`pattern_scores`, on the CPU in float32, whatever device the layer ran on.
    """
    B = probe.tokens.shape[0]

    def score(layer: int, weights: Tensor) -> LayerScores:
        w = weights.float().cpu()  # (B or 2B, h, n, n)
        h = w.shape[1]
        flat = torch.cat([w, averaged_pattern(w)[:, None]], dim=1)  # (·, h + 1, n, n)
        shuffled = flat[B:] if order is not None else None
        by_type, offsets = pattern_scores(flat[:B], probe.tokens, probe.delimiters, shuffled, order)
        heads = range(-1, h) if keep is None else [i for l, i in keep if l == layer]
        kept = {i: flat[0, h if i < 0 else i].clone() for i in heads}
        return LayerScores(by_type, offsets, kept)

    return score


def analyse(
    model: Any,
    probe: Any,
    seed: int = 0,
    content: bool = True,
    keep: Keep = None,
    progress: Callable[[int, int], None] | None = None,
    stream: bool = True,
) -> HeadReport:
    """Run ``model`` on ``probe`` and score and label every (layer, head) and each layer's
    averaged head: the one head analysis the CLI, the server and the experiments call.

    The content score needs the probe's tokens in shuffled positions too: one forward pass
    holds both, side by side (batch 2B), so it costs a second sequence per probe sequence.
    ``content=False`` runs the probe alone and leaves "content" out of the scores.
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
    score = layer_scorer(probe, order if content else None, keep)
    if stream:
        layers = reduce_patterns(model, run, score, progress)
    else:
        layers = [score(l, w) for l, w in enumerate(run_patterns(model, run))]
    return _report(probe, layers, keep)


def _report(probe: Any, layers: list[LayerScores], keep: Keep) -> HeadReport:
    """The HeadReport of a probe from its layers' scores (layer-major; averaged heads apart)."""
    L, h = len(layers), layers[0].offsets.shape[0] - 1
    scores = {k: torch.cat([s.scores[k] for s in layers]).tolist() for k in layers[0].scores}
    offsets = torch.cat([s.offsets for s in layers]).tolist()
    heads = [_scored(l, i, scores, offsets, l * (h + 1) + i) for l in range(L) for i in range(h)]
    averaged = [_scored(l, -1, scores, offsets, l * (h + 1) + h) for l in range(L)]
    if keep is None:
        patterns = torch.stack([torch.stack([s.kept[i] for i in range(h)]) for s in layers])
        avg = torch.stack([s.kept[-1] for s in layers])
        return HeadReport(probe.name, list(probe.labels), probe.tokens[0].tolist(), heads,
                          patterns, avg, averaged, getattr(probe, "text", ""))  # fmt: skip
    selected = {(l, i): p for l, s in enumerate(layers) for i, p in s.kept.items()}
    return HeadReport(probe.name, list(probe.labels), probe.tokens[0].tolist(), heads, None,
                      None, averaged, getattr(probe, "text", ""), selected)  # fmt: skip
