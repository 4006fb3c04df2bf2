"""The content score: the share of a head's attention its own position profile does not
explain, from the one forward's weights (:func:`content_score`; docs/heads.md).

Shape legend
    B   batch (probe sequences); h heads; n query (= key) positions

:func:`content_parts` is the definition, in PyTorch operations on any device; on the
CPU in float32 compiled loops compute the same numbers (:mod:`headlab.heads.kernels`, tested
equal to it), a head's rows one at a time: a few passes over a layer's weights where these
operations take a few dozen. The masks that depend on the probe alone (:func:`content_masks`)
are tensor operations on its fixed keys, so an exported graph builds them too.
"""

from __future__ import annotations

import torch
from torch import Tensor

from headlab.heads import fast
from headlab.heads.targets import as_batched

_TINY = 1e-30  # a divisor's floor: a profile or a row with no mass compares as nothing


def content_score(weights: Tensor, causal: bool, fixed: Tensor | None = None) -> Tensor:
    """The share of a head's attention that its own position profile does not explain, from
    the one forward's weights (B, h, n, n); fixed (B, n) bool marks the keys left out (BOS,
    [CLS], [SEP]), and so is the first position, whatever it holds: heads rest there, and a
    rest is a place, not a reading of the tokens. Returns (h,).

    Per query i: V_i the other keys it sees (j ≤ i under a causal mask), rows with |V_i| < 2
    skipped; Â_i the row renormalised on V_i, w_i = A_i(V_i) its share there, and
    u_ij = Â_ij · |V_i| (a uniform row is 1 everywhere, whatever its length). Two position
    profiles, each pooled over every query of every sequence, leave-one-out (row i never
    predicts itself), each row weighted by its w (a row that barely looks at V shapes the
    profile as little as it weighs in the score):

        by offset        R⁻ⁱ(d) = Σ w_i′ u_{i′, i′−d} / Σ w_i′, the other rows i′ that see i′ − d
        by key position  C⁻ⁱ(j) = Σ w_i′ u_{i′, j} / Σ w_i′, the other rows i′ that see key j

    Keys of V_i whose offset (key position) no other row sees are left out, both rows
    renormalised on the keys kept; P_i ∝ R⁻ⁱ(i − j) (∝ C⁻ⁱ(j)) and, with
    overlap(p, q) = Σ_j min(p_j, q_j), each profile's score is

        Σ_i w_i (1 − overlap(Â_i, P_i)) / (the rows with |V_i| ≥ 2, every sequence):

    a share of all the head's attention, its rest on the left-out keys counted as explained
    (a head resting 90% on the start token leaves at most 0.1 unexplained), and so is a row
    with no key kept or no weight on V_i. content = the smaller of the two: the better
    position explanation wins. A uniform head, a fixed-offset head (previous, current token)
    and a head always on one key position score 0; a head that follows token identity on
    shuffled or random text cannot be told from its positions and scores high. ``causal``:
    the model's config. Scored on the weights' device, in float64.
    """
    A, _ = as_batched(weights)
    B, h, n, _ = A.shape
    sees, size, every = content_masks(B, n, causal, fixed, A.device)
    if fast.usable(A):
        from headlab.heads.kernels import content_parts_parallel

        rows = A.detach().contiguous()
        out = torch.zeros(h, 2, dtype=torch.float64)
        content_parts_parallel(rows.numpy(), sees.numpy(), size.numpy(), out.numpy())
    else:
        out = content_parts(A, sees, size)
    # each profile's unexplained share (a rest on fixed keys: explained); the better one wins
    share = out.float() / every
    return share.amin(1).clamp(0, 1)  # rounding can step outside [0, 1]


