"""The content score: the share of a head's attention its own position profile does not
explain, from the one forward's weights (:func:`content_score`; docs/heads.md).

Shape legend
    B   batch (probe sequences); h heads; n query (= key) positions

It makes a few dozen elementwise passes over a layer's (B, h, n, n) weights, as cheap as
PyTorch alone allows: each pass is one op into a buffer reused from the layer before
(:class:`Scratch`), the masks that depend on the probe alone are built once for it, and the
offset profile's totals are a strided view of its diagonals (the rows taken in reverse
order), never a copy.
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor

from headlab.heads.targets import as_batched


class Scratch:
    """Buffers kept from one call to the next: :func:`layer_scorer
    <headlab.heads.report.layer_scorer>` keeps one for an analysis, so each layer's scores
    reuse the last layer's (B, h, n, n) buffers. A fresh buffer costs its first touch (the
    pages the system maps in), about as much as a pass over it. Without one, each call
    allocates its own."""

    def __init__(self) -> None:
        self._buffers: dict[str, Tensor] = {}

    def get(self, name: str, shape: tuple[int, ...], like: Tensor, zeros: bool = False) -> Tensor:
        """The buffer ``name`` of ``shape`` in ``like``'s dtype and device: the one handed out
        last time when those match (its contents as left then), else a new one, of zeros if
        ``zeros`` (uninitialised otherwise: filling it costs a pass)."""
        buf = self._buffers.get(name)
        if (
            buf is None
            or buf.shape != shape
            or (buf.dtype, buf.device) != (like.dtype, like.device)
        ):
            new = torch.zeros if zeros else torch.empty
            buf = self._buffers[name] = new(shape, dtype=like.dtype, device=like.device)
        return buf


def content_score(
    weights: Tensor, causal: bool, fixed: Tensor | None = None, scratch: Scratch | None = None
) -> Tensor:
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
    the model's config; ``scratch``: buffers kept from the last call (:class:`Scratch`), for
    a caller that scores layer after layer.
    """
    A, _ = as_batched(weights)
    B, _, n, _ = A.shape
    V, size, skewed = (x.to(A.device) for x in _content_masks(B, n, causal, fixed, A.dtype))
    # the rows in reverse order (one copy, then worked in place): the offset profile's cell of
    # the pair (i, j) is then the antidiagonal i + j, and its totals a strided view, not a copy
    scratch = scratch or Scratch()
    AV = scratch.get("rows", A.shape, A)  # (B, h, n, n): the rows on the movable keys
    torch.index_select(A, -2, torch.arange(n - 1, -1, -1, device=A.device), out=AV).mul_(V[:, None])
    w = AV.sum(-1)  # (B, h, n)
    rows = ((size >= 2)[:, None] & (w > 0)).to(A.dtype)  # (B, h, n): rows that count
    # a row's own part in a profile cell: w_i·u_ij = |V_i|·A_ij to the sum, w_i to the weight,
    # 1 to the count; parts: the rows' weights and counts (2, B, h, n)
    scale = rows * size[:, None]  # (B, h, n)
    parts = torch.stack([rows * w, rows])
    every = (size >= 2).sum().clamp_min(1).to(A.dtype)  # the rows that count, whatever w
    diagonals = _antiskew(AV, scratch.get("diagonals", (*A.shape[:-1], 2 * n), A, zeros=True))
    profiles = (
        _key_profile(AV, scale, parts, V),
        _offset_profile(AV, scale, parts, skewed, diagonals),
    )
    work = scratch.get("work", (3, *A.shape), A)  # reused by both profiles
    # each profile's unexplained share (a rest on fixed keys: explained); the better one wins
    key, offset = (
        (w * _unexplained(AV, rows * w, scale, V, profile, work)).sum((0, 2)) / every
        for profile in profiles
    )
    return torch.minimum(key, offset).clamp(0, 1).float()  # rounding can step outside [0, 1]


def _content_masks(
    B: int, n: int, causal: bool, fixed: Tensor | None, dtype: torch.dtype
) -> tuple[Tensor, Tensor, Tensor]:
    """What :func:`content_score` compares on a probe, rows in reverse order: V (B, n, n) 0/1
    the keys each query sees, |V| (B, n), and V antiskewed (B, n, 2n − 1). They depend on the
    probe alone, so they are built once and shared by every layer (read-only)."""
    key = b"" if fixed is None else fixed.bool().cpu().contiguous().numpy().tobytes()
    return _masks(B, n, causal, key, dtype)


@functools.lru_cache(maxsize=8)
def _masks(
    B: int, n: int, causal: bool, fixed: bytes, dtype: torch.dtype
) -> tuple[Tensor, Tensor, Tensor]:
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
    V = sees.flip(-2).to(dtype)
    return V, V.sum(-1), _antiskew(V, torch.zeros(B, n, 2 * n, dtype=dtype))


