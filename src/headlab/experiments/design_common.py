"""Helpers shared by the head-design experiments (one_vs_many, head_count, prune, gqa).

Seeds are summarised as mean, sample standard deviation, minimum and maximum, with every value
kept. Writing results and figures is :mod:`headlab.experiments`' own.
"""

from __future__ import annotations

import statistics
from typing import Any

import torch
from torch import nn

from headlab.measure import next_token_loss
from headlab.training.train import BatchFn, LossFn, TrainConfig, TrainResult, train


def spread(values: list[float]) -> dict[str, Any]:
    """Mean, sample standard deviation (0 for one value), min, max and the values themselves."""
    if not values:
        raise ValueError("spread needs at least one value")
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    return {
        "mean": statistics.fmean(values),
        "std": std,
        "min": min(values),
        "max": max(values),
        "values": list(values),
    }


def fit(
    model: nn.Module, config: TrainConfig, batches: BatchFn, loss_fn: LossFn | None = None
) -> TrainResult:
    """headlab's one training loop, quiet and in memory (no checkpoints)."""
    return train(model, config, batches, loss_fn=loss_fn or next_token_loss)


@torch.no_grad()
def mean_loss(model: nn.Module, batches: list[Any], loss_fn: LossFn | None = None) -> float:
    """Mean of ``loss_fn(model, batch)`` over fixed evaluation batches, in eval mode."""
    loss_fn = loss_fn or next_token_loss
    was = model.training
    model.eval()
    try:
        return sum(float(loss_fn(model, b)) for b in batches) / len(batches)
    finally:
        model.train(was)
