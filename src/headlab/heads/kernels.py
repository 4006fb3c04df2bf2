"""Compiled loops that accelerate the scores best computed a row at a time: the content score
(:func:`headlab.heads.content.content_parts`, a few dozen passes over each layer's (B, h, n, n)
weights as PyTorch operations) and each row's argmax and entropy (the positional, rare-word and
diffuse scores of :mod:`headlab.heads.scores`). They compute the PyTorch definitions' numbers
(tests/unit/test_scores_definition.py) on the CPU in float32, where :mod:`headlab.heads.fast`
lets them; the definitions run everywhere else.

Numba compiles each loop to vectorised machine code the first time it runs and caches it on
disk in headlab's cache, every file checked before Numba reads it
(:mod:`headlab.heads.kernel_cache`): seconds once per install, milliseconds to load after
that. Rows are worked one at a time, each small enough to stay in the CPU's first-level cache,
so a layer costs a few passes over its weights, not dozens. The ``*_parallel`` entry points
split the work across ``torch.get_num_threads()`` threads (the budget PyTorch's operations
use) with Numba's ``prange``, on whatever threading layer Numba has on the system.

Floating-point contract: float32 weights; the content profiles' sums and weights are added up
in float64, then each is kept as two float32 (a leading part and the rest), so that a row's
own share is subtracted in float32 with nothing lost to the subtraction (:func:`_less`, the one
function compiled without reordering); a row where the other rows hold so little of a cell's
weight that even that is not enough is worked again from the float64 sums. Sums may be
reassociated (``reassoc``), so a result differs from a plain loop's by float rounding (the
tests hold it to the definition within 1e-7). NaN and infinity keep their IEEE meaning (no
``nnan``/``ninf`` flags).
"""

from __future__ import annotations

import numba
import numpy as np
import torch
from llvmlite import ir
from numba import prange, types
from numba.extending import intrinsic

from headlab.heads import kernel_cache

# float arithmetic the compiler may reorder and fuse, but never assume finite
_FAST = {"reassoc", "contract", "arcp", "nsz"}
_jit = kernel_cache.cached(
    numba.njit(nogil=True, cache=kernel_cache.CACHING, boundscheck=False, fastmath=_FAST)
)
# a loop over shares of the work, one a thread (Numba's prange, on its threading layer)
_shared = kernel_cache.cached(
    numba.njit(parallel=True, nogil=True, cache=kernel_cache.CACHING, fastmath=_FAST)
)
# arithmetic written in a set order that the compiler must keep (a compensated subtraction)
_exact = kernel_cache.cached(numba.njit(nogil=True, cache=kernel_cache.CACHING, fastmath=False))
_f32 = np.float32
_TINY = np.float32(1e-30)
# a cell where the other rows hold less than this share of its weight is worked from the float64
# sums: two float32 hold a sum to about 2⁻⁴⁸ of itself, so a difference of at least 2⁻¹⁶ of it
# keeps float32's precision (the leave-one-out profile at that cell divided by that difference)
_THIN = np.float32(2.0**-16)


@intrinsic
def _fma(typingctx, a, b, c):
    """a · b + c for float32, rounded once."""
    sig = types.float32(types.float32, types.float32, types.float32)

    def codegen(context, builder, signature, args):
        return builder.fma(*args)

    return sig, codegen


@_exact
def _less(hi, lo, s, x):
    """(hi + lo) − s · x for a float64 sum kept as two float32 (hi its float32 rounding, lo the
    rest): hi − s · x rounded once (exact where s · x is near hi, which is where a plain
    float32 subtraction loses most), then the rest added back."""
    return _fma(-s, x, hi) + lo  # type: ignore[call-arg]  # an intrinsic: typingctx is Numba's


@_jit
def _split(x64, hi, lo):
    """Each float64 of x64 as hi (its float32 rounding) + lo (what that rounding left)."""
    for c in range(x64.shape[0]):
        h = _f32(x64[c])
        hi[c] = h
        lo[c] = _f32(x64[c] - np.float64(h))


@_jit
def _add_sums(row, sees, scale, by_key, by_offset, base, n):
    """Add one row's |V_i|·A_ij on the keys it sees to both profiles' sums (by key j, by
    offset cell base + j) and return its weight there, w_i = Σ_j A_ij (scale 0: a row that
    does not count adds nothing)."""
    by_offset = by_offset[base : base + n]
    w = _f32(0.0)
    for j in range(n):
        v = row[j] * sees[j]
        w += v
        by_key[j] += scale * v
        by_offset[j] += scale * v
    return w


