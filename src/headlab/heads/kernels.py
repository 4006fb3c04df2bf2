"""Compiled loops for the content score (:func:`headlab.heads.content.content_score`), which
took a few dozen passes over each layer's (B, h, n, n) weights as PyTorch operations.

Numba compiles each loop to vectorised machine code the first time it runs and caches it on
disk (beside this module, or in Numba's user cache where that is read-only): seconds once per
install, milliseconds to load after that. A head's rows are worked one at a time, each small
enough to stay in the CPU's first-level cache, so a layer costs a few passes over its weights,
not dozens. :func:`content_parts_parallel` splits a layer's heads across
``torch.get_num_threads()`` threads of PyTorch's own OpenMP team, the threads and the budget
PyTorch's operations use.

Floating-point contract: float32 throughout; sums may be reassociated (``reassoc``), so a
result differs from a plain loop's by float rounding (the tests hold it to the definition's loop
in float64 within 1e-6). NaN and infinity keep their IEEE meaning (no ``nnan``/``ninf`` flags).
"""

from __future__ import annotations

import ctypes
import functools
import os

import numba
import numpy as np
import torch
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

# float arithmetic the compiler may reorder and fuse, but never assume finite
_FAST = {"reassoc", "contract", "arcp", "nsz"}
_jit = numba.njit(nogil=True, cache=True, boundscheck=False, fastmath=_FAST)
_f32 = np.float32
_TINY = np.float32(1e-30)


@_jit
def _accumulate(row, sees, w, scale, sums, weights, counts, base, n):
    """Add one row to a profile: at cell base + j, |V_i|·A_ij to the sums, w_i to the
    weights and 1 to the counts, for the keys j the row sees (sees 0/1)."""
    s, t, c = sums[base : base + n], weights[base : base + n], counts[base : base + n]
    for j in range(n):  # three loops, each vectorised (one loop writing three arrays is not)
        s[j] += scale * row[j] * sees[j]
    for j in range(n):
        t[j] += w * sees[j]
    for j in range(n):
        c[j] += sees[j]


@_jit
def _overlap(row, sees, w, scale, sums, weights, cells, base, n, q):
    """One row's overlap with its leave-one-out profile, and whether it has a kept key: the
    profile at the row's keys j kept (seen, and at a cell another row sees) is the other rows'
    sum over their weight there; both sides renormalised on the kept keys, then Σ min."""
    sm, wt, kept = sums[base : base + n], weights[base : base + n], cells[base : base + n]
    mass_p, mass_q, has = _f32(0.0), _f32(0.0), _f32(0.0)
    for j in range(n):
        k = sees[j] * kept[j]
        other = wt[j] - w  # the other rows' weight at this cell
        other = other if other > _TINY else _TINY
        qj = k * (sm[j] - scale * row[j]) / other
        q[j] = qj
        has += k
        mass_p += row[j] * k
        mass_q += qj
    if has <= 0:
        return _f32(0.0), False
    f = mass_p / (mass_q if mass_q > _TINY else _TINY)
    overlap = _f32(0.0)
    for j in range(n):  # q is 0 off the kept keys and A ≥ 0: the row itself can be p
        overlap += min(row[j], q[j] * f)
    return overlap / (mass_p if mass_p > _TINY else _TINY), True


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
    """
    B, _, n, _ = A.shape
    m = 2 * n - 1  # offset cells: j − i + n − 1
    key = (np.empty(n, _f32), np.empty(n, _f32), np.empty(n, _f32))
    off = (np.empty(m, _f32), np.empty(m, _f32), np.empty(m, _f32))
    w = np.empty((B, n), _f32)  # each row's weight on the keys it sees, 0 where it does not count
    q = np.empty(n, _f32)
    for h in range(lo, hi):
        for buf in key + off:
            buf[:] = 0
        for b in range(B):
            for i in range(n):
                row, s = A[b, h, i], sees[b, i]
                t = _f32(0.0)
                for j in range(n):
                    t += row[j] * s[j]
                w[b, i] = t if size[b, i] >= 2 and t > 0 else _f32(0.0)
                if w[b, i] > 0:
                    scale = _f32(size[b, i])
                    _accumulate(row, s, t, scale, key[0], key[1], key[2], 0, n)
                    _accumulate(row, s, t, scale, off[0], off[1], off[2], n - 1 - i, n)
        _profile_cells(key[2])
        _profile_cells(off[2])
        by_key, by_offset = 0.0, 0.0
        for b in range(B):
            for i in range(n):
                t = w[b, i]
                if t <= 0:
                    continue
                row, s, scale = A[b, h, i], sees[b, i], _f32(size[b, i])
                o, has = _overlap(row, s, t, scale, key[0], key[1], key[2], 0, n, q)
                if has:
                    by_key += t * (1 - o)
                o, has = _overlap(row, s, t, scale, off[0], off[1], off[2], n - 1 - i, n, q)
                if has:
                    by_offset += t * (1 - o)
        out[h, 0], out[h, 1] = by_key, by_offset


# --- running a kernel on PyTorch's own OpenMP threads ------------------------------------------
#
# PyTorch's parallel loops run on an OpenMP team whose idle threads spin for a while before they
# sleep; a thread of our own beside them would get half a core. So a kernel runs the way
# PyTorch's own loops do: the caller opens a parallel region of the same OpenMP runtime
# (GOMP_parallel, which GNU's, LLVM's and Intel's runtimes all export) with a compiled C
# callback, and each thread of the team works its slice of the heads. Where no OpenMP runtime is
# loaded (PyTorch built without one), the caller runs every head itself.


@intrinsic
def _pointer(typingctx, address, like):
    """The integer ``address`` as a pointer to ``like``'s element type."""
    sig = types.CPointer(like.dtype)(types.int64, like)

    def codegen(context, builder, signature, args):
        return builder.inttoptr(args[0], context.get_value_type(signature.return_type))

    return sig, codegen


