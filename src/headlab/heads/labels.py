"""The labelling rule: thresholds, tiers, and the one function that names a head from its scores
(:func:`decide`); the report, the floors' gate, the evidence, ``compare``, the experiments, the
page and the static site all take their labels from it.

A type passes when its score reaches its threshold; labels go tier by tier (a named rule, then
content, then where the head rests: sink, delimiter, diffuse), the type passing by the widest
share of the way to a perfect score winning; else "mixed". A positional head is named by its
offset (−1 previous-token, 0 current-token, +1 next-token).

An induction head is judged on its active attention too, the attention it does not rest on the
first position (``induction_active``, :data:`NEEDS`): a head that copies where it can and parks
the rest of those rows on the first token is an induction head with a sink, not a sink.

A retrieval score (measured only on the needle probe, :mod:`headlab.heads.retrieval`) is judged
first: a head that copies the needle is named "retrieval" whatever else it does on the haystack.

Papers: Voita et al. 2019 (positional 90%, syntactic 10 points over the offset baseline); Gu et
al. 2024 (the sink threshold ε = 0.3); Wu et al. 2024 (retrieval heads exceed 0.1).
"""

from __future__ import annotations

from dataclasses import dataclass

SCORE_TYPES = (
    "previous",
    "next",
    "self",
    "positional",
    "duplicate",
    "induction",
    "induction_active",
    "content",
    "rare_word",
    "syntactic",
    "first_token",
    "delimiter",
    "diffuse",
    "retrieval",
)
# TransformerLens's head detector ("mul", exclude_bos=False, exclude_current_token=False):
# reported under their own names, never used for labels
MUL_TYPES = ("previous_mul", "duplicate_mul", "induction_mul")

# Mass scores are shares of attention over the rows where a type can act, so 0.5 means "most
# of it"; positional is Voita et al.'s 90% of queries; syntactic is Voita et al.'s 10 points
# over the best fixed-offset baseline; content asks that 40% of a head's attention lie where
# its own position profile does not put it, a rest on the first or a fixed token counting as
# explained (above every positional head and every sink of the default model, MiniLM and
# SmolLM2 on their built-in probes, at most 0.26, and every head of the default model's
# architecture with random weights, seeds 0-2, at most 0.38); diffuse for nearly uniform rows.
THRESHOLDS: dict[str, float] = {
    "previous": 0.5,
    "next": 0.5,
    "self": 0.5,
    "positional": 0.9,
    "duplicate": 0.5,
    "induction": 0.5,
    "induction_active": 0.5,
    "content": 0.4,
    "rare_word": 0.5,
    "syntactic": 0.1,
    "first_token": 0.5,
    "delimiter": 0.5,
    "diffuse": 0.9,
    "retrieval": 0.1,  # Wu et al. 2024: a retrieval head's score exceeds 0.1 (EXCEEDS)
}
# the types that must exceed their threshold rather than reach it: Wu et al. 2024 count the
# heads whose retrieval score is above 0.1 (a score is a multiple of 1 / the needle's length,
# so exactly 0.1 is common: one token of a ten-token needle)
EXCEEDS = frozenset({"retrieval"})
SINK_THRESHOLD = 0.3  # Gu et al. 2024's ε: a head whose mean weight on the first token exceeds it
# A type judged on a head's active attention (the attention it does not rest on the first
# position) → the plain score it is a share of, and the least that score must reach too. Most
# of a head's active attention on the copy's successor (0.5) makes it an induction head only
# while that is at least a quarter of all its attention where it can act (0.25, half the plain
# score's threshold): a head that rests nearly all its attention on the first token, and
# copies with the little left, stays a sink. On sentences typed twice the default model's
# induction heads give the copy 0.3-0.7 of their attention where they can copy and rest most
# of the rest on the first token; random weights of its shape give it at most 0.1 of either
# score (docs/heads.md).
NEEDS: dict[str, tuple[str, float]] = {"induction_active": ("induction", 0.25)}

# Judged before TIERS: on a needle probe, copying the needle is what the head is there for.
FIRST_TIER = ("retrieval",)
# Labels go tier by tier: what a head does where it acts by a named rule, then "follows the
# tokens" with no named rule, then where it rests (the first token, a delimiter, everywhere).
TIERS = (
    (
        "previous",
        "next",
        "self",
        "positional",
        "duplicate",
        "induction",
        "induction_active",
        "rare_word",
        "syntactic",
    ),
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
    "induction_active": "induction",
    "content": "content",
    "rare_word": "rare-word",
    "syntactic": "syntactic",
    "first_token": "sink",
    "delimiter": "delimiter",
    "diffuse": "diffuse",
    "retrieval": "retrieval",
}
OFFSET_LABELS = {-1: "previous-token", 0: "current-token", 1: "next-token"}

