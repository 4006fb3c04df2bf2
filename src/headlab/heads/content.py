"""The content score: the share of a head's attention its own position profile does not
explain, from the one forward's weights (:func:`content_score`; docs/heads.md).

Shape legend
    B   batch (probe sequences); h heads; n query (= key) positions

The arithmetic runs in compiled loops (:func:`headlab.heads.kernels.content_parts`), a head's
rows one at a time, split by head across PyTorch's threads: a few passes over a layer's
weights where PyTorch's operations took a few dozen. The masks that depend on the probe alone
are built once for it and shared by its layers.
"""

from __future__ import annotations

import functools

import numpy as np
import torch
from torch import Tensor

from headlab.heads.targets import as_batched


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
    the model's config. Weights on any device are scored on the CPU in float32.
    """
    A, _ = as_batched(weights)
    B, h, n, _ = A.shape
    from headlab.heads.kernels import content_parts_parallel  # Numba: loaded on first use

    sees, size, every = _content_masks(B, n, causal, fixed)
    rows = A.detach().to("cpu", torch.float32).contiguous().numpy()
    out = np.zeros((h, 2))  # per head: the unexplained sums by key position and by offset
    content_parts_parallel(rows, sees, size, out)
    # each profile's unexplained share (a rest on fixed keys: explained); the better one wins
    share = torch.from_numpy(out).float() / every
    return share.amin(1).clamp(0, 1)  # rounding can step outside [0, 1]


def _content_masks(
    B: int, n: int, causal: bool, fixed: Tensor | None
) -> tuple[np.ndarray, np.ndarray, int]:
    """What :func:`content_score` compares on a probe: the keys each query sees (B, n, n)
    float32 0/1, how many (B, n) int64, and the rows with two or more (at least 1, a
    divisor). They depend on the probe alone, so they are built once and shared by every
    layer (read-only)."""
    key = b"" if fixed is None else fixed.bool().cpu().contiguous().numpy().tobytes()
    return _masks(B, n, causal, key)


@functools.lru_cache(maxsize=8)
def _masks(B: int, n: int, causal: bool, fixed: bytes) -> tuple[np.ndarray, np.ndarray, int]:
    """:func:`_content_masks` from the fixed keys' bytes (empty: none fixed)."""
    free = torch.ones(B, n, dtype=torch.bool)
    if fixed:
        free = ~torch.frombuffer(bytearray(fixed), dtype=torch.bool).view(B, n)
    # the first position too, whatever token it holds: heads rest there (an attention sink
    # forms on the first token, Xiao et al. 2023), and a rule plus that rest is still a rule
    free[:, 0] = False
    sees = free[:, None, :].expand(B, n, n)  # (B, n, n): query i sees key j
    if causal:
        sees = sees & torch.ones(n, n, dtype=torch.bool).tril()
    size = sees.sum(-1)
    every = max(int((size >= 2).sum()), 1)
    return sees.float().contiguous().numpy(), size.contiguous().numpy(), every
