"""The multi-head attention equations in NumPy, head by head: the oracle the tests hold torch to.

Written as Vaswani et al. 2017 state them, with the row-vector convention X W (X is n × d_model):

    head_i = softmax( (X W_i^Q) (X W_i^K)ᵀ / √d_k ) (X W_i^V)
    MultiHead(X) = Concat(head_1, …, head_h) W^O

W_i^Q is the i-th block of d_k columns of W^Q. With h_kv < h key/value heads (GQA, Ainslie et
al. 2023; MQA when h_kv = 1), query head i uses key/value head i // (h / h_kv). Everything runs in
float64 with a plain loop over heads: slow, obvious, and independent of the torch code.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

Array = NDArray[np.float64]


@dataclass(frozen=True)
class Weights:
    """The four projections in math convention (y = x W + b), as float64 arrays."""

    W_Q: Array  # (d_model, h·d_k)
    W_K: Array  # (d_model, h_kv·d_k)
    W_V: Array  # (d_model, h_kv·d_k)
    W_O: Array  # (h·d_k, d_model)
    b_Q: Array | None = None
    b_K: Array | None = None
    b_V: Array | None = None
    b_O: Array | None = None


def weights_of(module: object) -> Weights:
    """Read a headlab ``MultiHeadAttention``'s weights (nn.Linear stores W transposed)."""

    def mat(linear: object) -> Array:
        return linear.weight.detach().double().numpy().T  # type: ignore[attr-defined]

    def vec(linear: object) -> Array | None:
        b = linear.bias  # type: ignore[attr-defined]
        return None if b is None else b.detach().double().numpy()

    linears = [getattr(module, name) for name in ("W_Q", "W_K", "W_V", "W_O")]
    return Weights(*map(mat, linears), *map(vec, linears))


def softmax(z: Array) -> Array:
    """Row-wise softmax; a row of -inf (nothing allowed) gives zeros."""
    top = np.max(z, axis=-1, keepdims=True)
    top = np.where(np.isfinite(top), top, 0.0)
    e = np.exp(z - top)
    total = e.sum(axis=-1, keepdims=True)
    return np.divide(e, total, out=np.zeros_like(e), where=total > 0)


def multi_head_attention(
    X: Array,
    w: Weights,
    n_heads: int,
    n_kv_heads: int | None = None,
    allowed: NDArray[np.bool_] | None = None,
) -> tuple[Array, Array]:
    """One sequence X (n, d_model) → (output (n, d_model), weights (h, n, n)).

    ``allowed`` is (n, n) or (h, n, n), True where query i may attend to key j.
    """
    n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
    d_k = w.W_Q.shape[1] // n_heads
    group = n_heads // n_kv_heads
    heads, patterns = [], []
    for i in range(n_heads):
        j = i // group  # the key/value head that query head i reads
        cols_q = slice(i * d_k, (i + 1) * d_k)
        cols_kv = slice(j * d_k, (j + 1) * d_k)
        Q = X @ w.W_Q[:, cols_q] + (0 if w.b_Q is None else w.b_Q[cols_q])
        K = X @ w.W_K[:, cols_kv] + (0 if w.b_K is None else w.b_K[cols_kv])
        V = X @ w.W_V[:, cols_kv] + (0 if w.b_V is None else w.b_V[cols_kv])
        scores = Q @ K.T / np.sqrt(d_k)
        if allowed is not None:
            mask = allowed if allowed.ndim == 2 else allowed[i]
            scores = np.where(mask, scores, -np.inf)
        A = softmax(scores)
        heads.append(A @ V)
        patterns.append(A)
    concat = np.concatenate(heads, axis=-1)
    out = concat @ w.W_O + (0 if w.b_O is None else w.b_O)
    return out, np.stack(patterns)
