"""Every head's ablation effects in two stages: an estimate ranks every head, exact ablation of
the heads it ranks first gives their figures.

Shape legend
    S   heads (every head of the model, layer-major); B probe sequences; n tokens

:func:`estimate_heads` runs

    1. an estimate of every head's effects (:func:`headlab.heads.attribution.attribute_heads`):
       along each layer's path with two points (``steps=2``, the default: the gradient at the
       clean run and with every head of the layer half way to its ablated value, averaged) on
       the losses the ranking is by, plain attribution patching (``steps=1``) for the other
       quantities asked about
    2. exact batched ablation (:func:`headlab.heads.effects.ablate_heads`) of the ``check``
       heads the estimate ranks first on each ranking's loss, by the rise (``by="rise"``) or by
       the size of the effect, a fall too (``by="size"``), and of any heads asked for

and :class:`Checked` quotes the exact figure where a head was ablated exactly and the estimate
elsewhere: the figures are exact for the heads that matter, as long as the estimate puts them
among its first. The estimate alone misses what a head does through later layers' softmaxes
(:mod:`headlab.heads.attribution`); the layer path puts SmolLM2's previous-token head 16.0 first
where the plain estimate puts it 46th, and the exact stage orders the heads it checks as exact
ablation does.

Measured by ``benchmarks/bench_estimate.py`` on the repeat probe (loss over every token) against
exact mean ablation of every head (docs/evidence.md quotes the table): on SmolLM2 the layer path
with :data:`CHECK` heads checked ranks all 270 heads with Spearman ρ 0.95 and the 20 with the
largest exact effects with 1.00, the top fives alike, in 0.27–0.62 of the time of exact ablation
of every head over six runs on a shared two-core machine (20 checked: 0.92 over the top 20).
Plain attribution patching ranking by size on every token and on a later copy, with
:data:`CHECK_SIZE` heads of each checked (66 heads), gives 0.98 and 1.00 in 0.34–0.38 of the
time (two runs), on that repeat probe; on random tokens repeated (``--probe random-repeat``,
benchmarks/results/estimate_random_repeat.json) 0.92 and 0.88, the layer path 0.88 over the top
20: where the probe has a later copy the evidence ranks so (it finds the induction
circuit's heads on the later copy), elsewhere along the layer path. On the default model exact
ablation of every head costs less than either, and the evidence uses it there.

Papers: Nanda 2023 (attribution patching); Sundararajan, Taly and Yan 2017 (integrated
gradients); Marks et al. 2024 (a layer's nodes integrated together); Kramár et al. 2024 (AtP*:
attribution patching's misses, checked by exact patching of the components it ranks first).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import Tensor

from headlab.heads.attribution import Attributions, attribute_heads
from headlab.heads.baselines import Stages
from headlab.heads.effects import Ablations, Mode, ablate_heads
from headlab.measure import Probe

LAYER_STEPS = 2  # points on each layer's path: the clean run and half way (more do worse)
CHECK = 60  # heads of each ranking ablated exactly (SmolLM2, repeat: 20 give ρ 0.92, top 20)
# … of each of two rankings by size, every token and a later copy, by the plain estimate
# (SmolLM2 on the repeat probe: about 66 heads in all, ρ 1.00 over the top 20; 10 each, 18
# heads: 0.91; on random tokens repeated, 45 heads: 0.88)
CHECK_SIZE = 40


def exact_where_measured(
    estimate: Attributions | Ablations, exact: Ablations | None, rows: Tensor
) -> Tensor:
    """(S,) layer-major: each head's ablation effect on the mean loss over ``rows`` (B, n − 1)
    as headlab quotes it: ``exact``'s figure for each head it ablated, ``estimate``'s for the
    others (NaN for every head when no row is marked)."""
    out = estimate.loss_effect(rows).clone()
    if exact is not None and bool(rows.any()):
        measured = exact.loss_effect(rows)
        for s, head in enumerate(exact.heads):
            out[estimate.index(*head)] = measured[s]
    return out


@dataclass(frozen=True)
class Checked:
    """The estimate of every head's effects, and exact ablation of the heads it ranks first
    (:func:`estimate_heads`): answers as :class:`headlab.heads.effects.Ablations` does, with
    the exact figure where a head was ablated exactly and the estimate elsewhere."""

    estimate: Attributions
    exact: Ablations | None  # the checked heads (and any asked for), ablated exactly
    method = "estimate+exact"

    @property
    def heads(self) -> list[tuple[int, int]]:
        return self.estimate.heads

    def index(self, layer: int, head: int) -> int:
        return self.estimate.index(layer, head)

    def loss_effect(self, rows: Tensor) -> Tensor:
        """(S,) layer-major: the loss rise over ``rows`` (B, n − 1) with each head ablated,
        exact where it was ablated exactly, estimated elsewhere."""
        return exact_where_measured(self.estimate, self.exact, rows)

    @property
    def probe_passes(self) -> float:
        """Forwards of the probe in whole-model equivalents, each copy counted, both stages."""
        return self.estimate.probe_passes + (0.0 if self.exact is None else self.exact.probe_passes)

    def to_dict(self) -> dict[str, Any]:
        exact = None if self.exact is None else self.exact.to_dict()
        seconds = self.estimate.seconds + (0.0 if self.exact is None else self.exact.seconds)
        return {
            "method": self.method,
            "estimate": self.estimate.to_dict(),
            "exact": exact,
            "checked": 0 if self.exact is None else len(self.exact.heads),
            "probe_passes": round(self.probe_passes, 2),
            "seconds": round(seconds, 2),
        }


def first_ranked(
    estimate: Attributions, rows: Sequence[Tensor], check: int, by: str = "rise"
) -> set[tuple[int, int]]:
    """The ``check`` heads with the largest estimated loss rise over each of ``rows`` (``by``
    "rise"), or the largest in size, a fall too ("size")."""
    out: set[tuple[int, int]] = set()
    for r in rows:
        effect = estimate.loss_effect(r)
        if check > 0 and not bool(effect.isnan().all()):
            key = effect if by == "rise" else effect.abs()
            out |= {estimate.heads[int(s)] for s in key.argsort(descending=True)[:check]}
    return out


def estimate_heads(
    model: Any,
    probe: Probe,
    rows: Sequence[Tensor],
    induction_heads: Sequence[tuple[int, int]] = (),
    mode: Mode = "mean",
    check: int = CHECK,
    steps: int = LAYER_STEPS,
    exact: Collection[tuple[int, int]] = (),
    rank: Sequence[Tensor] | None = None,
    by: str = "rise",
    progress: Stages | None = None,
) -> Checked:
    """Every head's ablation effects in two stages (module docstring): the estimate along each
    layer's path (:func:`attribute_heads` with ``steps`` points, ``per="layer"``) on the loss
    over each row set of ``rank`` (default: every one of ``rows``), plain attribution patching
    for the other row sets and ``induction_heads``' scores; then exact batched ablation
    (:func:`headlab.heads.effects.ablate_heads`) of the ``check`` heads with the largest
    estimated loss rise (``by="rise"``; "size": the largest in size, a fall too) over each row
    set of ``rank``, of ``induction_heads`` and of ``exact``. ``steps=1``: plain attribution
    patching ranks. ``progress(stage, done, total)``: "estimate" (0 of 1) before the estimate,
    then "ablation" counting the heads ablated exactly. Other arguments as for
    :func:`attribute_heads`."""
    if check < 0:
        raise ValueError(
            f"check must be a whole number ≥ 0 (got {check}): the heads per row set ablated exactly"
        )
    if by not in ("rise", "size"):
        raise ValueError(f"by {by!r}: rank by the estimated loss 'rise' or by its 'size'")
    rank = list(rows) if rank is None else list(rank)
    report = progress or (lambda stage, done, total: None)
    report("estimate", 0, 1)
    path = attribute_heads(
        model, probe, rank, (), mode, steps=steps, per="layer" if steps > 1 else "head"
    )
    rest = [r for r in rows if not any(torch.equal(r.cpu(), q.cpu()) for q in rank)]
    estimate = path
    if rest or induction_heads:
        plain = attribute_heads(model, probe, rest, induction_heads, mode)
        estimate = replace(
            plain,
            row_sets=path.row_sets + plain.row_sets,
            steps=path.steps,
            per=path.per,
            forwards=path.forwards + plain.forwards,
            backwards=path.backwards + plain.backwards,
            seconds=path.seconds + plain.seconds,
            model_passes=path.model_passes + plain.model_passes,
            probe_passes=path.probe_passes + plain.probe_passes,
        )
    report("estimate", 1, 1)
    picked = first_ranked(path, rank, check, by) | set(induction_heads) | set(exact)
    if not picked:
        return Checked(estimate, None)

    def step(done: int, total: int) -> None:
        report("ablation", done, total)

    return Checked(estimate, ablate_heads(model, probe, sorted(picked), mode, progress=step))