# The page's head types → the score that picks the best head of that type (an induction
# head's: its active share, what its label rests on).
BEST_TYPES = {
    "previous-token": "previous",
    "positional": "positional",
    "current-token": "self",
    "induction": "induction_active",
    "duplicate-token": "duplicate",
    "content": "content",
    "rare-word": "rare_word",
    "syntactic": "syntactic",
    "sink": "first_token",
    "retrieval": "retrieval",
}

# the label → the score whose "rest" (where the head rests off its rows) a head reports
REST_OF_LABEL = {
    "duplicate-token": "duplicate",
    "induction": "induction",
    "rare-word": "rare_word",
    "content": "content",
}


_ORDER = (FIRST_TIER, *TIERS)  # the order tiers are judged in


def passes(kind: str, score: float, floor: float | None = None) -> bool:
    """Whether ``score`` of type ``kind`` passes: at or above its threshold (above it, for the
    :data:`EXCEEDS` types) and at or above ``floor``, where one is given."""
    bar = THRESHOLDS[kind]
    over = score > bar if kind in EXCEEDS else score >= bar
    return over and (floor is None or score >= floor)


def qualifies(kind: str, scores: dict[str, float], floor: float | None = None) -> bool:
    """Whether type ``kind`` passes on a head's ``scores``: its score passes (:func:`passes`,
    with ``floor``) and, for a type in :data:`NEEDS`, the plain score it is a share of reaches
    its minimum too."""
    need = NEEDS.get(kind)
    enough = need is None or scores.get(need[0], 0.0) >= need[1]
    return enough and kind in scores and passes(kind, scores[kind], floor)


@dataclass(frozen=True)
class Decision:
    """A head's label and what it rests on (:func:`decide`)."""

    label: str  # a LABELS value, an OFFSET_LABELS value, or "mixed"
    # the score type the label rests on; for "mixed", the type nearest to passing (the widest
    # share, every one of them short), so a mixed head too reports how far it is from a label
    kind: str
    plain: str  # the label by thresholds alone (== label without floors)
    floor: float | None = None  # the floor of ``kind``, where floors were given and hold one
    margin: float | None = None  # the score of ``kind`` over that floor

    @property
    def below_floor(self) -> str:
        """The label that thresholds alone give where the floors took it away, else ""."""
        return "" if self.plain == self.label else self.plain


def _share(kind: str, score: float) -> float:
    """How far ``score`` is along the way from its threshold to a perfect score."""
    return (score - THRESHOLDS[kind]) / (1 - THRESHOLDS[kind])


def _rule(
    scores: dict[str, float], offset: int, floors: dict[str, float] | None
) -> tuple[str, str]:
    """(label, the type it rests on): tier by tier, the passing type (:func:`qualifies`) by the
    widest share (the first such in the tier's order on a tie). Written as plain loops: it runs
    once a head."""
    gates = floors or {}
    for tier in _ORDER:
        best, widest = "", 0.0
        for k in tier:
            score = scores.get(k)
            # below its line a type cannot pass (most do not: skip the full test)
            if score is None or score < THRESHOLDS[k] or not qualifies(k, scores, gates.get(k)):
                continue
            share = _share(k, score)
            if not best or share > widest:
                best, widest = k, share
        if best:
            if best == "positional":
                return OFFSET_LABELS.get(offset, "positional"), best
            return LABELS[best], best
    nearest, widest = "", 0.0
    for k, score in scores.items():
        if k in THRESHOLDS:
            share = _share(k, score)
            if not nearest or share > widest:
                nearest, widest = k, share
    return "mixed", nearest


def decide(
    scores: dict[str, float], offset: int = 0, floors: dict[str, float] | None = None
) -> Decision:
    """The label of a head from its scores: tier by tier (:data:`TIERS`), the type that passes
    (:func:`qualifies`: its threshold, and a type of :data:`NEEDS` its minimum) by the widest
    margin, measured as the share of the way from the threshold to a perfect score,
    (score − threshold) / (1 − threshold); "mixed" when none passes. A retrieval score (the
    needle probe's) is judged first (:data:`FIRST_TIER`). With ``floors`` (type → the
    random-weights mean + k · sd of its layer, from
    :meth:`headlab.heads.baselines.Baselines.floors`) a type passes only at or above its floor
    too: no label that random weights earn; the decision then carries the floor of the type
    the label rests on, the score's margin over it, and the label thresholds alone give.

    A positional head is named by its offset: −1 previous-token, 0 current-token, +1
    next-token; any other offset is "positional".
    """
    label, kind = _rule(scores, offset, floors)
    if floors is None:
        return Decision(label, kind, label)
    plain = _rule(scores, offset, None)[0]
    floor = floors.get(kind) if kind else None
    margin = None if floor is None else scores[kind] - floor
    return Decision(label, kind, plain, floor, margin)


def label_head(
    scores: dict[str, float], offset: int = 0, floors: dict[str, float] | None = None
) -> str:
    """The label alone of :func:`decide`."""
    return decide(scores, offset, floors).label
