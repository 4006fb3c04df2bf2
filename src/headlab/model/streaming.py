"""StreamingLLM's KV-cache policy (Xiao et al. 2023): keep the first ``sinks`` tokens and a
window of the last ``window``, so memory stays at sinks + window positions however long the text.

Positions are cache slots, not places in the text, as Xiao et al. assign them: the sinks sit at
positions 0 … sinks − 1, the window right after them, and the newest token at the last slot. When
a token leaves the window, the ones after it move down a slot and their keys are rotated again
(rotary, Su et al. 2021) at their new position; the cache keeps each key as it was before
rotary for that. With ``sinks = 0`` this is a plain sliding window (rotary depends only on the
distance between query and key, which moving every key and the query alike leaves unchanged);
while nothing has been dropped it is the ordinary :class:`headlab.attention.KVCache`, bit for bit.

Once full it takes one token at a time: each query of a longer chunk would need its own window.
:meth:`headlab.model.Transformer.forward` feeds an overflowing chunk token by token itself.
"""

from __future__ import annotations

import torch
from torch import Tensor

from headlab.attention import KVCache, Rope


class SinkCache(KVCache):
    """The first ``sinks`` positions and the last ``window`` of one layer: buffers (B, h_kv,
    sinks + window, d_k) for keys, values and keys before rotary, allocated once."""

    def __init__(
        self,
        batch: int,
        n_kv_heads: int,
        d_k: int,
        sinks: int,
        window: int,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
    ) -> None:
        if sinks < 0 or window < 1:
            raise ValueError(
                f"a sink cache keeps sinks >= 0 first tokens and a window >= 1 of the latest; "
                f"got sinks={sinks}, window={window}"
            )
        super().__init__(batch, n_kv_heads, d_k, sinks + window, dtype, device)
        self.sinks, self.window = sinks, window
        # keys before rotary; torch.zeros, not zeros_like: on meta (the shape report) zeros_like
        # is decomposed in Python, whose first call imports sympy
        self.raw = torch.zeros(self.k.shape, dtype=dtype, device=self.k.device)
        self.dropped = 0  # tokens that have left the window so far

    @property
    def nbytes(self) -> int:
        """Bytes held by the key, value and unrotated-key buffers."""
        return super().nbytes + self.raw.numel() * self.raw.element_size()

    def next_position(self, n: int) -> int:
        """The slot of the first of ``n`` new tokens: after the cached ones, or the last slot
        once the cache is full (one token at a time then)."""
        if self.length + n <= self.capacity:
            return self.length
        if n != 1:
            raise ValueError(
                f"a full sink cache takes one token at a time, not {n}: each would need its "
                "own window (Transformer.forward splits a longer chunk itself)"
            )
        return self.capacity - 1

    def append(
        self, k: Tensor, v: Tensor, unrotated: Tensor | None = None, rope: Rope | None = None
    ) -> tuple[Tensor, Tensor]:
        """Store new keys/values (B, h_kv, n, d_k), rotated at :meth:`next_position`, dropping
        the oldest window token first when full; return the kept ones, (B, h_kv, s, d_k)."""
        n = k.shape[2]
        if self.length + n > self.capacity:
            self.next_position(n)  # refuses a chunk with the reason
            self._drop_oldest(rope)
        if unrotated is not None:
            self.raw[:, :, self.length : self.length + n] = unrotated
        return super().append(k, v)

    def _drop_oldest(self, rope: Rope | None) -> None:
        """Drop the window's oldest token; the rest move down one slot, keys rotated again."""
        first, end = self.sinks, self.length
        for buffer in (self.k, self.v, self.raw):
            buffer[:, :, first : end - 1] = buffer[:, :, first + 1 : end].clone()
        self.length, self.dropped = end - 1, self.dropped + 1
        if rope is not None and end - 1 > first:
            self.k[:, :, first : end - 1] = rope(self.raw[:, :, first : end - 1], first)