@_jit
def _add_weights(sees, w, key_w, off_w, base, n):
    """Add a row that counts to both profiles' weights (w_i) at the cells of the keys it sees."""
    off_w = off_w[base : base + n]
    for j in range(n):
        v = w * sees[j]
        key_w[j] += v
        off_w[j] += v


@_jit
def _add_offset_weights(sees, w, off_w, base, n):
    """:func:`_add_weights`' offset half, for a row whose sequence adds its key half once
    (:func:`_shared_rows`)."""
    off_w = off_w[base : base + n]
    for j in range(n):
        off_w[j] += w * sees[j]


@_jit
def _shared_rows(sees, size, n):
    """The row every row of a sequence that counts (two or more keys) is compared on, or −1
    where they are not all the same (a causal mask). Where they are, the by-key profile's
    weight at key j is that row's mark times the sum of the sequence's row weights, added once
    a sequence instead of once a row."""
    B = sees.shape[0]
    shared = np.full(B, -1, np.int64)
    for b in range(B):
        first, same = -1, True
        for i in range(n):
            if size[b, i] >= 2:
                if first < 0:
                    first = i
                else:
                    for j in range(n):
                        if sees[b, i, j] != sees[b, first, j]:
                            same = False
                            break
                if not same:
                    break
        if same and first >= 0:
            shared[b] = first
    return shared


@_jit
def _add_counts(sees, sign, key_c, off_c, base, n):
    """Add a row (sign 1) to both profiles' row counts at the cells of the keys it sees, or
    take it away (sign −1)."""
    off_c = off_c[base : base + n]
    for j in range(n):
        key_c[j] += sign * sees[j]
        off_c[j] += sign * sees[j]


@_jit
def _overlaps(row, n, q_key, q_off, key, off):
    """A row's 1 − overlap with each profile q (by key, by offset) once q is filled in: key and
    off hold the row's mass on the kept keys, q's mass there and how many keys were kept. The
    row and q are renormalised on the kept keys, then Σ_j min (0 for a profile with no kept
    key: nothing to compare)."""
    p_key, q_key_mass, has_key = key
    p_off, q_off_mass, has_off = off
    f_key = p_key / (q_key_mass if q_key_mass > _TINY else _TINY)
    f_off = p_off / (q_off_mass if q_off_mass > _TINY else _TINY)
    o_key, o_off = _f32(0.0), _f32(0.0)
    for j in range(n):  # q is 0 off the kept keys and A ≥ 0: the row itself can be p
        o_key += min(row[j], q_key[j] * f_key)
        o_off += min(row[j], q_off[j] * f_off)
    u_key = _f32(1.0) - o_key / (p_key if p_key > _TINY else _TINY) if has_key > 0 else _f32(0.0)
    u_off = _f32(1.0) - o_off / (p_off if p_off > _TINY else _TINY) if has_off > 0 else _f32(0.0)
    return u_key, u_off


@_jit
def _unexplained_split(row, sees, w, scale, key, off, base, n, q_key, q_off):
    """:func:`_unexplained` from the sums and weights kept as float32 pairs (:func:`_split`):
    key and off hold each profile's (sum, sum's rest, weight, weight's rest, cells). Returns
    (1 − overlap by key, by offset, whether a cell's other rows were too thin to trust
    float32: the caller then works the row from the float64 sums)."""
    k_sum, k_rest, k_wt, k_wrest, k_cell = key
    o_sum, o_rest, o_wt = off[0][base : base + n], off[1][base : base + n], off[2][base : base + n]
    o_wrest, o_cell = off[3][base : base + n], off[4][base : base + n]
    p_key, q_key_mass, has_key = _f32(0.0), _f32(0.0), _f32(0.0)
    p_off, q_off_mass, has_off = _f32(0.0), _f32(0.0), _f32(0.0)
    thin, one = _f32(0.0), _f32(1.0)
    for j in range(n):
        a = row[j]
        kept_k, kept_o = sees[j] * k_cell[j], sees[j] * o_cell[j]
        # the other rows' weight and sum at this cell: the row's own share taken out
        other_k = _less(k_wt[j], k_wrest[j], one, w)
        other_o = _less(o_wt[j], o_wrest[j], one, w)
        thin += kept_k * (one if other_k < _THIN * k_wt[j] else _f32(0.0))
        thin += kept_o * (one if other_o < _THIN * o_wt[j] else _f32(0.0))
        other_k = other_k if other_k > _TINY else _TINY
        other_o = other_o if other_o > _TINY else _TINY
        qk = kept_k * _less(k_sum[j], k_rest[j], scale, a) / other_k
        qo = kept_o * _less(o_sum[j], o_rest[j], scale, a) / other_o
        q_key[j], q_off[j] = qk, qo
        has_key += kept_k
        has_off += kept_o
        p_key += a * kept_k
        p_off += a * kept_o
        q_key_mass += qk
        q_off_mass += qo
    u_key, u_off = _overlaps(
        row, n, q_key, q_off, (p_key, q_key_mass, has_key), (p_off, q_off_mass, has_off)
    )
    return u_key, u_off, thin > 0


