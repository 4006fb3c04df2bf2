"""Head masks, head importance and pruning curves.

Shape legend
    L        layers
    h        heads per layer
    B, n     batch and tokens
    mask     head mask (L, h) of floats: 1 keeps a head, 0 removes it (its output is zeroed
             before W_O), as ``Transformer.forward(head_mask=...)`` takes it

Everything here works on a *head loss*: a function ``loss_fn(batch, head_mask) -> scalar tensor``,
so the same code prunes headlab's own models, converted Hugging Face models, or anything else that
accepts a per-head mask. :func:`head_loss` builds one from a model that takes
``model(tokens, head_mask=mask) -> logits``.

Papers: Michel, Levy and Neubig 2019, "Are Sixteen Heads Really Better than One?" (head
importance I_h = E_x |∂L(x)/∂ξ_h| for a multiplicative head mask ξ, normalised per layer, and
pruning in order of importance); Voita et al. 2019, "Analyzing Multi-Head Self-Attention"
(most heads can go).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

HeadLoss = Callable[[Any, Tensor], Tensor]
Head = tuple[int, int]  # (layer, head)


def head_loss(model: Callable[..., Tensor], loss: Callable[..., Tensor] | None = None) -> HeadLoss:
    """``loss_fn(batch, head_mask)`` from a model that takes ``head_mask``: by default the
    next-token cross-entropy of :func:`headlab.measure.next_token_loss`, whose batch is tokens
    (B, n + 1) or ``(inputs, targets)`` with −100 = skip (masked-token loss when only masked
    positions carry a target)."""
    from headlab.measure import next_token_loss

    chosen = loss or next_token_loss

    def loss_fn(batch: Any, head_mask: Tensor) -> Tensor:
        return chosen(model, batch, head_mask=head_mask)

    return loss_fn


def full_mask(n_layers: int, n_heads: int, pruned: Iterable[Head] = ()) -> Tensor:
    """A (L, h) head mask of ones with zeros at the ``pruned`` (layer, head) pairs."""
    mask = torch.ones(n_layers, n_heads)
    for layer, head in pruned:
        if not (0 <= layer < n_layers and 0 <= head < n_heads):
            raise ValueError(
                f"head {layer}.{head} does not exist; layers 0..{n_layers - 1}, "
                f"heads 0..{n_heads - 1}"
            )
        mask[layer, head] = 0.0
    return mask


@torch.no_grad()
def masked_loss(loss_fn: HeadLoss, batches: Sequence[Any], head_mask: Tensor) -> float:
    """Mean loss over ``batches`` with the heads of ``head_mask`` (L, h) scaled."""
    if not batches:
        raise ValueError("masked_loss needs at least one batch")
    return sum(float(loss_fn(b, head_mask)) for b in batches) / len(batches)


def head_importance(
    loss_fn: HeadLoss,
    batches: Sequence[Any],
    n_layers: int,
    n_heads: int,
    normalize: bool = True,
    head_mask: Tensor | None = None,
) -> Tensor:
    """Michel et al. 2019 head importance, (L, h): the mean over batches of |∂L/∂ξ_h|.

    ξ (L, h) is the head mask, evaluated at ones (or at ``head_mask``, so heads already pruned
    stay pruned); its gradient is taken per batch, as the authors' code does. With ``normalize``
    each layer's scores are divided by their L2 norm (their per-layer normalisation), which makes
    scores comparable across layers.
    """
    if not batches:
        raise ValueError("head_importance needs at least one batch")
    base = torch.ones(n_layers, n_heads) if head_mask is None else head_mask.detach().clone()
    total = torch.zeros(n_layers, n_heads)
    for batch in batches:
        xi = base.clone().requires_grad_(True)
        (grad,) = torch.autograd.grad(loss_fn(batch, xi), xi)
        total += grad.abs()
    importance = total / len(batches)
    if normalize:
        importance = importance / (importance.norm(dim=-1, keepdim=True) + 1e-20)
    return importance  # (L, h)


def importance_order(importance: Tensor) -> list[Head]:
    """Every (layer, head), least important first (ties broken by layer, then head)."""
    n_heads = importance.shape[1]
    flat = importance.flatten().tolist()
    idx = sorted(range(len(flat)), key=lambda i: (flat[i], i))
    return [(i // n_heads, i % n_heads) for i in idx]


def random_order(n_layers: int, n_heads: int, seed: int) -> list[Head]:
    """Every (layer, head) in a seeded random order."""
    gen = torch.Generator().manual_seed(seed)
    perm = torch.randperm(n_layers * n_heads, generator=gen).tolist()
    return [(i // n_heads, i % n_heads) for i in perm]


@dataclass(frozen=True)
class PruningCurve:
    """Loss after removing the first k heads of ``order``: ``losses[i]`` with ``removed[i]``
    heads gone (by default every k = 0 … len(order); :func:`pruning_curve` with ``every`` > 1
    measures every ``every``-th k and the last).

    ``losses[0]`` is the unpruned loss. ``order`` lists (layer, head) pairs.
    """

    order: list[Head]
    losses: list[float]
    removed: list[int] | None = None  # heads removed at each loss; None: 0, 1, …, len(order)

    @property
    def counts(self) -> list[int]:
        """How many heads were removed at each measured loss."""
        return list(range(len(self.losses))) if self.removed is None else list(self.removed)

    def loss_after(self, fraction: float) -> float:
        """The loss with round(fraction × heads) heads removed (the nearest measured count)."""
        target = round(fraction * len(self.order))
        counts = self.counts
        nearest = min(range(len(counts)), key=lambda i: (abs(counts[i] - target), i))
        return self.losses[nearest]

    def prunable(self, tolerance: float) -> int:
        """How many heads go, in order, before the loss first exceeds (1 + tolerance) × base.

        The count stops at the first crossing, so a later dip back under the line is not counted.
        On a curve measured every few heads it is the last measured count under the line.
        """
        limit = self.losses[0] * (1.0 + tolerance)
        for i, loss in enumerate(self.losses):
            if loss > limit:
                return self.counts[i - 1]
        return len(self.order)

    def prunable_fraction(self, tolerance: float) -> float:
        """:meth:`prunable` as a fraction of all heads."""
        return self.prunable(tolerance) / len(self.order)


def pruning_curve(
    loss_fn: HeadLoss,
    batches: Sequence[Any],
    order: Sequence[Head],
    n_layers: int,
    n_heads: int,
    every: int = 1,
) -> PruningCurve:
    """Remove the heads of ``order`` one at a time, re-measuring the loss after each (after every
    ``every``-th and the last, for a large model where each measurement is a forward pass)."""
    mask = torch.ones(n_layers, n_heads)
    losses, removed = [masked_loss(loss_fn, batches, mask)], [0]
    for k, (layer, head) in enumerate(order, start=1):
        mask[layer, head] = 0.0
        if k % every == 0 or k == len(order):
            losses.append(masked_loss(loss_fn, batches, mask))
            removed.append(k)
    return PruningCurve(list(order), losses, None if every == 1 else removed)
