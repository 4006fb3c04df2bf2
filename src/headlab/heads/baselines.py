"""What each score is worth by chance: the same score with random weights and on shuffled tokens.

Shape legend
    S   baseline seeds; L layers; h heads per layer

A score means something only beside what an untrained model earns on the same probe. For every
score of :func:`headlab.heads.analyse`:

    random weights   the same architecture (``model.config``) initialised at random with each
                     of :data:`BASELINE_SEEDS`, run on the same probe: per layer, the mean and
                     spread over its h heads and the S seeds (a random head has no identity, so
                     a layer's heads pool)
    shuffled tokens  the trained model on the probe with its movable tokens shuffled (one order
                     per seed): per head, the mean and spread over the S orders. A head that
                     keeps its score there scores positions, not the probe's token structure;
                     an induction head keeps it too, for a shuffled run still repeats tokens.
                     It is reported beside the score, never used to gate a label.

The labelling rule (:data:`K_SD`): a type passes when its score reaches its threshold *and*
the random-weights mean + K_SD · sd of its layer (:meth:`Baselines.floors`). The seeds differ
from the seeds a user would pick (0, 1, 2 …), so a random model scored against them is a fair
test of the rule. Elhage et al. 2021 and Olsson et al. 2022 compare with random baselines the
same way for composition scores.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import Tensor

from headlab.heads.report import HeadReport, analyse
from headlab.heads.targets import shuffle_positions
from headlab.measure import Probe, earlier_occurrence
from headlab.model import Transformer

BASELINE_SEEDS = (1000, 1001, 1002)  # the random initialisations and shuffle orders
K_SD = 3.0  # a label needs its score ≥ the random-weights mean + K_SD standard deviations


def score_tensor(report: HeadReport) -> dict[str, Tensor]:
    """Every score of a report as (L, h) tensors, keyed by score type."""
    L = max(s.layer for s in report.heads) + 1
    h = max(s.head for s in report.heads) + 1
    out: dict[str, Tensor] = {}
    for kind in report.heads[0].scores:
        out[kind] = torch.tensor([s.scores.get(kind, 0.0) for s in report.heads]).view(L, h)
    return out


def random_model(model: Any, seed: int) -> Transformer:
    """``model``'s architecture with random weights drawn from ``seed`` (its config's
    init_std), on the device and dtype of its embedding; the global RNG is left as it was."""
    weight = model.embed.weight
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        fresh = Transformer(model.config)
    return fresh.to(device=weight.device, dtype=weight.dtype).eval()


def random_weight_scores(
    model: Any, probe: Probe, seeds: tuple[int, ...] = BASELINE_SEEDS, content: bool = True
) -> dict[str, Tensor]:
    """Every score on ``probe`` of ``model``'s architecture with random weights, one model per
    seed: type → (S, L, h)."""
    runs = [score_tensor(analyse(random_model(model, s), probe, content=content, keep=()))
            for s in seeds]  # fmt: skip
    return {k: torch.stack([r[k] for r in runs]) for k in runs[0]}


def shuffled_probe(probe: Probe, seed: int) -> Probe:
    """``probe`` with each sequence's movable tokens shuffled (special tokens stay): the same
    tokens with the order, and so every repeat and phrase, broken up."""
    order = shuffle_positions(probe.tokens, probe.movable, seed + 1)
    tokens = probe.tokens.gather(1, order)  # (B, n)
    words = None if probe.word_index is None else probe.word_index.gather(1, order)
    labels = [probe.labels[j] for j in order[0].tolist()]
    return replace(probe, tokens=tokens, labels=labels, word_index=words,
                   delimiters=probe.delimiters.gather(1, order),
                   source=earlier_occurrence(tokens))  # fmt: skip


def shuffled_scores(
    model: Any, probe: Probe, seeds: tuple[int, ...] = BASELINE_SEEDS, content: bool = True
) -> dict[str, Tensor]:
    """Every score of the trained ``model`` on ``probe`` shuffled once per seed: type →
    (S, L, h)."""
    runs = [score_tensor(analyse(model, shuffled_probe(probe, s), content=content, keep=()))
            for s in seeds]  # fmt: skip
    return {k: torch.stack([r[k] for r in runs]) for k in runs[0]}


@dataclass(frozen=True)
class Baselines:
    """Each score's chance level on one probe (see the module docstring).

    ``random[type]`` is (2, L): per layer the mean and standard deviation over its heads and
    the seeds; ``shuffled[type]`` (2, L, h): per head the mean and standard deviation over the
    shuffle orders. Standard deviations are the sample ones (n − 1)."""

    seeds: tuple[int, ...]
    k: float
    random: dict[str, Tensor]
    shuffled: dict[str, Tensor]

    def floors(self) -> dict[int, dict[str, float]]:
        """layer → score type → the random-weights mean + k · sd a label must reach: the
        ``floors`` argument of :func:`headlab.heads.analyse`."""
        L = next(iter(self.random.values())).shape[1]
        return {l: {t: float(v[0, l] + self.k * v[1, l]) for t, v in self.random.items()}
                for l in range(L)}  # fmt: skip

    def of_head(self, layer: int, head: int) -> dict[str, dict[str, Any]]:
        """score type → {"random": {mean, sd, floor}, "shuffled": {mean, sd}} for one head."""
        out = {}
        for t, v in self.random.items():
            mean, sd = float(v[0, layer]), float(v[1, layer])
            entry: dict[str, Any] = {"random": {"mean": round(mean, 4), "sd": round(sd, 4),
                                                "floor": round(mean + self.k * sd, 4)}}  # fmt: skip
            if t in self.shuffled:
                s = self.shuffled[t][:, layer, head]
                entry["shuffled"] = {"mean": round(float(s[0]), 4), "sd": round(float(s[1]), 4)}
            out[t] = entry
        return out


def spread(values: Tensor, dims: tuple[int, ...]) -> Tensor:
    """Mean and sample standard deviation over ``dims`` → (2, ·); sd 0 for one sample."""
    count = 1
    for d in dims:
        count *= values.shape[d]
    mean = values.double().mean(dim=dims)
    sd = values.double().std(dim=dims) if count > 1 else torch.zeros_like(mean)
    return torch.stack([mean, sd]).float()


def baselines(
    model: Any,
    probe: Probe,
    seeds: tuple[int, ...] = BASELINE_SEEDS,
    content: bool = True,
    shuffled: bool = True,
) -> Baselines:
    """The random-weights and shuffled-tokens baselines of every score of ``model`` on
    ``probe``: 2 · S analyses (each one forward, two with ``content``); S without
    ``shuffled`` (the labels need the random weights only)."""
    rand = random_weight_scores(model, probe, seeds, content)
    shuf = shuffled_scores(model, probe, seeds, content) if shuffled else {}
    return Baselines(
        seeds=tuple(seeds),
        k=K_SD,
        random={k: spread(v, (0, 2)) for k, v in rand.items()},  # (S, L, h) → (2, L)
        shuffled={k: spread(v, (0,)) for k, v in shuf.items()},  # (S, L, h) → (2, L, h)
    )