@_jit
def _unexplained(row, sees, w, scale, key, off, base, n, q_key, q_off):
    """One row's 1 − overlap with its leave-one-out profile, by key and by offset (0 for a
    profile where it has no kept key: nothing to compare). key and off: each profile's sums,
    weights (float64) and cells (1 where more than one row sees it); offset cell base + j. At
    the keys kept (seen, at a cell another row sees) a profile is the other rows' sum over
    their weight there; the row and the profile are renormalised on the kept keys, then
    Σ_j min."""
    k_sum, k_wt, k_cell = key
    o_sum, o_wt, o_cell = off[0][base : base + n], off[1][base : base + n], off[2][base : base + n]
    p_key, q_key_mass, has_key = _f32(0.0), _f32(0.0), _f32(0.0)
    p_off, q_off_mass, has_off = _f32(0.0), _f32(0.0), _f32(0.0)
    for j in range(n):
        a = row[j]
        kept_k, kept_o = sees[j] * k_cell[j], sees[j] * o_cell[j]
        # the other rows' weight and sum at this cell: subtracted in float64, then float32
        other_k = _f32(k_wt[j] - w)
        other_k = other_k if other_k > _TINY else _TINY
        other_o = _f32(o_wt[j] - w)
        other_o = other_o if other_o > _TINY else _TINY
        qk = kept_k * _f32(k_sum[j] - scale * a) / other_k
        qo = kept_o * _f32(o_sum[j] - scale * a) / other_o
        q_key[j], q_off[j] = qk, qo
        has_key += kept_k
        has_off += kept_o
        p_key += a * kept_k
        p_off += a * kept_o
        q_key_mass += qk
        q_off_mass += qo
    return _overlaps(
        row, n, q_key, q_off, (p_key, q_key_mass, has_key), (p_off, q_off_mass, has_off)
    )


@_jit
def _profile_cells(counts):
    """The cells more than one row sees, 0/1 in place of the counts."""
    for c in range(counts.shape[0]):
        counts[c] = _f32(1.0) if counts[c] > 1.5 else _f32(0.0)


