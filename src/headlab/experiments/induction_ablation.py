"""The induction experiment's ablation study: which heads the in-context gain needs.

Shape legend: B probe sequences, n context length, L layers, h heads per layer, S head sets.

What is found
    feeder heads        (2-layer models): every subset S of the layer-0 heads is ablated (outputs
                        zeroed) on the probe; effect(S) = (ablated − clean) / (unrepeated − clean),
                        the share of the in-context gain lost. The feeders are the smallest S
                        whose ablation removes most of the gain (effect ≥ 1/2) while ablating
                        all the other layer-0 heads removes little (≤ 1/4); among several of that
                        size, the one with the largest difference. Joint effects, not single
                        heads' effects, decide: a head that matters only together with another
                        (two heads sharing one job, or a query-side and a key-side partner) is
                        found. Each head's exact Shapley value over the same 2^h ablations is
                        reported beside it (a threshold-free share of the layer-0 effect).

Each head set is ablated with Michel et al. 2019's head masks (:func:`headlab.ablation.full_mask`);
the loss is the repeated-token loss of :func:`headlab.experiments.induction.metrics`.
"""

from __future__ import annotations

import itertools
import math
from typing import TYPE_CHECKING, Any

import torch

from headlab.ablation import full_mask
from headlab.measure import copy_targets, token_losses
from headlab.model import Transformer

if TYPE_CHECKING:  # the experiment imports this module; its data class is only named here
    from headlab.experiments.induction import HeldOut


def ablate(model: Transformer, data: HeldOut, heads: list[tuple[int, int]]) -> float:
    """Repeated-token loss with the outputs of ``heads`` zeroed (Michel et al. 2019's masks)."""
    return ablate_many(model, data, [heads])[0]


def ablate_many(
    model: Transformer, data: HeldOut, sets: list[list[tuple[int, int]]], chunk: int = 16
) -> list[float]:
    """:func:`ablate` for many head sets, ``chunk`` sets per forward pass: the probe is repeated
    once per set, each copy with its own (L, h) head mask."""
    L, h = model.config.n_layers, model.config.n_heads
    tokens = data.copies.tokens  # (B, n + 1)
    later = copy_targets(data.copies.source)[1]  # (B, n)
    out = []
    for start in range(0, len(sets), chunk):
        part = sets[start : start + chunk]
        masks = torch.stack([full_mask(L, h, heads) for heads in part])  # (S, L, h)
        mask = masks.repeat_interleave(tokens.shape[0], dim=0)  # (S·B, L, h)
        with torch.no_grad():
            losses = token_losses(model, tokens.repeat(len(part), 1), head_mask=mask)  # (S·B, n)
        out += [float(per_set[later].mean()) for per_set in losses.view(len(part), *later.shape)]
    return out


MOST, LITTLE = 0.5, 0.25  # feeders remove at least MOST of the gain, the rest at most LITTLE


def layer0_subsets(model: Transformer, data: HeldOut, span: float, clean: float) -> dict:
    """effect(S) for every subset S of layer 0's heads (frozenset of head indices; 2^h sets)."""
    h = model.config.n_heads
    subsets = [frozenset(c) for r in range(1, h + 1) for c in itertools.combinations(range(h), r)]
    losses = ablate_many(model, data, [[(0, i) for i in sorted(s)] for s in subsets])
    effects: dict[frozenset[int], float] = {frozenset(): 0.0}
    effects.update({s: (loss - clean) / span for s, loss in zip(subsets, losses, strict=True)})
    return effects


def shapley(effects: dict[frozenset[int], float], h: int) -> list[float]:
    """Each player's exact Shapley value of the game ``effects`` (all 2^h coalitions given):
    its marginal effect averaged over every order in which the players could be added."""
    values = []
    for i in range(h):
        total = 0.0
        for subset, effect in effects.items():
            if i in subset:
                continue
            weight = math.factorial(len(subset)) * math.factorial(h - len(subset) - 1)
            total += weight * (effects[subset | {i}] - effect)
        values.append(total / math.factorial(h))
    return values


def choose_feeders(effects: dict[frozenset[int], float], h: int) -> frozenset[int]:
    """The smallest subset removing ≥ MOST of the gain whose complement removes ≤ LITTLE;
    ties go to the largest difference; all of layer 0 when no smaller set qualifies."""
    every = frozenset(range(h))
    for size in range(1, h):
        fits = [
            s
            for s, e in effects.items()
            if len(s) == size and e >= MOST and effects[every - s] <= LITTLE
        ]
        if fits:
            return max(fits, key=lambda s: effects[s] - effects[every - s])
    return every


def ablation_study(model: Transformer, data: HeldOut, final: dict[str, Any]) -> dict[str, Any]:
    """Every head ablated alone; in a model of two layers or more, every subset of layer 0 (the
    feeder rule and Shapley values of the module docstring)."""
    clean, unrepeated = final["repeated_loss"], final["first_copy_loss"]
    span = max(unrepeated - clean, 1e-9)
    L, h = model.config.n_layers, model.config.n_heads
    heads = [(l, i) for l in range(L) for i in range(h)]
    losses = ablate_many(model, data, [[head] for head in heads])
    single = {f"{l}.{i}": loss for (l, i), loss in zip(heads, losses, strict=True)}
    out: dict[str, Any] = {
        "clean_repeated_loss": clean,
        "unrepeated_loss": unrepeated,
        "ablation": single,
        "ablation_effect": {name: (loss - clean) / span for name, loss in single.items()},
    }
    if L < 2:
        return out
    effects = layer0_subsets(model, data, span, clean)
    values = shapley(effects, h)
    feeders = choose_feeders(effects, h)
    others = frozenset(range(h)) - feeders
    out["feeder_heads"] = [
        {
            "head": f"0.{i}",
            "effect": out["ablation_effect"][f"0.{i}"],
            "shapley": values[i],
            "prev_token_score": float(final["prev_token"][0][i]),
        }
        for i in sorted(feeders, key=lambda i: -values[i])
    ]
    out["layer0_shapley"] = {f"0.{i}": v for i, v in enumerate(values)}
    out["layer0_subsets"] = {_names(s): e for s, e in effects.items() if s}
    out["ablate_feeders_effect"], out["ablate_others_effect"] = effects[feeders], effects[others]
    out["ablate_feeders_repeated_loss"] = clean + effects[feeders] * span
    out["ablate_others_repeated_loss"] = clean + effects[others] * span
    return out


def _names(subset: frozenset[int]) -> str:
    return "+".join(f"0.{i}" for i in sorted(subset))


def parse_head(name: str) -> tuple[int, int]:
    """'L.H', a head's name as the results write it → (layer, head)."""
    layer, head = name.split(".")
    return int(layer), int(head)
