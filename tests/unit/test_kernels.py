"""The compiled content score and the grouped scoring of layers: each held to what it replaces.

The content score's compiled loops split their heads over Numba's threads (headlab.heads.kernels);
held to the plain-Python loop of the definition and to the same loops run by the caller alone,
at every thread count. Layers scored in groups (headlab.heads.report.LayerGroups) are held to
one layer at a time."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_content_score import loop_content, random_patterns

from headlab.heads import (
    LayerGroups,
    analyse,
    build_targets,
    content_score,
    kernels,
    layer_scorer,
    report,
)
from headlab.heads.content import _content_masks, content_parts
from headlab.measure import make_probe, reduce_patterns, repeated_random_tokens
from headlab.model import ModelConfig, Transformer


@pytest.fixture
def threads():
    """Restores PyTorch's thread count after a test that sets it."""
    before = torch.get_num_threads()
    yield torch.set_num_threads
    torch.set_num_threads(before)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("count", [1, 2, 3, 8])
def test_content_on_numbas_threads_equals_the_loop_and_the_caller_alone(
    causal: bool, count: int, threads, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Heads split across 1, 2, 3 and more threads than heads (5 heads): the same numbers as
    the caller working every head alone, and the definition's loop to float rounding."""
    threads(count)
    g = torch.Generator().manual_seed(20 + count)
    for B, n in [(1, 9), (3, 7), (2, 30)]:
        A = random_patterns(B, 5, n, causal, g)
        fixed = torch.rand(B, n, generator=g) < 0.2
        parallel = content_score(A, causal, fixed)
        with monkeypatch.context() as m:
            m.setattr(kernels, "_threads", lambda work: 1)
            alone = content_score(A, causal, fixed)
        assert torch.equal(parallel, alone), (B, n)
        want = loop_content(A, causal, fixed)
        assert parallel.tolist() == pytest.approx(want, abs=1e-6), (B, n)


def test_content_reads_any_layout_and_dtype() -> None:
    """A non-contiguous float64 view scores as its contiguous float32 copy."""
    g = torch.Generator().manual_seed(4)
    A = random_patterns(2, 6, 11, True, g)  # float64
    view = A.transpose(0, 1).contiguous().transpose(0, 1)  # the same values, strided
    assert not view.is_contiguous()
    want = content_score(A.float().contiguous(), True)
    assert torch.equal(content_score(view, True), want)


def test_rows_that_share_their_keys_add_the_by_key_weights_once_a_sequence() -> None:
    """Bidirectional rows all see their sequence's movable keys, so the loops add the by-key
    profile's weights once a sequence (kernels._shared_rows names the first row that counts);
    causal rows see different keys and are added one at a time. Either way the definition's
    sums (content_parts in PyTorch, float64) to float32 rounding, on sequences whose fixed
    keys differ, with a row of no weight."""
    g = torch.Generator().manual_seed(31)
    B, h, n = 3, 6, 23
    for causal in (False, True):
        A = random_patterns(B, h, n, causal, g).float()
        A[1, 2, 5] = 0.0  # a row of no weight
        fixed = torch.rand(B, n, generator=g) < 0.3
        sees, size, _ = _content_masks(B, n, causal, fixed)
        shared = kernels._shared_rows(sees.numpy(), size.numpy(), n)
        first = [int((size[b] >= 2).nonzero()[0]) for b in range(B)]
        assert shared.tolist() == ([-1] * B if causal else first)
        out = np.zeros((h, 2))
        kernels.content_parts_parallel(A.numpy(), sees.numpy(), size.numpy(), out)
        want = content_parts(A.double(), sees, size)
        assert out.flatten().tolist() == pytest.approx(want.flatten().tolist(), rel=1e-6), causal


def test_the_parallel_kernel_refuses_arrays_it_cannot_read(threads) -> None:
    threads(2)
    A = np.zeros((1, 2, 4, 4), np.float64)  # float64: the kernel reads float32
    sees, size = np.ones((1, 4, 4), np.float32), np.full((1, 4), 4, np.int64)
    with pytest.raises(ValueError, match="C-contiguous"):
        kernels.content_parts_parallel(A, sees, size, np.zeros((2, 2)))


def _model_and_probe(layers: int) -> tuple[Transformer, object]:
    config = ModelConfig(vocab_size=40, d_model=32, n_layers=layers, n_heads=4, max_len=40)
    model = Transformer(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.5)
    g = torch.Generator().manual_seed(3)
    tokens, _ = repeated_random_tokens(torch.arange(40), length=9, repeats=2, batch=2, generator=g)
    return model, make_probe("random-repeat", tokens, None)


@pytest.mark.parametrize("per_group", [1, 2, 5, 9])
def test_layers_scored_in_groups_equal_one_layer_at_a_time(
    per_group: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Five layers in groups of 1, 2 (2 + 2 + 1), 5 and more than there are: every score,
    offset, rest and kept pattern as layer_scorer gives one layer at a time, one scoring pass
    per group, and the groups joined (what analyse reads) as the layers one after another."""
    model, probe = _model_and_probe(5)
    targets = build_targets(probe, causal=True)
    single = reduce_patterns(model, probe.tokens, layer_scorer(targets, keep=None))
    B, h, n = probe.tokens.shape[0], 4, probe.tokens.shape[1]
    passes: list[int] = []
    scores = report.pattern_scores

    def counted(weights, *args, **kwargs):
        passes.append(weights.shape[1])
        return scores(weights, *args, **kwargs)

    monkeypatch.setattr(report, "pattern_scores", counted)
    groups = LayerGroups(targets, None, True, budget=per_group * B * (h + 1) * n * n * 4)
    reduce_patterns(model, probe.tokens, groups)
    grouped = groups.results()
    sizes = [min(per_group, 5 - k) for k in range(0, 5, per_group)]
    assert passes == [s * (h + 1) for s in sizes]
    assert len(grouped) == len(single) == 5
    for one, other in zip(single, grouped, strict=True):
        assert one.scores.keys() == other.scores.keys()
        for k in one.scores:
            assert one.scores[k].tolist() == pytest.approx(other.scores[k].tolist(), abs=1e-6)
        assert torch.equal(one.offsets, other.offsets)
        for k in one.rests:
            assert one.rests[k].tolist() == pytest.approx(other.rests[k].tolist(), abs=1e-6)
        assert one.kept.keys() == other.kept.keys() and len(one.kept) == h + 1
        assert all(torch.equal(one.kept[i], other.kept[i]) for i in one.kept)
    # what analyse reads: every group's scores joined, layer after layer
    joined = groups.stacked()
    for k in joined.scores:
        assert torch.equal(joined.scores[k], torch.cat([s.scores[k] for s in grouped])), k
    for k in joined.rests:
        assert torch.equal(joined.rests[k], torch.cat([s.rests[k] for s in grouped])), k
    assert torch.equal(joined.offsets, torch.cat([s.offsets for s in grouped]))
    assert [k.keys() for k in joined.kept] == [s.kept.keys() for s in grouped]


def test_a_group_holds_no_more_layers_than_the_model_has() -> None:
    """Given the model's layer count (as analyse gives it), the buffer is that many layers,
    not as many as the budget allows, and the scores are bit for bit the uncapped group's."""
    model, probe = _model_and_probe(3)
    targets = build_targets(probe, causal=True)
    capped, loose = LayerGroups(targets, None, True, layers=3), LayerGroups(targets, None, True)
    reduce_patterns(model, probe.tokens, capped, place=capped.place)
    reduce_patterns(model, probe.tokens, loose, place=loose.place)
    h = 4
    assert capped.flat.shape[1] == 3 * (h + 1) < loose.flat.shape[1]
    a, b = capped.stacked(), loose.stacked()
    assert all(torch.equal(a.scores[k], b.scores[k]) for k in b.scores)
    assert torch.equal(a.offsets, b.offsets)


def test_the_attention_writes_each_layer_into_the_groups_buffer() -> None:
    """analyse has each layer's softmax written where its group keeps it (LayerGroups.place
    through Trace.place): the recorded weights are that buffer, not a copy, and the scores,
    offsets and patterns are bit for bit those of the weights copied in."""
    model, probe = _model_and_probe(3)
    targets = build_targets(probe, causal=True)
    placed, copied = LayerGroups(targets, None, True), LayerGroups(targets, None, True)
    in_place: list[bool] = []

    def reduce(layer: int, weights: torch.Tensor) -> None:
        slot = placed.place(layer, tuple(weights.shape), weights.dtype, weights.device)
        in_place.append(slot is not None and slot.data_ptr() == weights.data_ptr())
        placed(layer, weights)

    reduce_patterns(model, probe.tokens, reduce, place=placed.place)
    reduce_patterns(model, probe.tokens, copied)
    assert in_place == [True, True, True]
    a, b = placed.stacked(), copied.stacked()
    assert all(torch.equal(a.scores[k], b.scores[k]) for k in b.scores)
    assert torch.equal(a.offsets, b.offsets)
    assert all(torch.equal(x[i], y[i]) for x, y in zip(a.kept, b.kept, strict=True) for i in y)


def test_analyse_keeps_only_the_patterns_asked_for_in_any_group() -> None:
    """keep picks patterns from layers that share a group: those and no others, each the
    layer's own weights."""
    model, probe = _model_and_probe(3)
    picked = {(0, 1), (2, -1), (2, 3)}
    got = analyse(model, probe, keep=picked)
    full = analyse(model, probe)
    assert set(got.selected) == picked
    assert torch.equal(got.selected[0, 1], full.patterns[0, 1])
    assert torch.equal(got.selected[2, 3], full.patterns[2, 3])
    assert torch.equal(got.selected[2, -1], full.averaged_patterns[2])