@intrinsic
def _call_int(typingctx, address):
    """Call the C function ``int f(void)`` at ``address`` (omp_get_thread_num and the like:
    passed as an address, so the compiled code holds no address of this process's)."""
    sig = types.int32(types.int64)

    def codegen(context, builder, signature, args):
        fn = builder.inttoptr(args[0], ir.FunctionType(ir.IntType(32), []).as_pointer())
        return builder.call(fn, [])

    return sig, codegen


_ARGS = 9  # the content task's arguments, as int64: see content_parts_parallel


@numba.cfunc(types.void(types.CPointer(types.int64)), cache=True)
def _content_task(args):
    """One OpenMP thread's share of :func:`content_parts`; args: the addresses of A, sees,
    size and out, then B, H, n and the addresses of omp_get_thread_num, omp_get_num_threads."""
    a = numba.carray(args, _ARGS)
    B, H, n = a[4], a[5], a[6]
    A = numba.carray(_pointer(a[0], np.empty(0, _f32)), (B, H, n, n))  # type: ignore[call-arg]
    sees = numba.carray(_pointer(a[1], np.empty(0, _f32)), (B, n, n))
    size = numba.carray(_pointer(a[2], np.empty(0, np.int64)), (B, n))
    out = numba.carray(_pointer(a[3], np.empty(0, np.float64)), (H, 2))
    thread, threads = _call_int(a[7]), _call_int(a[8])
    content_parts(A, sees, size, H * thread // threads, H * (thread + 1) // threads, out)


@functools.cache
def _openmp() -> ctypes.CDLL | None:
    """The OpenMP runtime PyTorch loaded (found among this process's mapped libraries), or
    None: none is loaded, or this system does not list them (/proc/self/maps is Linux's)."""
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if line.count("/")}
    except OSError:
        return None
    names = ("libgomp", "libomp", "libiomp5")
    for path in sorted(paths):
        if os.path.basename(path).startswith(names):
            lib = ctypes.CDLL(path)  # already loaded: the same library, not a second copy
            if hasattr(lib, "GOMP_parallel"):
                lib.GOMP_parallel.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint,
                                              ctypes.c_uint]  # fmt: skip
                lib.GOMP_parallel.restype = None
                return lib
    return None


def content_parts_parallel(
    A: np.ndarray, sees: np.ndarray, size: np.ndarray, out: np.ndarray
) -> None:
    """:func:`content_parts` over every head, on ``torch.get_num_threads()`` threads (at most
    one a head) of PyTorch's OpenMP team; the caller alone where there is none. The arrays
    must be C-contiguous, of the kernel's dtypes, and live until it returns (it does not keep
    them)."""
    B, H, n, _ = A.shape
    threads = max(1, min(torch.get_num_threads(), H))
    lib = _openmp()
    if lib is None or threads == 1:
        content_parts(A, sees, size, 0, H, out)
        return
    for x, dtype in ((A, _f32), (sees, _f32), (size, np.int64), (out, np.float64)):
        if not x.flags.c_contiguous or x.dtype != dtype:
            raise ValueError(f"content_parts_parallel: an array is not C-contiguous {dtype}")
    number = ctypes.cast(lib.omp_get_thread_num, ctypes.c_void_p).value
    count = ctypes.cast(lib.omp_get_num_threads, ctypes.c_void_p).value
    args = np.array([A.ctypes.data, sees.ctypes.data, size.ctypes.data, out.ctypes.data,
                     B, H, n, number, count], dtype=np.int64)  # fmt: skip
    lib.GOMP_parallel(_content_task.address, args.ctypes.data, threads, 0)