# a profile as :func:`_unexplained` reads it: the sums, weights and counts at each pair's cell
# (3, h, ·, n), the cells more than one row sees (h, ·, n) 0/1, and per row (B, h, n) its mass
# on the keys whose cell is such a cell and whether it has any
Profile = tuple[Tensor, Tensor, Tensor, Tensor]


def _key_profile(AV: Tensor, scale: Tensor, parts: Tensor, V: Tensor) -> Profile:
    """The profile by key position, its totals (3, h, 1, n) at key j. AV (B, h, n, n) the rows
    on the keys they see; scale (B, h, n) each row's |V_i| where it counts; parts (2, B, h, n)
    the rows' weights and 0/1 counts; V (B, n, n) the keys each query sees."""
    totals, cells, mass, has = _cell_totals(AV, scale, parts, V)
    return totals[:, :, None], cells[:, None], mass, has


def _offset_profile(
    AV: Tensor, scale: Tensor, parts: Tensor, skewed: Tensor, diagonals: Tensor
) -> Profile:
    """The profile by offset, rows in reverse order: its totals at (i, j) those of every pair
    on the antidiagonal i + j (3, h, n, n), a strided view of (3, h, 2n − 1) like its cells.
    skewed (B, n, 2n − 1) the keys each query sees and diagonals (B, h, n, 2n − 1) the rows,
    both antiskewed; the rest as :func:`_key_profile`."""
    n = AV.shape[-1]
    totals, cells, mass, has = _cell_totals(diagonals, scale, parts, skewed)
    return totals.unfold(-1, n, 1), cells.unfold(-1, n, 1), mass, has


def _cell_totals(X: Tensor, scale: Tensor, parts: Tensor, M: Tensor) -> Profile:
    """A profile over m cells from the rows laid out by cell, X (B, h, n, m), and the pairs
    each query has in each cell, M (B, n, m) 0/1: the sums, weights and counts per cell
    (3, h, m), the cells more than one row sees (h, m) 0/1, and each row's mass on those and
    whether it has any (B, h, n). Plain batched products (einsum's set-up costs as much at
    these sizes)."""
    B, h, n, m = X.shape
    sums = (scale[:, :, None, :] @ X).sum(0)[:, 0]  # (h, m)
    rest = (parts.transpose(0, 1).reshape(B, 2 * h, n) @ M).view(B, 2, h, m).sum(0)
    cells = (rest[1] > 1.5).to(X.dtype)  # (h, m)
    mass = (cells[:, None, :] @ X.mT)[..., 0, :]  # (B, h, n); X @ cells is ten times slower
    has = (cells @ M.mT) > 0.5  # (B, h, n)
    return torch.cat([sums[None], rest]), cells, mass, has


def _antiskew(x: Tensor, padded: Tensor) -> Tensor:
    """(…, n, n) → (…, n, 2n − 1): x[…, i, j] at column i + j, zeros elsewhere; a strided view
    (row stride 2n − 1) of ``padded`` (…, n, 2n) holding x and n zero columns (row stride 2n),
    whose rows overlap. x is written into ``padded``, whose last n columns must be zeros."""
    n = x.shape[-1]
    padded[..., :n] = x
    return padded.as_strided((*x.shape[:-1], 2 * n - 1), (*padded.stride()[:-2], 2 * n - 1, 1))


def _unexplained(
    AV: Tensor, weight: Tensor, scale: Tensor, V: Tensor, profile: Profile, work: Tensor
) -> Tensor:
    """Each row's 1 − overlap with its leave-one-out profile: AV (B, h, n, n) the rows on the
    keys they see, weight and scale each row's w_i and |V_i| where it counts (B, h, n), V the
    keys each query sees, work three (B, h, n, n) buffers → (B, h, n), 0 on a row with no key
    kept (nothing to compare) or one that does not count."""
    # each op is one pass over (B, h, n, n) into a buffer of ``work``: at these sizes a fresh
    # tensor costs about as much as the arithmetic in it. A row that does not count (weight 0)
    # is compared too, finite, and multiplied by 0 at the end: cheaper than masking it out
    totals, cells, mass_p, has = profile
    kept, q, other = work.unbind(0)
    torch.mul(V[:, None], cells, out=kept)  # a seen pair whose cell another row sees
    torch.sub(totals[1], weight[..., None], out=other).clamp_min_(1e-30)  # the other rows' w
    torch.addcmul(totals[0], scale[..., None], AV, value=-1, out=q)  # the other rows' sum
    q.div_(other).mul_(kept)  # the profile on the keys kept, unnormalised
    mass_p, mass_q = mass_p[..., None], q.sum(-1, keepdim=True)  # (B, h, n, 1)
    # Σ min(p/|p|, q/|q|) = Σ min(p, q·|p|/|q|) / |p| with p the row on the keys kept; q is 0
    # off them and AV ≥ 0, so p may be AV itself. An empty side overlaps nothing
    overlap = torch.minimum(AV, q.mul_(mass_p / mass_q.clamp_min(1e-30)), out=q).sum(-1)
    overlap = overlap / mass_p[..., 0].clamp_min(1e-30)
    return (1 - overlap) * (has & (weight > 0))
