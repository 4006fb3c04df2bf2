"""The label is made in one place (headlab.heads.labels.decide): its label, the type it rests
on, the floor and margin of that type and the label the floors took away, held to the rule
written out type by type, on random scores, offsets and floors."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from headlab.heads.labels import (
    FIRST_TIER,
    LABELS,
    OFFSET_LABELS,
    THRESHOLDS,
    TIERS,
    decide,
    label_head,
    passes,
)

TYPES = [k for k in THRESHOLDS if k != "retrieval"]


def by_hand(scores: dict[str, float], offset: int, floors: dict[str, float] | None):
    """The rule from its text: tiers in order; in the first tier with a type at or above both
    its threshold and its floor (above 0.1 for retrieval; induction_active only where the
    induction score is at least 0.25), the type of the widest share of the way from threshold
    to 1 wins; a positional win is named by the offset. A mixed head rests on the type nearest
    to passing."""
    for tier in (FIRST_TIER, *TIERS):
        ok = []
        for k in tier:
            if k not in scores:
                continue
            t = THRESHOLDS[k]
            above = scores[k] > t if k == "retrieval" else scores[k] >= t
            if k == "induction_active" and scores.get("induction", 0.0) < 0.25:
                continue
            if above and scores[k] >= (floors or {}).get(k, float("-inf")):
                ok.append(k)
        if ok:
            best = max(ok, key=lambda k: (scores[k] - THRESHOLDS[k]) / (1 - THRESHOLDS[k]))
            name = OFFSET_LABELS.get(offset, "positional") if best == "positional" else LABELS[best]
            return name, best
    typed = [k for k in scores if k in THRESHOLDS]
    return "mixed", max(typed, key=lambda k: (scores[k] - THRESHOLDS[k]) / (1 - THRESHOLDS[k]))


unit = st.floats(0, 1, allow_nan=False)
scores_st = st.dictionaries(st.sampled_from([*TYPES, "retrieval", "induction_mul"]), unit).filter(
    lambda s: any(k in THRESHOLDS for k in s)
)
floors_st = st.none() | st.dictionaries(st.sampled_from(TYPES), unit)


@settings(max_examples=400, deadline=None)
@given(scores=scores_st, offset=st.integers(-3, 3), floors=floors_st)
def test_decide_follows_the_rule_as_written(scores, offset, floors) -> None:
    d = decide(scores, offset, floors)
    label, kind = by_hand(scores, offset, floors)
    assert (d.label, d.kind) == (label, kind)
    assert label_head(scores, offset, floors) == label
    plain = by_hand(scores, offset, None)[0]
    assert d.plain == plain
    assert d.below_floor == ("" if plain == label else plain)
    if floors is not None and kind in floors:
        assert d.floor == floors[kind] and d.margin == pytest.approx(scores[kind] - floors[kind])
    else:
        assert d.floor is None and d.margin is None


def test_retrieval_must_exceed_its_line_and_every_other_type_reach_it() -> None:
    """Wu et al. 2024 count heads whose retrieval score is above 0.1; a score of exactly 0.1
    (one token of a ten-token needle) is not a retrieval head. Every other type passes at its
    threshold."""
    assert not passes("retrieval", 0.1) and passes("retrieval", 0.1001)
    assert decide({"retrieval": 0.1, "first_token": 0.9}).label == "sink"
    assert decide({"retrieval": 0.2, "first_token": 0.9}).label == "retrieval"
    for kind in TYPES:
        assert passes(kind, THRESHOLDS[kind]) and not passes(kind, THRESHOLDS[kind] - 1e-9)
        assert not passes(kind, THRESHOLDS[kind], floor=THRESHOLDS[kind] + 0.01)
