"""Head masks, Michel et al. importance and pruning curves, checked against independent oracles:
finite differences of the loss, and heads removed by zeroing their slice of W_O by hand."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from headlab.ablation import (
    PruningCurve,
    full_mask,
    head_importance,
    head_loss,
    importance_order,
    masked_loss,
    pruning_curve,
    random_order,
)
from headlab.attention import MultiHeadAttention


class TinyStack(nn.Module):
    """Embedding, L causal attention layers with residuals, unembedding: a model with head_mask."""

    def __init__(self, vocab: int = 11, d_model: int = 16, n_layers: int = 2, n_heads: int = 4):
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        self.layers = nn.ModuleList(MultiHeadAttention(d_model, n_heads) for _ in range(n_layers))
        self.unembed = nn.Linear(d_model, vocab)

    def forward(self, tokens: Tensor, head_mask: Tensor | None = None) -> Tensor:
        x = self.embed(tokens)
        for i, layer in enumerate(self.layers):
            mask = None if head_mask is None else head_mask[i]
            x = x + layer(x, causal=True, head_mask=mask)
        return self.unembed(x)


def _setup() -> tuple[TinyStack, list[Tensor]]:
    model = TinyStack().double()
    gen = torch.Generator().manual_seed(1)
    batches = [torch.randint(0, 11, (3, 9), generator=gen) for _ in range(2)]
    return model, batches


def test_importance_matches_finite_differences() -> None:
    model, batches = _setup()
    loss_fn = head_loss(model)
    got = head_importance(loss_fn, batches, 2, 4, normalize=False)
    eps = 1e-6
    expected = torch.zeros(2, 4, dtype=torch.float64)
    for layer in range(2):
        for head in range(4):
            for b in batches:
                plus, minus = torch.ones(2, 4).double(), torch.ones(2, 4).double()
                plus[layer, head] += eps
                minus[layer, head] -= eps
                diff = (masked_loss(loss_fn, [b], plus) - masked_loss(loss_fn, [b], minus)) / (
                    2 * eps
                )
                expected[layer, head] += abs(diff) / len(batches)
    torch.testing.assert_close(got.double(), expected, rtol=1e-5, atol=1e-8)


def test_normalised_importance_has_unit_norm_per_layer() -> None:
    model, batches = _setup()
    imp = head_importance(head_loss(model), batches, 2, 4)
    torch.testing.assert_close(imp.norm(dim=-1), torch.ones(2, dtype=imp.dtype))


def test_zero_mask_equals_zeroing_the_heads_slice_of_W_O() -> None:
    model, batches = _setup()
    masked = masked_loss(head_loss(model), batches, full_mask(2, 4, [(0, 1), (1, 3)]))
    d_k = 4
    with torch.no_grad():
        model.layers[0].W_O.weight[:, 1 * d_k : 2 * d_k] = 0.0
        model.layers[1].W_O.weight[:, 3 * d_k : 4 * d_k] = 0.0
    by_hand = masked_loss(head_loss(model), batches, torch.ones(2, 4))
    assert masked == pytest.approx(by_hand, rel=1e-12)


def test_dead_head_has_zero_importance_and_goes_first() -> None:
    model, batches = _setup()
    with torch.no_grad():
        model.layers[1].W_O.weight[:, 2 * 4 : 3 * 4] = 0.0  # head 1.2 writes nothing
    imp = head_importance(head_loss(model), batches, 2, 4)
    assert imp[1, 2] == 0.0
    assert importance_order(imp)[0] == (1, 2)
    curve = pruning_curve(head_loss(model), batches, importance_order(imp), 2, 4)
    assert curve.losses[1] == pytest.approx(curve.losses[0], rel=1e-12)


def test_pruning_curve_matches_direct_masked_losses() -> None:
    model, batches = _setup()
    loss_fn = head_loss(model)
    order = random_order(2, 4, seed=3)
    assert sorted(order) == [(layer, head) for layer in range(2) for head in range(4)]
    curve = pruning_curve(loss_fn, batches, order, 2, 4)
    assert len(curve.losses) == 9
    for k in (0, 3, 8):
        direct = masked_loss(loss_fn, batches, full_mask(2, 4, order[:k]))
        assert curve.losses[k] == pytest.approx(direct, rel=1e-12)
    # with every head gone each layer adds only W_O's bias: the oracle computes that by hand
    with torch.no_grad():
        x = model.embed(batches[0]) + sum(layer.W_O.bias for layer in model.layers)
        logits = model.unembed(x)
        ref = F.cross_entropy(logits[:, :-1].flatten(0, 1), batches[0][:, 1:].flatten())
    assert masked_loss(loss_fn, batches[:1], torch.zeros(2, 4)) == pytest.approx(float(ref))


def test_prunable_counts_up_to_the_first_crossing() -> None:
    order = [(0, i) for i in range(5)]
    curve = PruningCurve(order=order, losses=[1.0, 1.005, 1.009, 1.02, 1.004, 1.5])
    assert curve.prunable(0.01) == 2
    assert curve.prunable(0.05) == 4
    assert curve.prunable(1.0) == 5
    assert curve.prunable_fraction(0.01) == pytest.approx(0.4)
    assert curve.loss_after(0.6) == 1.02


def test_strided_curve_measures_every_kth_removal_and_the_last() -> None:
    model, batches = _setup()
    loss_fn = head_loss(model)
    order = random_order(2, 4, seed=5)
    full = pruning_curve(loss_fn, batches, order, 2, 4)
    strided = pruning_curve(loss_fn, batches, order, 2, 4, every=3)
    assert strided.counts == [0, 3, 6, 8]
    assert strided.losses == pytest.approx([full.losses[k] for k in (0, 3, 6, 8)], rel=1e-12)
    hand = PruningCurve(
        order=[(0, i) for i in range(6)], losses=[1.0, 1.005, 1.02, 1.03], removed=[0, 2, 4, 6]
    )
    assert hand.prunable(0.01) == 2 and hand.prunable(0.025) == 4 and hand.prunable(0.1) == 6
    assert hand.loss_after(0.5) == 1.005  # 3 heads: counts 2 and 4 tie, the earlier is taken


def test_full_mask_rejects_heads_that_do_not_exist() -> None:
    with pytest.raises(ValueError, match=r"heads 0\.\.3"):
        full_mask(2, 4, [(0, 4)])
