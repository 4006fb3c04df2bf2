"""The induction circuit as a small graph: previous-token heads feeding induction heads.

Olsson et al. 2022: an induction head finds the token after an earlier copy of the current one
by K-composition with a previous-token head of an earlier layer, whose output writes "the token
before me" into each position (Elhage et al. 2021). On repeated random tokens (their probe):

    nodes   the heads labelled previous-token and induction, each label needing its margin
            over random weights (:mod:`headlab.heads.baselines`)
    edges   every previous-token head → induction head of a later layer, with its
            K-composition score beside the random-matrix floor (:mod:`headlab.heads.
            composition`; for grouped-query models the K-group score too) and what ablating
            the previous-token head does to the induction head's score
            (:func:`headlab.heads.effects.ablate_heads`)

An edge is *drawn* when both hold: K-composition at or above the floor, and ablating the feeder
takes the induction score to at most :data:`CONFIRMED` of its clean value.

Papers: Olsson et al. 2022; Elhage et al. 2021.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from headlab.heads.baselines import baselines
from headlab.heads.composition import Composition, composition_scores
from headlab.heads.effects import Ablations, Mode, ablate_heads
from headlab.heads.report import HeadReport, analyse, unused_seed
from headlab.measure import Probe

CONFIRMED = 0.5  # ablating the feeder leaves at most this share of the induction score
# what to do when the floors' random copy does not fit (baselines.FloorsDoNotFit): no way round
NEEDS_FLOORS = (
    "the circuit's heads are labelled above those floors, so it runs only where that much "
    "memory is free"
)


@dataclass(frozen=True)
class Circuit:
    """The previous-token → induction graph of one model on one probe (module docstring)."""

    previous: list[dict[str, Any]]  # {"head": [l, h], "score"} per previous-token head
    induction: list[dict[str, Any]]  # {"head": [l, h], "score"} per induction head
    edges: list[dict[str, Any]]  # every candidate pair, with "drawn"
    k_floor: float  # the random-matrix floor of K-composition
    forwards: int  # forward passes of the ablations
    seconds: dict[str, float] = field(default_factory=dict)
    mode: str = "mean"

    @property
    def drawn(self) -> list[dict[str, Any]]:
        return [e for e in self.edges if e["drawn"]]

    def to_dict(self) -> dict[str, Any]:
        return {
            "previous": self.previous,
            "induction": self.induction,
            "edges": self.edges,
            "k_floor": round(self.k_floor, 4),
            "ablation": self.mode,
            "forwards": self.forwards,
            "seconds": {k: round(v, 2) for k, v in self.seconds.items()},
        }


def _nodes(report: HeadReport, label: str, score: str) -> list[dict[str, Any]]:
    return [
        {"head": [s.layer, s.head], "score": round(s.scores[score], 4)}
        for s in report.heads
        if s.label == label
    ]


def circuit_edges(
    previous: list[dict[str, Any]],
    induction: list[dict[str, Any]],
    comp: Composition,
    ablations: Ablations | None,
    group_of: int,
) -> list[dict[str, Any]]:
    """Every previous-token → later induction head pair, its K-composition (and K-group score:
    ``group_of`` query heads share a K/V head), and the induction score with the feeder
    ablated; "drawn" when both confirm it."""
    edges = []
    floor, group_floor = comp.floor("k"), comp.floor("k_group")
    for p in previous:
        for i in induction:
            (a, h1), (b, h2) = p["head"], i["head"]
            if a >= b:
                continue
            k = float(comp.scores["k"][a, h1, b, h2])
            kg = float(comp.scores["k_group"][a, h1, b, h2 // group_of])
            edge: dict[str, Any] = {
                "from": [a, h1],
                "to": [b, h2],
                "k_composition": round(k, 4),
                "k_group": round(kg, 4),
                "above_baseline": k >= floor,
                "group_above_baseline": kg >= group_floor,
            }
            confirmed = False
            if ablations is not None:
                before = float(ablations.clean_induction[b, h2])
                after = float(ablations.induction[ablations.index(a, h1), b, h2])
                edge["induction_score"] = {"clean": round(before, 4), "ablated": round(after, 4)}
                confirmed = before > 0 and after <= CONFIRMED * before
            edge["confirmed_by_ablation"] = confirmed
            edge["drawn"] = confirmed and k >= floor
            edges.append(edge)
    return sorted(edges, key=lambda e: -e["k_composition"])


def induction_circuit(
    model: Any, probe: Probe, mode: Mode = "mean", seed: int | None = None
) -> Circuit:
    """The induction circuit of ``model`` on ``probe`` (repeated random tokens: build it with
    ``build_probe("random-repeat", …)``). Costs 3 random-weight analyses (the floors), one
    analysis, the composition scores, and one clean plus one partial forward per layer that
    holds a previous-token head. ``seed`` changes nothing and is deprecated (the probe's tokens
    are seeded where it is built; :func:`headlab.heads.report.unused_seed`)."""
    unused_seed(seed, "induction_circuit")
    times: dict[str, float] = {}
    start = time.perf_counter()
    base = baselines(model, probe, content=False, shuffled=False)
    report = analyse(model, probe, content=False, keep=(), floors=base.floors())
    times["labels"] = time.perf_counter() - start
    previous = _nodes(report, "previous-token", "previous")
    induction = _nodes(report, "induction", "induction")
    start = time.perf_counter()
    comp = composition_scores(model, on_disk=True)
    times["composition"] = time.perf_counter() - start
    start = time.perf_counter()
    feeders = [tuple(p["head"]) for p in previous]
    causal = bool(model.config.causal and feeders and induction)
    ablations = ablate_heads(model, probe, feeders, mode) if causal else None
    times["ablation"] = time.perf_counter() - start
    c = model.config
    group_of = c.n_heads // (c.n_kv_heads or c.n_heads)
    edges = circuit_edges(previous, induction, comp, ablations, group_of)
    forwards = 0 if ablations is None else ablations.forwards
    return Circuit(previous, induction, edges, comp.floor("k"), forwards, times, mode)
