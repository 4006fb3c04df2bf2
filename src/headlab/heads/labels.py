"""The labelling rule: thresholds, tiers, and the one function that names a head from its scores.

A type passes when its score reaches its threshold; labels go tier by tier (a named rule, then
content, then where the head rests: sink, delimiter, diffuse), the type passing by the widest
share of the way to a perfect score winning; else "mixed". A positional head is named by its
offset (−1 previous-token, 0 current-token, +1 next-token).

A retrieval score (measured only on the needle probe, :mod:`headlab.heads.retrieval`) is judged
first: a head that copies the needle is named "retrieval" whatever else it does on the haystack.

Papers: Voita et al. 2019 (positional 90%, syntactic 10 points over the offset baseline); Gu et
al. 2024 (the sink threshold ε = 0.3); Wu et al. 2024 (retrieval heads, 0.1).
"""

from __future__ import annotations

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
    "content": 0.4,
    "rare_word": 0.5,
    "syntactic": 0.1,
    "first_token": 0.5,
    "delimiter": 0.5,
    "diffuse": 0.9,
    "retrieval": 0.1,  # Wu et al. 2024: a retrieval head scores at least 0.1
}
SINK_THRESHOLD = 0.3  # Gu et al. 2024's ε: a head whose mean weight on the first token exceeds it

# Judged before TIERS: on a needle probe, copying the needle is what the head is there for.
FIRST_TIER = ("retrieval",)
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
    "retrieval": "retrieval",
}
OFFSET_LABELS = {-1: "previous-token", 0: "current-token", 1: "next-token"}

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
    "retrieval": "retrieval",
}

# the label → the score whose "rest" (where the head rests off its rows) a head reports
REST_OF_LABEL = {"duplicate-token": "duplicate", "induction": "induction", "rare-word": "rare_word",
                 "content": "content"}  # fmt: skip


def label_head(
    scores: dict[str, float], offset: int = 0, floors: dict[str, float] | None = None
) -> str:
    """The label of a head from its scores: tier by tier (:data:`TIERS`), the type that passes
    its threshold by the widest margin, measured as the share of the way from the threshold
    to a perfect score, (score − threshold) / (1 − threshold); "mixed" when none passes.
    A retrieval score (the needle probe's) is judged first (:data:`FIRST_TIER`).
    With ``floors`` (type → the random-weights mean + k · sd of its layer, from
    :meth:`headlab.heads.baselines.Baselines.floors`) a type passes only at or above its floor
    too: no label that random weights earn.

    A positional head is named by its offset: −1 previous-token, 0 current-token, +1
    next-token; any other offset is "positional".
    """
    for tier in (FIRST_TIER, *TIERS):
        passing = {
            k: (scores[k] - THRESHOLDS[k]) / (1 - THRESHOLDS[k])
            for k in tier
            if k in scores and scores[k] >= max(THRESHOLDS[k], (floors or {}).get(k, 0.0))
        }
        if passing:
            best = max(passing, key=lambda k: passing[k])
            if best == "positional":
                return OFFSET_LABELS.get(offset, "positional")
            return LABELS[best]
    return "mixed"
