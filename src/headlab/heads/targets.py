"""Where each head type can act on a probe: its target keys, built once per probe.

Shape legend
    B   probe sequences
    h   heads
    n   query positions; s key positions (s == n: analysis runs without a cache)

A target is a 0/1 matrix (B, n, s): query i → the keys a head of that type would attend to. A
row with no target key is a row where the type cannot be judged (the first token for a
previous-token head, a token never seen before for an induction head). Whether the model is
causal is a fact of its config, passed in (``model.config.causal``), never read off the weights.

    induction_pattern        the token right after an earlier copy of the query's token (Olsson)
    duplicate_token_pattern  earlier copies of the query's token (TransformerLens)
    copies_pattern           other copies on either side
    previous_token_pattern   i − 1; offset_pattern: i + δ
    token_rule_targets       induction and duplicate targets with the keys both predict left out
    rare_word_targets        the least frequent word's pieces, and the rows that can see them
    rarest_word              the same from each token's word frequency, in tensor operations
    Targets                  all of the above for one probe, built once (:func:`build_targets`)
    TargetStack              the same targets stacked by the form the scores read them in, so
                             that a layer's scores are a few batched contractions

Papers: Olsson et al. 2022; Voita et al. 2019; TransformerLens (Nanda and Bloom 2022).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from headlab.measure import Probe, same_token, word_zipf


def as_batched(weights: Tensor, tokens: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
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


def visible_keys(n: int, s: int, causal: bool) -> Tensor:
    """(n,) the number of keys each query may see: i + 1 plus the s − n cached keys under a
    causal mask (aligned bottom-right, DESIGN.md), every key otherwise."""
    return torch.arange(1, n + 1) + (s - n) if causal else torch.full((n,), s)


def positional_reach(
    B: int, n: int, s: int, causal: bool, confounded: Tensor | None = None
) -> tuple[Tensor, Tensor, Tensor]:
    """Where :func:`headlab.heads.scores.positional_score` can count an offset δ = column − (n − 1):
    ``ok`` (B, n, n + s − 1) bool, query i reaches key i + δ (it exists, is visible, the query
    has a choice, and no token rule in ``confounded`` (B, n, s) predicts it); ``reach`` (D,)
    how many queries reach each δ; ``eligible`` (D,) the offsets reached by at least half the
    queries that have a choice (at least one)."""
    k = visible_keys(n, s, causal)  # (n,)
    i = torch.arange(n)[:, None]
    key = i + torch.arange(-(n - 1), s)[None, :]  # (n, D): the key at each offset δ
    ok = (key >= 0) & (key < k[:, None]) & (k[:, None] >= 2)  # (n, D): reachable, with a choice
    ok = ok.expand(B, n, -1).clone()  # (B, n, D)
    if confounded is not None:
        clash = confounded.gather(2, key.clamp(0, s - 1).expand(B, n, -1))  # (B, n, D)
        ok &= ~clash
    reach = ok.sum(dim=(0, 1))  # (D,): queries that can reach δ
    eligible = reach >= ((k >= 2).sum() * B / 2).clamp_min(1.0)
    return ok, reach, eligible


def offset_pattern(n: int, s: int, shift: int) -> Tensor:
    """(1, n, s) 0/1 target: query i → key i + shift (−1 previous, 0 itself, +1 next)."""
    i, j = torch.arange(n)[:, None], torch.arange(s)[None, :]
    return (j == i + shift + (s - n)).float()[None]  # (1, n, s)


def previous_token_pattern(n: int, s: int | None = None) -> Tensor:
    """(n, s) 0/1 target: query i → key i − 1."""
    s = n if s is None else s
    i = torch.arange(n)[:, None]
    j = torch.arange(s)[None, :]
    return (j == i - 1).float()  # (n, s)


def duplicate_token_pattern(tokens: Tensor, same: Tensor | None = None) -> Tensor:
    """(B, n, n) 0/1 target from tokens (B, n): query i → every earlier j with the same token."""
    return _copies(tokens, same)[1].float()


def induction_pattern(tokens: Tensor, same: Tensor | None = None) -> Tensor:
    """(B, n, n) 0/1 target: query i → key j when tokens[j − 1] == tokens[i] and j − 1 < i.

    The duplicate-token pattern shifted one key to the right (Olsson et al. 2022).
    """
    return _copies(tokens, same)[2].float()


def copies_pattern(tokens: Tensor, same: Tensor | None = None) -> Tensor:
    """(B, n, n) 0/1: query i → every other position j holding the same token, on either side."""
    return _copies(tokens, same)[3].float()


def _copies(tokens: Tensor, same: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Where the query's token occurs, each (B, n, n) bool from tokens (B, n): ``(same`` (the
    query itself too), ``earlier`` (the copies before it), ``successors`` (the key right after
    each earlier copy), ``others`` (every copy but itself, either side)``)``: the sets every
    token rule here is made of, each built once."""
    same = same_token(tokens) if same is None else same
    earlier = torch.tril(same, diagonal=-1)
    # key j follows an earlier copy when key j − 1 is one: the copies moved one key right
    successors = F.pad(earlier[..., :-1], (1, 0))
    others = same & ~torch.eye(same.shape[-1], dtype=torch.bool, device=same.device)
    return same, earlier, successors, others