@_jit
def content_parts(A, sees, size, lo, hi, out):
    """Each head's unexplained attention under both position profiles, summed over its rows.

    A (B, H, n, n) float32 weights; sees (B, n, n) float32 0/1, the keys each query is
    compared on; size (B, n) int64 how many; heads lo ≤ h < hi. Writes out[h] (H, 2) float64:
    Σ_i w_i (1 − overlap_i) by key position (0) and by offset (1), the rows with |V_i| ≥ 2
    and w_i > 0 (:func:`headlab.heads.content.content_score` divides by the rows that count).
    Where a sequence's rows that count all see the same keys (bidirectional), the by-key
    profile's weights are added once for the sequence, not once a row (:func:`_shared_rows`).
    """
    B, _, n, _ = A.shape
    m = 2 * n - 1  # offset cells: j − i + n − 1
    # sums and weights added up in float64 (key[0], key[1]; off[0], off[1]), and row counts
    key = (np.empty(n, np.float64), np.empty(n, np.float64), np.empty(n, _f32))
    off = (np.empty(m, np.float64), np.empty(m, np.float64), np.empty(m, _f32))
    # the same sums and weights as float32 pairs (sum, rest, weight, rest), and the cells kept
    key2 = (np.empty(n, _f32), np.empty(n, _f32), np.empty(n, _f32), np.empty(n, _f32), key[2])
    off2 = (np.empty(m, _f32), np.empty(m, _f32), np.empty(m, _f32), np.empty(m, _f32), off[2])
    w = np.empty((B, n), _f32)  # each row's weight on the keys it sees, 0 where it does not count
    q_key, q_off = np.empty(n, _f32), np.empty(n, _f32)
    # every row with two or more keys, counted once: a head takes away its rows of no weight
    key_rows, off_rows = np.zeros(n, _f32), np.zeros(m, _f32)
    for b in range(B):
        for i in range(n):
            if size[b, i] >= 2:
                _add_counts(sees[b, i], _f32(1.0), key_rows, off_rows, n - 1 - i, n)
    shared = _shared_rows(sees, size, n)
    for h in range(lo, hi):
        for buf in (key[0], key[1], off[0], off[1]):
            buf[:] = 0
        key[2][:] = key_rows
        off[2][:] = off_rows
        for b in range(B):
            total = 0.0  # the sequence's row weights, where its rows share their keys
            for i in range(n):
                row, s, base = A[b, h, i], sees[b, i], n - 1 - i
                scale = _f32(size[b, i]) if size[b, i] >= 2 else _f32(0.0)
                t = _add_sums(row, s, scale, key[0], off[0], base, n)
                w[b, i] = t if scale > 0 and t > 0 else _f32(0.0)
                if w[b, i] > 0:
                    if shared[b] >= 0:
                        total += t
                        _add_offset_weights(s, t, off[1], base, n)
                    else:
                        _add_weights(s, t, key[1], off[1], base, n)
                elif scale > 0:
                    _add_counts(s, _f32(-1.0), key[2], off[2], base, n)
            if shared[b] >= 0:
                marks = sees[b, shared[b]]
                for j in range(n):
                    key[1][j] += total * marks[j]
        _profile_cells(key[2])
        _profile_cells(off[2])
        _split(key[0], key2[0], key2[1])
        _split(key[1], key2[2], key2[3])
        _split(off[0], off2[0], off2[1])
        _split(off[1], off2[2], off2[3])
        by_key, by_offset = 0.0, 0.0
        for b in range(B):
            for i in range(n):
                t = w[b, i]
                if t > 0:
                    row, s, scale, base = A[b, h, i], sees[b, i], _f32(size[b, i]), n - 1 - i
                    u_key, u_off, thin = _unexplained_split(
                        row, s, t, scale, key2, off2, base, n, q_key, q_off
                    )
                    if thin:
                        u_key, u_off = _unexplained(
                            row, s, t, scale, key, off, base, n, q_key, q_off
                        )
                    by_key += t * u_key
                    by_offset += t * u_off
        out[h, 0], out[h, 1] = by_key, by_offset


@intrinsic
def _as_float(typingctx, bits):
    """The float32 whose bits are the int32 ``bits``."""
    sig = types.float32(types.int32)

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.FloatType())

    return sig, codegen


@_jit
def _log(bits):
    """log x for a float32 x ≥ the least normal float, given as its bits (int32): x = m·2^e
    with m in [√½, √2), then Cephes' logf polynomial in m − 1 (Moshier 1992; within a few
    units of float32 rounding). Branch-free, so a loop of it vectorises; math.log there
    would call the C library one value at a time."""
    e = (bits >> 23) - 126
    # m in [½, 1): the mantissa with the exponent of ½
    m = _as_float((bits & 0x007FFFFF) | 0x3F000000)  # type: ignore[call-arg,var-annotated]
    small = m < _f32(0.70710678118654752440)
    e = e - 1 if small else e
    x = (m + m - _f32(1.0)) if small else (m - _f32(1.0))
    z = x * x
    y = _f32(7.0376836292e-2)
    for c in _LOG_POLY:
        y = y * x + c
    y = y * x * z
    f = _f32(e)
    return x + (y + _f32(-2.12194440e-4) * f + _f32(-0.5) * z) + _f32(0.693359375) * f


_LOG_POLY = (
    np.float32(-1.1514610310e-1),
    np.float32(1.1676998740e-1),
    np.float32(-1.2420140846e-1),
    np.float32(1.4249322787e-1),
    np.float32(-1.6668057665e-1),
    np.float32(2.0000714765e-1),
    np.float32(-2.4999993993e-1),
    np.float32(3.3333331174e-1),
)
_LEAST_NORMAL = np.int32(0x00800000)  # the bits of the least normal float32