def content_parts(A: Tensor, sees: Tensor, size: Tensor) -> Tensor:
    """Each head's unexplained attention under both position profiles, summed over its rows:
    A (B, h, n, n) weights, sees (B, n, n) 0/1 the keys each query is compared on (V_i),
    size (B, n) how many → (h, 2), computed in float64: Σ_i w_i (1 − overlap_i) by key
    position (0) and by offset (1), over the rows with |V_i| ≥ 2 and w_i > 0
    (:func:`content_score`'s formulas).

    Every row of every sequence at once: the profiles' sums Σ |V_i|·A_ij, weights Σ w_i and
    row counts at each cell (key j, or offset cell j − i + n − 1), then each row's
    leave-one-out profile q at its kept keys (cells more than one row sees), the row and q
    renormalised there, and 1 − Σ_j min."""
    h, n = A.shape[1:3]
    A = A.double()  # a row leaves itself out of the profiles by subtracting from their sums
    S = sees.to(A.dtype)[:, None]  # (B, 1, n, n)
    scale = torch.where(size >= 2, size, 0).to(A.dtype)[:, None, :, None]  # (B, 1, n, 1): |V_i|
    seen = A * S  # (B, h, n, n)
    t = seen.sum(-1, keepdim=True)  # (B, h, n, 1): each row's weight on V_i
    w = torch.where((scale > 0) & (t > 0), t, 0.0)  # (B, h, n, 1): w_i, 0 where it does not count
    counted = (w > 0).to(A.dtype)
    # each cell's sum (every row), weight and count (the rows that count), (3, h, n, n) a pair
    parts = torch.stack([(scale * seen).sum(0), (w * S).sum(0), (counted * S).sum(0)])
    keys = torch.arange(n, device=A.device)
    cell = keys[None, :] - keys[:, None] + n - 1  # (n, n): query i's key j → offset cell
    by_offset = torch.zeros(3, h, 2 * n - 1, dtype=A.dtype, device=A.device)
    by_offset.index_add_(2, cell.flatten(), parts.flatten(2))  # (3, h, 2n − 1)
    profiles = (parts.sum(2)[:, :, None, :], by_offset[:, :, cell])  # by key (3, h, 1, n), offset
    out = []
    for total, weight, count in profiles:
        kept = S * (count > 1.5)  # (B, h, n, n): seen, at a cell another row sees too
        q = kept * (total - scale * A) / (weight - w).clamp_min(_TINY)  # the other rows' profile
        p = (A * kept).sum(-1)  # (B, h, n): the row's mass on the kept keys
        f = p / q.sum(-1).clamp_min(_TINY)  # q renormalised to the row's mass there
        overlap = torch.minimum(A, q * f[..., None]).sum(-1) / p.clamp_min(_TINY)
        unexplained = torch.where(kept.sum(-1) > 0, 1 - overlap, 0.0)  # (B, h, n)
        out.append((w[..., 0] * unexplained).sum((0, 2)))
    return torch.stack(out, 1)


def content_masks(
    B: int, n: int, causal: bool, fixed: Tensor | None, device: torch.device | str = "cpu"
) -> tuple[Tensor, Tensor, Tensor]:
    """What :func:`content_score` compares on a probe: the keys each query sees (B, n, n)
    float32 0/1, how many (B, n) int64, and the rows with two or more (at least 1, a divisor;
    a 0-d int64 tensor), on ``device``. Tensor operations on ``fixed`` (B, n) bool (None: no
    key fixed), so that an exported graph computes them from its input."""
    free = torch.ones(B, n, dtype=torch.bool, device=device)
    if fixed is not None:
        free = ~fixed.to(device, torch.bool)
    # the first position too, whatever token it holds: heads rest there (an attention sink
    # forms on the first token, Xiao et al. 2023), and a rule plus that rest is still a rule
    free = free & (torch.arange(n, device=device) > 0)
    sees = free[:, None, :].expand(B, n, n)  # (B, n, n): query i sees key j
    if causal:
        sees = sees & torch.ones(n, n, dtype=torch.bool, device=device).tril()
    size = sees.sum(-1)
    every = (size >= 2).sum().clamp_min(1)
    return sees.float().contiguous(), size.contiguous(), every


def _content_masks(
    B: int, n: int, causal: bool, fixed: Tensor | None
) -> tuple[Tensor, Tensor, int]:
    """:func:`content_masks` on the CPU, the row count as an int."""
    sees, size, every = content_masks(B, n, causal, fixed)
    return sees, size, int(every)