def token_rule_targets(
    tokens: Tensor, causal: bool, same: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """``(induction, duplicate)`` targets, each (B, n, n) 0/1, with the keys both rules predict
    left out of both.

    induction: the token right after an earlier copy of the query's token (Olsson et al.);
    duplicate: another copy of it (an earlier one under a causal mask). In a run of one token
    ("x x x") the key after an earlier copy *is* a copy, and may be the query itself: such a
    key tells neither rule from the other (nor from a current-token head), so it counts for
    neither; a query left with no target is a row where the head cannot be judged.
    """
    induction, duplicate = _token_rules(_copies(tokens, same), causal)
    return induction.float(), duplicate.float()


def _token_rules(
    copies: tuple[Tensor, Tensor, Tensor, Tensor], causal: bool
) -> tuple[Tensor, Tensor]:
    """:func:`token_rule_targets` as bool, from :func:`_copies`."""
    same, earlier, successors, others = copies
    return successors & ~same, (earlier if causal else others) & ~successors


def rare_word_targets(
    word_index: Tensor, zipf: list[list[float]], causal: bool
) -> tuple[Tensor, Tensor]:
    """``(rare (B, n), rows (B, n))`` for :func:`headlab.heads.scores.rare_word_score`.

    word_index (B, n): each token's word (−1 special); zipf: per sequence, each word's
    frequency on the Zipf scale (log10 per billion words; NaN for punctuation, which is not a
    word). Each token is given its word's frequency and :func:`rarest_word` marks the rare
    keys and the rows."""
    B, n = word_index.shape
    token_zipf = torch.full((B, n), float("nan"), dtype=torch.float64)
    for b in range(B):
        freq = torch.tensor(zipf[b], dtype=torch.float64)
        if freq.numel():
            looked_up = freq[word_index[b].clamp(0, freq.numel() - 1)]
            token_zipf[b] = torch.where(word_index[b] >= 0, looked_up, float("nan"))
    return rarest_word(word_index, token_zipf, causal)


def rarest_word(word_index: Tensor, zipf: Tensor, causal: bool) -> tuple[Tensor, Tensor]:
    """``(rare (B, n), rows (B, n))`` bool from word_index (B, n), each token's word (−1 for a
    special token), and zipf (B, n), the frequency of each token's word on the Zipf scale (NaN
    where it has none: a special token, punctuation). Tensor operations only: the static site's
    exported graph computes them from these two inputs.

    The rare keys are the pieces of the word(s) with the lowest frequency, position 0 left out
    (where a sink rests: attention there says nothing about rarity); a query can act when it is
    an ordinary token outside that word that can see one of its pieces (any, or an earlier one
    under a causal mask)."""
    known = (word_index >= 0) & ~zipf.isnan()  # (B, n): a token of a word with a frequency
    lowest = torch.where(known, zipf, float("inf")).amin(-1, keepdim=True)  # (B, 1)
    in_word = known & (zipf == lowest)  # every piece of the rarest word(s)
    first = torch.arange(in_word.shape[1], device=in_word.device) == 0
    rare = in_word & ~first
    seen = rare.long().cumsum(-1) > 0 if causal else rare.any(-1, keepdim=True).expand_as(rare)
    rows = seen & ~in_word & (word_index >= 0)
    return rare, rows


def rare_targets_of(probe: Probe, causal: bool) -> tuple[Tensor, Tensor] | None:
    """The rare-word targets of a text probe from wordfreq's English table: None without
    wordfreq, or for token probes (random ids are no sentence; their "words" have no
    frequency worth the name)."""
    if not probe.text or probe.word_index is None:
        return None
    try:
        zipf = [word_zipf(words) for words in probe.words]
    except ModuleNotFoundError:
        return None
    return rare_word_targets(probe.word_index, zipf, causal)


def shuffle_positions(tokens: Tensor, movable: Tensor, seed: int = 0) -> Tensor:
    """order (B, n): a seeded permutation per sequence that moves only the movable positions."""
    g = torch.Generator().manual_seed(seed)
    B, n = tokens.shape
    order = torch.arange(n).repeat(B, 1)  # (B, n)
    for b in range(B):
        free = movable[b].nonzero()[:, 0]
        order[b, free] = free[torch.randperm(free.numel(), generator=g)]
    return order


@dataclass(frozen=True)
class Targets:
    """Every type's targets on one probe, built once (:func:`build_targets`) and shared by all
    layers' scores. Shapes: tokens (B, n); matrices (B, n, n); rows (B, n)."""

    tokens: Tensor  # (B, n) token ids
    causal: bool  # the model's config.causal
    induction: Tensor  # token after an earlier copy, keys also copies left out (0/1)
    duplicate: Tensor  # other copies (earlier ones when causal), induction keys left out (0/1)
    induction_mul: Tensor  # TransformerLens's induction target (every earlier copy's successor)
    duplicate_mul: Tensor  # TransformerLens's duplicate target (every earlier copy)
    token_rules: Tensor  # (B, n, n) bool: a key some token rule predicts (positional leaves out)
    delimiters: Tensor  # (B, n) bool: special tokens after 0 and punctuation
    fixed: Tensor  # (B, n) bool: keys a position shuffle never moves
    rare: tuple[Tensor, Tensor] | None = None  # rare_word_targets, for a text probe

    @property
    def induction_rows(self) -> Tensor:
        """(B, n) bool: the queries an induction head can be judged on."""
        return self.induction.sum(-1) > 0

    @property
    def duplicate_rows(self) -> Tensor:
        """(B, n) bool: the queries a duplicate-token head can be judged on."""
        return self.duplicate.sum(-1) > 0

    @cached_property
    def stack(self) -> TargetStack:
        """The targets stacked for :func:`headlab.heads.scores.pattern_scores`, built on the
        first layer's call and shared by the others."""
        return stack_targets(self)


@dataclass(frozen=True)
class TargetStack:
    """A probe's targets stacked so that a few batched contractions score every target type of
    a layer's heads at once (:func:`headlab.heads.scores.stacked_masses`):

        dense     (K, B, n, n) 0/1 token targets: hits Σ_j A[b, h, i, j] · T[k, b, i, j]
        picks     (P, n) long: one key per query (an offset i + δ, or key 0); hits A[b, h, i, key]
        columns   (C, B, n) 0/1 marked keys: hits Σ_i Σ_j A[b, h, i, j] · marks[c, b, j]

    ``names`` orders the K + P + C scores. A target with rows is averaged over them per
    sequence and then over the sequences that have any (:func:`headlab.heads.scores.
    mass_where_possible`): its ``row_weight`` is rows / their count, its ``seq_weight`` valid /
    their count. The others are TransformerLens's Σ(A ⊙ P)/ΣA (``ratio``): every row counts and
    every sequence. Names starting "rest:" are the resting weights on key 0 off a type's rows.
    """

    names: tuple[str, ...]
    dense: Tensor  # (K, B, n, n)
    picks: Tensor  # (P, n) long key index, clamped into range (row_weight says where it counts)
    columns: Tensor  # (C, B, n)
    row_weight: Tensor  # (K + P, B, n) float
    seq_weight: Tensor  # (K + P + C, B) float64
    ratio: Tensor  # (K + P + C,) bool: normalised by the head's total attention
    reach: tuple[Tensor, Tensor, Tensor]  # positional_reach of the probe, token rules left out


def _picks(t: Targets) -> tuple[dict[str, Tensor], dict[str, Tensor], dict[str, Tensor]]:
    """The one-key-per-query targets of ``t``: name → key index (n,), the rows where the key
    exists (n,) bool, and for those averaged over rows, their (B, n) rows."""
    B, n = t.tokens.shape
    i = torch.arange(n)
    k = visible_keys(n, n, t.causal)  # (n,)
    offsets = {"previous": -1, "self": 0} | ({} if t.causal else {"next": 1})
    keys, valid, rows = {}, {}, {}
    for name, shift in offsets.items():
        keys[name] = i + shift
        valid[name] = (keys[name] >= 0) & (keys[name] < k) & (k >= 2)
        rows[name] = valid[name].expand(B, n)
    rests = {"duplicate": ~t.duplicate_rows, "induction": ~t.induction_rows}
    if t.rare is not None:
        rests["rare_word"] = ~t.rare[1]
    for name, idle in rests.items():
        keys[f"rest:{name}"] = torch.zeros(n, dtype=torch.long)
        valid[f"rest:{name}"] = torch.ones(n, dtype=torch.bool)
        rows[f"rest:{name}"] = idle
    keys["previous_mul"] = i - 1  # TransformerLens's previous-token target: every query
    valid["previous_mul"] = i >= 1
    return keys, valid, rows


def stack_targets(t: Targets) -> TargetStack:
    """The :class:`TargetStack` of ``t``: the same targets as :mod:`headlab.heads.scores`'
    single-score functions build, stacked (analysis runs without a cache: s == n)."""
    B, n = t.tokens.shape
    keys, valid, rows = _picks(t)
    rows |= {"induction": t.induction_rows, "duplicate": t.duplicate_rows}
    dense = ("induction", "duplicate", "induction_mul", "duplicate_mul")
    first = torch.zeros(B, n, dtype=torch.bool)
    first[:, 0] = True
    names = (*dense, *keys, "first_token", "delimiter", "rest:content")
    ones = torch.ones(B, n, dtype=torch.bool)
    scored = names[: len(dense) + len(keys)]  # the targets read a row at a time
    # each one's rows (K + P, B, n): its own where it is averaged over them, else every row
    # where its key exists, or every row; all of them at once
    r = torch.stack([rows.get(k, valid[k].expand(B, n) if k in valid else ones) for k in scored])
    ratio = torch.tensor([name not in rows for name in names])  # (K + P + C,)
    averaged = ~ratio[: len(scored)]  # (K + P,): averaged over its rows
    count = r.sum(-1)  # (K + P, B)
    weights = torch.where(averaged[:, None, None], r / count.clamp_min(1)[..., None], r.float())
    has = count > 0  # (K + P, B): the sequences with a row
    per_seq = (has / has.sum(-1, keepdim=True).clamp_min(1)).double()
    uniform = torch.full((len(names), B), 1.0 / B, dtype=torch.float64)
    uniform[: len(scored)] = torch.where(averaged[:, None], per_seq, uniform[: len(scored)])
    return TargetStack(
        names,
        torch.stack([getattr(t, name) for name in dense]).float(),
        torch.stack(list(keys.values())).clamp(0, n - 1),
        # the content score's rest: the fixed keys and the first position, which it leaves out
        torch.stack([first, t.delimiters.bool(), t.fixed.bool() | first]).float(),
        weights,
        uniform,
        ratio,
        positional_reach(B, n, n, t.causal, t.token_rules),
    )


def targets_of(
    tokens: Tensor,
    causal: bool,
    delimiters: Tensor | None = None,
    fixed: Tensor | None = None,
    rare: tuple[Tensor, Tensor] | None = None,
) -> Targets:
    """:class:`Targets` from token ids (B, n): the same-token matrix is built once here."""
    if tokens.dim() == 1:
        tokens = tokens.unsqueeze(0)
    copies = _copies(tokens)  # the same-token matrix and its sets, built once here
    _, earlier, successors, others = copies
    induction, duplicate = _token_rules(copies, causal)
    # one conversion to 0/1 for the four token targets
    dense = torch.stack([induction, duplicate, successors, earlier]).float()
    induction_f, duplicate_f, induction_mul, duplicate_mul = dense.unbind(0)
    no_keys = torch.zeros_like(tokens, dtype=torch.bool)
    return Targets(
        tokens,
        causal,
        induction_f,
        duplicate_f,
        induction_mul,
        duplicate_mul,
        others | successors,
        no_keys if delimiters is None else delimiters,
        no_keys if fixed is None else fixed,
        rare,
    )


def build_targets(probe: Probe, causal: bool, rare_words: bool = True) -> Targets:
    """Every type's targets on ``probe`` for a model whose ``config.causal`` is ``causal``;
    the rare-word targets too when ``rare_words`` and the probe is a text (with wordfreq)."""
    rare = rare_targets_of(probe, causal) if rare_words else None
    return targets_of(probe.tokens, causal, probe.delimiters, ~probe.movable, rare)


# the last probe's targets: (a weak reference to the probe, (causal, rare_words), its targets)
_LAST: list[tuple[weakref.ref[Any], tuple[bool, bool], Targets]] = []


def probe_targets(probe: Probe, causal: bool, rare_words: bool = True) -> Targets:
    """:func:`build_targets` with its stack, kept for the next call on the same probe: a probe
    is frozen, so analysing it again (another model, random-weights copies, the page asking
    twice) builds nothing. One probe's targets are held, the last one's, and let go with it."""
    for ref, key, targets in list(_LAST):
        if ref() is probe and key == (causal, rare_words):
            return targets
    targets = build_targets(probe, causal, rare_words)
    _ = targets.stack  # built here, once, as every layer's scores read it

    def forget(ref: weakref.ref[Any]) -> None:  # the probe is gone: so are its targets
        _LAST[:] = [held for held in _LAST if held[0] is not ref]

    _LAST[:] = [(weakref.ref(probe, forget), (causal, rare_words), targets)]
    return targets