@_jit
def row_stats(A, lo, hi, argmax, plogp):
    """Each row's first maximum and Σ_j A_j log A_j: A (R, n) float32, every weight ≥ 0 or
    NaN; rows lo ≤ r < hi → argmax[r] (R,) int64 and plogp[r] (R,) float32, a weight below
    the least normal float taken as it (0 · log of it = 0, as clamp_min(tiny) then log gives).
    Non-negative floats order as their bits do as integers, so the maximum is an integer
    reduction the compiler vectorises (a float one it may not reorder); then the first key
    that holds it, as the least such index: a min reduction that vectorises too, where a loop
    that stops at the first match would go key by key (0.21 of 1.25 ms on MiniLM's 9,828
    rows of 126 keys at one thread). A NaN's bits decide where it falls: one with the sign
    bit clear (NumPy's and PyTorch's ``nan``) is above every weight, so the first such key is
    the argmax, as torch.argmax gives; the NaN that x86 arithmetic makes (0/0, a softmax of
    all −inf: the sign bit set) is below every weight, where torch.argmax would take its key.
    Attention weights hold no NaN (a row with no key allowed gives zeros, DESIGN.md)."""
    bits = A.view(np.int32)
    n = A.shape[1]
    for r in range(lo, hi):
        row, b = A[r], bits[r]
        top, total = b[0], _f32(0.0)
        for j in range(n):
            top = max(top, b[j])
            total += row[j] * _log(max(b[j], _LEAST_NORMAL))
        plogp[r] = total
        first = n
        for j in range(n):
            first = min(first, j if b[j] == top else n)
        argmax[r] = first


@_shared
def _content_shares(A, sees, size, out, shares):
    """:func:`content_parts` of every head, split into ``shares`` runs of heads, one a thread."""
    H = A.shape[1]
    for k in prange(shares):
        content_parts(A, sees, size, H * k // shares, H * (k + 1) // shares, out)


@_shared
def _row_shares(rows, argmax, plogp, shares):
    """:func:`row_stats` of every row, split into ``shares`` runs of rows, one a thread."""
    R = rows.shape[0]
    for k in prange(shares):
        row_stats(rows, R * k // shares, R * (k + 1) // shares, argmax, plogp)


def _threads(work: int) -> int:
    """The threads to split ``work`` units over: PyTorch's count (the budget its operations
    use), at most one a unit and at most Numba's pool; that many are set for Numba's next
    parallel loop on this thread."""
    pool = numba.config.NUMBA_NUM_THREADS  # type: ignore[attr-defined]  # set at run time
    threads = max(1, min(torch.get_num_threads(), work, pool))
    if threads > 1:
        numba.set_num_threads(threads)
    return threads


def _check(arrays: list[tuple[np.ndarray, type]]) -> None:
    """A kernel reads C-contiguous arrays of the dtypes it was compiled for: refuse others."""
    for x, dtype in arrays:
        if not x.flags.c_contiguous or x.dtype != dtype:
            raise ValueError(
                f"a kernel's array is {x.dtype}, strides {x.strides}: it reads "
                f"C-contiguous {np.dtype(dtype)}"
            )


def content_parts_parallel(
    A: np.ndarray, sees: np.ndarray, size: np.ndarray, out: np.ndarray
) -> None:
    """:func:`content_parts` over every head, on PyTorch's thread count (at most one a head)."""
    _check([(A, _f32), (sees, _f32), (size, np.int64), (out, np.float64)])
    H = A.shape[1]
    threads = _threads(H)
    if threads == 1:
        content_parts(A, sees, size, 0, H, out)
    else:
        _content_shares(A, sees, size, out, threads)
    kernel_cache.record()  # a first call may compile and save


def row_stats_parallel(A: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """:func:`row_stats` of every row of A (…, n) float32 (weights ≥ 0) on PyTorch's thread
    count → argmax (…,) int64 and Σ A log A (…,) float32."""
    if A.shape[-1] == 0:
        raise ValueError("row_stats: rows of no keys have no argmax")
    rows = A.reshape(-1, A.shape[-1])
    _check([(rows, _f32)])
    R = rows.shape[0]
    argmax, plogp = np.empty(R, np.int64), np.empty(R, _f32)
    threads = _threads(R // 64 + 1)
    if threads == 1:
        row_stats(rows, 0, R, argmax, plogp)
    else:
        _row_shares(rows, argmax, plogp, threads)
    kernel_cache.record()
    return argmax.reshape(A.shape[:-1]), plogp.reshape(A.shape[:-1])
