"""Multi-head attention: the pure function, the layer (MHA / GQA / MQA) and its KV cache.

Shape legend (the page uses the same names)
    B        batch
    n        query positions (new tokens)
    s        key positions: cached + new (s == n without a cache)
    d_model  model width
    h        query heads
    h_kv     key/value heads: h (MHA), 1 (MQA), a divisor of h in between (GQA)
    g        query heads per key/value head, h // h_kv
    d_k      per-head width (d_v == d_k): d_model // h unless chosen (Gemma 3: 256 at d_model 640)

Masks: a boolean ``allowed`` is True where a query may attend to a key (the polarity of
``F.scaled_dot_product_attention``). ``torch.nn.MultiheadAttention`` uses the opposite polarity;
:meth:`MultiHeadAttention.from_torch` and the tests convert at that boundary. With a cache the
causal mask is aligned bottom-right: query i (absolute position offset + i) sees key j when
j <= offset + i (and j > offset + i − w in a sliding window of w keys). A query with nothing
allowed gets zero weights and a zero output, never NaN.

Papers: Vaswani et al. 2017, Shazeer 2019 (MQA), Ainslie et al. 2023 (GQA), Beltagy et al. 2020
(sliding windows), Gemma Team 2024 (soft-capping), Xiao et al. 2023 (sink caches).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from headlab.numbers import valid_head_counts
from headlab.trace import Trace

Impl = Literal["auto", "explicit", "fused"]
# rope(x, offset) rotates queries or keys (B, heads, n, d_k) whose first position is `offset`.
Rope = Callable[[Tensor, int], Tensor]


def attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    allowed: Tensor | None = None,
    scale: float | None = None,
    *,
    softcap: float | None = None,
    dropout: float = 0.0,
    trace: Trace | None = None,
) -> tuple[Tensor, Tensor]:
    """Scaled dot-product attention, written out: ``softmax(q kᵀ · scale) v``.

    Shapes: q (B, h, n, d_k); k (B, h_kv, s, d_k); v (B, h_kv, s, d_v), where h_kv divides h
    (each key/value head serves h // h_kv consecutive query heads, without copying it).
    ``allowed`` is a bool mask broadcastable to (B, h, n, s). ``scale`` defaults to 1/√d_k.
    ``softcap`` c bounds the scores smoothly to (−c, c), c · tanh(scores / c) (Gemma 2).

    Returns ``(out, weights)``: out (B, h, n, d_v) and weights (B, h, n, s), one pattern per
    head. The softmax runs in at least float32 and subtracts the row maximum, so large logits
    stay finite in fp16 and bf16. ``dropout`` drops weights before they average the values
    (``weights`` is the pattern before dropout). ``trace`` records "scores" (the logits before
    the mask, capped, (B, h, n, s)) and "weights": this is the one place either is computed.
    """
    B, h, n, d_k = q.shape
    h_kv, s = k.shape[1], k.shape[2]
    scale = 1.0 / math.sqrt(d_k) if scale is None else scale
    g = h // h_kv
    # the g query heads that share a key/value head are stacked as g·n query rows, so each
    # key/value head is multiplied once and never copied
    q = q.reshape(B, h_kv, g * n, d_k)  # (B, h_kv, g·n, d_k)
    # 1) scores: every query against every key of its key/value head, scaled in place (the
    # product is this function's own, and a fresh (B, h, n, s) buffer costs about a pass)
    scores = (q @ k.transpose(-2, -1)).mul_(scale).reshape(B, h, n, s)  # (B, h, n, s)
    if softcap is not None:
        scores = softcap * torch.tanh(scores / softcap)
    recorded = trace is not None and trace.wants("scores")
    if trace is not None and recorded:
        trace.record("scores", scores)
    # fp16/bf16 scores are softmaxed in float32 (a copy); float64 stays float64
    mine = scores.dtype != torch.promote_types(scores.dtype, torch.float32) or not recorded
    scores = scores.to(torch.promote_types(scores.dtype, torch.float32))
    # 2) mask (in place where no one else holds the scores), then softmax over keys
    if allowed is not None:
        scores = (scores.masked_fill_ if mine else scores.masked_fill)(~allowed, -math.inf)
    # into the trace's buffer where it gives one (reduce_patterns' group of layers: no copy)
    place = None
    if trace is not None and not scores.requires_grad:
        place = trace.place("weights", tuple(scores.shape), scores.dtype, scores.device)
    if place is None:
        weights = torch.softmax(scores, dim=-1)
    else:
        weights = torch.softmax(scores, dim=-1, out=place)
    if allowed is not None:
        # a row with nothing allowed is all -inf, whose softmax is NaN: define it as zeros
        empty = ~allowed.any(dim=-1, keepdim=True)
        if torch.compiler.is_compiling() or empty.any():  # a traced graph asks no value
            weights = weights.masked_fill(empty, 0.0)
    weights = weights.to(v.dtype)
    if trace is not None:
        trace.record("weights", weights)
    # 3) weighted average of the values
    attend = F.dropout(weights, dropout) if dropout else weights
    out = attend.reshape(B, h_kv, g * n, s) @ v  # (B, h_kv, g·n, d_v)
    return out.reshape(B, h, n, v.shape[-1]), weights  # (B, h, n, d_v), (B, h, n, s)


def split_heads(x: Tensor, n_heads: int) -> Tensor:
    """(B, n, heads·d) → (B, heads, n, d): give each head its own slice of the width."""
    B, n, width = x.shape
    return x.view(B, n, n_heads, width // n_heads).transpose(1, 2)  # (B, heads, n, d)


def merge_heads(x: Tensor) -> Tensor:
    """(B, heads, n, d) → (B, n, heads·d): concatenate the heads back side by side."""
    B, heads, n, d = x.shape
    return x.transpose(1, 2).reshape(B, n, heads * d)  # (B, n, heads·d)


def repeat_kv(x: Tensor, g: int) -> Tensor:
    """(B, h_kv, s, d) → (B, h_kv·g, s, d), each key/value head repeated for its g query heads.

    For MQA (h_kv = 1) this is an expanded view (stride 0, no copy). For 1 < h_kv < h the merged
    head axis cannot be expressed as a view, so it is a copy: that is why no compute path calls
    it (:func:`attention` stacks the grouped query heads, the fused path uses SDPA's
    ``enable_gqa``). Only a :class:`Trace` that asks for "k_rep"/"v_rep" gets it, to show the
    shape the keys take.
    """
    if g == 1:
        return x
    B, h_kv, s, d = x.shape
    if h_kv == 1:
        return x.expand(B, g, s, d)  # (B, h, s, d), a view
    return x[:, :, None].expand(B, h_kv, g, s, d).reshape(B, h_kv * g, s, d)  # (B, h, s, d)


def causal_allowed(
    n: int, s: int, device: torch.device | str | None = None, window: int | None = None
) -> Tensor:
    """Bool (n, s) causal mask aligned bottom-right: query i sees key j when j <= (s - n) + i,
    and with a sliding ``window`` w only when also j > (s - n) + i − w (its last w keys)."""
    offset = s - n
    i = torch.arange(n, device=device)[:, None]
    j = torch.arange(s, device=device)[None, :]
    seen = j <= offset + i  # (n, s)
    return seen if window is None else seen & (j > offset + i - window)


def check_config(
    d_model: int, n_heads: int, n_kv_heads: int | None = None, d_k: int | None = None
) -> list[str]:
    """Every problem with a layer configuration, each stated with what would be valid.
    ``d_k`` given: the heads' width is chosen, so d_model need not split evenly into them."""
    problems = []
    if d_model < 1:
        problems.append(f"d_model must be a positive integer, got {d_model}")
    if n_heads < 1:
        problems.append(f"n_heads must be a positive integer, got {n_heads}")
    if d_k is not None and d_k < 1:
        problems.append(f"d_k must be a positive integer or None (d_model // h), got {d_k}")
    if problems:
        return problems
    if d_k is None and d_model % n_heads:
        problems.append(
            f"d_model={d_model} is not divisible by n_heads={n_heads}; "
            f"valid head counts for d_model={d_model}: {_short_list(valid_head_counts(d_model))}"
        )
    if n_kv_heads is not None and (n_kv_heads < 1 or n_heads % n_kv_heads):
        problems.append(
            f"n_heads={n_heads} is not divisible by n_kv_heads={n_kv_heads}; "
            f"valid n_kv_heads for n_heads={n_heads}: {_short_list(valid_head_counts(n_heads))}"
        )
    return problems


def _short_list(values: list[int], limit: int = 24) -> str:
    shown = values if len(values) <= limit else [*values[: limit // 2], "…", *values[-limit // 2 :]]
    return ", ".join(map(str, shown))


class KVCache:
    """Keys and values of the positions seen so far, for incremental decoding.

    Stores h_kv heads, not h: a GQA/MQA cache is h / h_kv times smaller than an MHA cache.
    Buffers are allocated once, (B, h_kv, capacity, d_k) each for keys and values.
    """

    def __init__(
        self,
        batch: int,
        n_kv_heads: int,
        d_k: int,
        capacity: int,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
    ) -> None:
        if capacity < 1:
            raise ValueError(f"KVCache capacity must be at least 1 position, got {capacity}")
        shape = (batch, n_kv_heads, capacity, d_k)
        self.k = torch.zeros(shape, dtype=dtype, device=device)  # (B, h_kv, capacity, d_k)
        self.v = torch.zeros(shape, dtype=dtype, device=device)  # (B, h_kv, capacity, d_k)
        self.capacity = capacity
        self.length = 0

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.k, self.v))  # keys and values

    def next_position(self, n: int) -> int:
        """The position of the first of ``n`` new tokens: here, the number already cached."""
        return self.length

    def append(
        self, k: Tensor, v: Tensor, unrotated: Tensor | None = None, rope: Rope | None = None
    ) -> tuple[Tensor, Tensor]:
        """Store new keys/values (B, h_kv, n, d_k); return all so far, (B, h_kv, s, d_k).
        ``unrotated`` (keys before rotary) and ``rope`` serve caches that move keys: SinkCache."""
        n = k.shape[2]
        if k.shape[:2] != self.k.shape[:2] or k.shape[3] != self.k.shape[3]:
            raise ValueError(
                f"keys of shape {tuple(k.shape)} do not fit this cache, which holds "
                f"(B, h_kv, ·, d_k) = {tuple(self.k.shape[:2])} + (·, {self.k.shape[3]})"
            )
        if self.length + n > self.capacity:
            raise ValueError(
                f"KV cache is full: it holds {self.length} of {self.capacity} positions and "
                f"cannot take {n} more; create it with capacity >= {self.length + n}"
            )
        end = self.length + n
        self.k[:, :, self.length : end] = k
        self.v[:, :, self.length : end] = v
        self.length = end
        return self.k[:, :, :end], self.v[:, :, :end]


def _explicit_path(impl: Impl, return_weights: bool, trace: Trace, capped: bool) -> bool:
    """Whether to attend on the explicit path: weights asked for or traced, chosen, or scores
    soft-capped; "fused" (SDPA) has neither weights nor caps, so with either it is refused."""
    if impl == "fused" and (return_weights or capped):
        why = "computes no attention weights" if return_weights else "has no soft-capping"
        raise ValueError(f'impl="fused" (SDPA) {why}; use impl="explicit" or "auto"')
    return return_weights or capped or impl == "explicit" or (trace.enabled and impl != "fused")


class MultiHeadAttention(nn.Module):
    """Multi-head attention with h query heads and h_kv key/value heads (MHA, GQA or MQA).

    ``W_Q`` maps d_model → h·d_k, ``W_K`` and ``W_V`` map d_model → h_kv·d_k, and ``W_O`` maps
    h·d_k → d_model, as in Vaswani et al. 2017 (MHA), Shazeer 2019 (MQA, h_kv = 1) and
    Ainslie et al. 2023 (GQA). Input and output are (B, n, d_model): the layer preserves shape.

    Off by default, the variants of the families headlab converts: ``d_k`` apart from d_model
    // h (Gemma), ``out_bias=False`` (Qwen2: Q/K/V biases only), a ``scale`` other than 1/√d_k
    (Gemma), soft-capped scores (``softcap``, Gemma 2; always the explicit path, SDPA has no
    cap), a causal sliding ``window`` (Mistral, Gemma's local layers) and ``q_norm``/``k_norm``
    modules a model sets (QK-norm, Gemma 3).
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        n_kv_heads: int | None = None,
        bias: bool = True,
        dropout: float = 0.0,
        *,
        d_k: int | None = None,
        out_bias: bool | None = None,
        scale: float | None = None,
        softcap: float | None = None,
        window: int | None = None,
    ) -> None:
        super().__init__()
        problems = check_config(d_model, n_heads, n_kv_heads, d_k)
        if problems:
            raise ValueError("; ".join(problems))
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}")
        self.d_model = d_model
        self.n_heads = n_heads
        self.n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
        self.d_k = d_model // n_heads if d_k is None else d_k
        self.dropout = dropout
        self.scale, self.softcap, self.window = scale, softcap, window
        width, kv_width = self.n_heads * self.d_k, self.n_kv_heads * self.d_k
        self.W_Q = nn.Linear(d_model, width, bias=bias)
        self.W_K = nn.Linear(d_model, kv_width, bias=bias)
        self.W_V = nn.Linear(d_model, kv_width, bias=bias)
        self.W_O = nn.Linear(width, d_model, bias=bias if out_bias is None else out_bias)
        self.q_norm: nn.Module | None = None  # over each head's d_k, before RoPE
        self.k_norm: nn.Module | None = None

    def extra_repr(self) -> str:
        kind = (
            "MHA" if self.n_kv_heads == self.n_heads else "MQA" if self.n_kv_heads == 1 else "GQA"
        )
        window = "" if self.window is None else f", window={self.window}"
        return (
            f"{kind}, d_model={self.d_model}, n_heads={self.n_heads}, "
            f"n_kv_heads={self.n_kv_heads}, d_k={self.d_k}{window}"
        )

    def new_cache(self, batch: int, capacity: int) -> KVCache:
        """An empty KV cache for this layer's h_kv heads, on its device and dtype."""
        weight = self.W_K.weight
        return KVCache(batch, self.n_kv_heads, self.d_k, capacity, weight.dtype, weight.device)

    def forward(
        self,
        x: Tensor,
        *,
        causal: bool = False,
        allowed: Tensor | None = None,
        head_mask: Tensor | None = None,
        cache: KVCache | None = None,
        return_weights: bool = False,
        rope: Rope | None = None,
        impl: Impl = "auto",
        trace: Trace | None = None,
    ) -> Tensor | tuple[Tensor, Tensor]:
        """x (B, n, d_model) → y (B, n, d_model), or (y, weights (B, h, n, s)).

        causal: query i sees only keys up to its own position (bottom-right with a cache).
        allowed: bool mask broadcastable to (B, h, n, s), True = may attend; combined with causal.
        head_mask: (h,) or (B, h) factors that scale each head's output before W_O (ablation).
        cache: a :class:`KVCache`; the new keys/values are appended and all of them attended to.
        rope: rotary embedding applied to queries and keys after the split (see model/layers.py).
        impl: "explicit" materialises the weights; "fused" calls SDPA (no weights: with
        ``return_weights`` a ValueError); "auto" picks fused unless weights are asked for or
        recorded by an enabled ``trace`` ("fused" then records no weights or scores).
        trace: a :class:`Trace` that receives each named intermediate tensor.
        """
        B, n = self._check_input(x)
        h, h_kv = self.n_heads, self.n_kv_heads
        offset = cache.next_position(n) if cache is not None else 0
        trace = trace if trace is not None else Trace.off()
        trace.record("x", x)
        # 1) project to queries, keys and values
        q, k, v = self.W_Q(x), self.W_K(x), self.W_V(x)  # (B, n, h·d_k), (B, n, h_kv·d_k) ×2
        trace.record("q_proj", q).record("k_proj", k).record("v_proj", v)
        # 2) split the width into heads
        q, k, v = split_heads(q, h), split_heads(k, h_kv), split_heads(v, h_kv)  # (B, ·, n, d_k)
        q, k, unrotated = self._qk_positions(q, k, rope, offset)
        trace.record("q", q).record("k", k).record("v", v)
        if cache is not None:
            k, v = cache.append(k, v, unrotated, rope)  # (B, h_kv, s, d_k)
            trace.record("k_all", k).record("v_all", v)
        s = k.shape[2]
        mask = self._combine_masks(B, n, s, causal, allowed, x.device)
        # 3) attend, each head on its own
        weights: Tensor | None = None
        if _explicit_path(impl, return_weights, trace, self.softcap is not None):
            out, weights = self._explicit(q, k, v, mask, trace)
        else:
            plain = cache is None and allowed is None and self.window is None
            out = self._fused(q, k, v, mask, causal and plain)
        if head_mask is not None:
            out = out * self._head_factors(head_mask, B)  # (B, h, n, d_k)
        trace.record("head_out", out)
        # 4) concatenate the heads and mix them with W_O
        merged = merge_heads(out)  # (B, n, d_model)
        y = self.W_O(merged)  # (B, n, d_model)
        trace.record("merged", merged).record("out", y)
        if return_weights:
            assert weights is not None
            return y, weights
        return y

    def _qk_positions(
        self, q: Tensor, k: Tensor, rope: Rope | None, offset: int
    ) -> tuple[Tensor, Tensor, Tensor]:
        """Queries and keys as the scores see them (QK-norm'd when set, then RoPE), and the keys
        before RoPE (a sink cache turns them again when they change slot)."""
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        unrotated = k
        if rope is not None:
            q, k = rope(q, offset), rope(k, offset)
        return q, k, unrotated

    def _explicit(
        self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, trace: Trace
    ) -> tuple[Tensor, Tensor]:
        g = self.n_heads // self.n_kv_heads
        if g > 1 and trace.wants("k_rep"):  # only to show the repeated keys' shape
            trace.record("k_rep", repeat_kv(k, g)).record("v_rep", repeat_kv(v, g))
        dropout = self.dropout if self.training else 0.0
        return attention(
            q, k, v, mask, self.scale, softcap=self.softcap, dropout=dropout, trace=trace
        )

    def _fused(
        self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, is_causal: bool
    ) -> Tensor:
        out = F.scaled_dot_product_attention(
            q,
            k,
            v,
            attn_mask=None if is_causal else mask,
            dropout_p=self.dropout if self.training else 0.0,
            is_causal=is_causal,
            scale=self.scale,
            enable_gqa=self.n_kv_heads != self.n_heads,
        )  # (B, h, n, d_k)
        if mask is not None and not is_causal:
            # SDPA leaves NaN in rows with nothing allowed; the convention here is zeros
            out = out.masked_fill(~mask.any(dim=-1, keepdim=True), 0.0)
        return out

    def _check_input(self, x: Tensor) -> tuple[int, int]:
        if x.dim() != 3:
            raise ValueError(
                f"input must have 3 dimensions (B, n, d_model), got shape {tuple(x.shape)}; "
                "add a batch dimension with x.unsqueeze(0)"
            )
        if x.shape[-1] != self.d_model:
            raise ValueError(
                f"input width is {x.shape[-1]} but this layer has d_model={self.d_model}; "
                f"expected shape (B, n, {self.d_model})"
            )
        return x.shape[0], x.shape[1]

    def _combine_masks(
        self,
        B: int,
        n: int,
        s: int,
        causal: bool,
        allowed: Tensor | None,
        device: torch.device,
    ) -> Tensor | None:
        mask = causal_allowed(n, s, device, self.window) if causal else None  # (n, s)
        if allowed is None:
            return mask
        if allowed.dtype != torch.bool:
            raise ValueError(
                f"allowed must be a bool tensor (True = may attend), got dtype {allowed.dtype}"
            )
        target = (B, self.n_heads, n, s)
        try:
            if torch.broadcast_shapes(allowed.shape, target) != torch.Size(target):
                raise RuntimeError
        except RuntimeError:
            raise ValueError(
                f"allowed has shape {tuple(allowed.shape)}, which does not broadcast to "
                f"(B, h, n, s) = {target}; valid shapes include (n, s), (B, 1, 1, s) for padding "
                f"and (B, h, n, s)"
            ) from None
        return allowed if mask is None else allowed & mask

    def _head_factors(self, head_mask: Tensor, B: int) -> Tensor:
        h = self.n_heads
        if head_mask.shape == (h,):
            return head_mask.view(1, h, 1, 1)
        if head_mask.shape == (B, h):
            return head_mask.view(B, h, 1, 1)
        raise ValueError(
            f"head_mask has shape {tuple(head_mask.shape)}; "
            f"expected ({h},) or (B, {h}) = ({B}, {h})"
        )

    @classmethod
    def from_torch(cls, m: nn.MultiheadAttention) -> MultiHeadAttention:
        """A copy of a ``torch.nn.MultiheadAttention`` (packed or separate q/k/v weights)."""
        if m.bias_k is not None or m.add_zero_attn:
            raise ValueError("add_bias_kv and add_zero_attn have no equivalent in headlab")
        if m.kdim != m.embed_dim or m.vdim != m.embed_dim:
            raise ValueError(f"kdim={m.kdim} and vdim={m.vdim} must equal embed_dim={m.embed_dim}")
        has_bias = m.in_proj_bias is not None
        out = cls(m.embed_dim, m.num_heads, bias=has_bias, dropout=m.dropout)
        if m._qkv_same_embed_dim:
            w_q, w_k, w_v = m.in_proj_weight.chunk(3)
        else:
            w_q, w_k, w_v = m.q_proj_weight, m.k_proj_weight, m.v_proj_weight
        with torch.no_grad():
            for linear, w in zip((out.W_Q, out.W_K, out.W_V), (w_q, w_k, w_v), strict=True):
                linear.weight.copy_(w)
            out.W_O.weight.copy_(m.out_proj.weight)
            if has_bias:
                for linear, b in zip(
                    (out.W_Q, out.W_K, out.W_V), m.in_proj_bias.chunk(3), strict=True
                ):
                    linear.bias.copy_(b)
                out.W_O.bias.copy_(m.out_proj.bias)
        return out.to(m.out_proj.weight.dtype)

    def to_torch(self, batch_first: bool = True) -> nn.MultiheadAttention:
        """A ``torch.nn.MultiheadAttention`` with this layer's weights (MHA only)."""
        if self.n_kv_heads != self.n_heads or self.n_heads * self.d_k != self.d_model:
            raise ValueError(
                f"torch.nn.MultiheadAttention has one K/V head per query head and d_k = d_model "
                f"/ h; this layer has n_kv_heads={self.n_kv_heads}, n_heads={self.n_heads}, "
                f"d_k={self.d_k} (only MHA converts)"
            )
        has_bias = self.W_Q.bias is not None
        m = nn.MultiheadAttention(
            self.d_model, self.n_heads, dropout=self.dropout, bias=has_bias, batch_first=batch_first
        )
        with torch.no_grad():
            m.in_proj_weight.copy_(torch.cat([self.W_Q.weight, self.W_K.weight, self.W_V.weight]))
            m.out_proj.weight.copy_(self.W_O.weight)
            if has_bias:
                m.in_proj_bias.copy_(torch.cat([self.W_Q.bias, self.W_K.bias, self.W_V.bias]))
                m.out_proj.bias.copy_(self.W_O.bias)
        return m.to(self.W_O.weight.dtype)
