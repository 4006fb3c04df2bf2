"""The parts of a block: norms (LayerNorm, RMSNorm), rotary positions, the MLP, and the block
itself. Shapes as in :mod:`headlab.model`'s legend.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from headlab.attention import KVCache, MultiHeadAttention
from headlab.model.config import ModelConfig
from headlab.trace import Trace


class RMSNorm(nn.Module):
    """x / sqrt(mean(x²) + eps) · weight, computed in float32 (Zhang & Sennrich 2019; Llama)."""

    def __init__(self, d_model: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d_model))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


def make_norm(config: ModelConfig, width: int | None = None) -> nn.Module:
    """The norm this config asks for (LayerNorm or RMSNorm) over ``width`` (d_model unless
    given), or identity when norm == "none"."""
    width = config.d_model if width is None else width
    if config.norm == "none":
        return nn.Identity()
    if config.norm_kind == "rmsnorm":
        return RMSNorm(width, config.norm_eps)
    return nn.LayerNorm(width, eps=config.norm_eps)


class Rotary(nn.Module):
    """Rotary position embedding (Su et al. 2021), half-split layout as in HF Llama.

    Rotates each (x_i, x_{i + r/2}) pair of the first r = ``rotary_dim`` dims of a query or key
    (B, heads, n, d_k) by the angle position · θ^(−2i/r); the other d_k − r dims pass unturned
    (partial rotary, GPT-NeoX and Phi-3; r = d_k by default). Called as the ``rope`` hook of
    :class:`MultiHeadAttention`.
    """

    def __init__(self, d_k: int, theta: float, rotary_dim: int | None = None) -> None:
        super().__init__()
        r = d_k if rotary_dim is None else rotary_dim
        inv_freq = 1.0 / theta ** (torch.arange(0, r, 2, dtype=torch.float32) / r)
        self.inv_freq: Tensor
        self.register_buffer("inv_freq", inv_freq, persistent=False)  # (r/2,)

    def forward(self, x: Tensor, offset: int = 0) -> Tensor:
        n, r = x.shape[-2], 2 * self.inv_freq.shape[0]  # x (B, heads, n, d_k)
        pos = torch.arange(offset, offset + n, device=x.device, dtype=torch.float32)
        freqs = pos[:, None] * self.inv_freq.to(x.device)[None, :]  # (n, r/2), on x's device
        angles = torch.cat([freqs, freqs], dim=-1)  # (n, r)
        cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
        turned, passed = x[..., :r], x[..., r:]  # (B, heads, n, r), (B, heads, n, d_k − r)
        x1, x2 = turned[..., : r // 2], turned[..., r // 2 :]
        rotated = torch.cat([-x2, x1], dim=-1)  # (B, heads, n, r)
        out = turned * cos + rotated * sin
        return out if passed.shape[-1] == 0 else torch.cat([out, passed], dim=-1)


class MLP(nn.Module):
    """Position-wise feed-forward: W_out(act(W_in x)), or gated (SwiGLU, Shazeer 2020)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        d, hidden, bias = config.d_model, config.hidden, config.mlp_bias
        self.gated = config.mlp == "gated"
        self.W_in = nn.Linear(d, hidden, bias=bias)
        self.W_gate = nn.Linear(d, hidden, bias=bias) if self.gated else None
        self.W_out = nn.Linear(hidden, d, bias=bias)
        self.activation = config.activation

    def act(self, x: Tensor) -> Tensor:
        if self.activation == "gelu_tanh":
            return F.gelu(x, approximate="tanh")
        if self.activation == "relu":
            return F.relu(x)
        if self.activation == "silu":
            return F.silu(x)
        return F.gelu(x)

    def forward(self, x: Tensor) -> Tensor:
        if self.W_gate is not None:
            return self.W_out(self.act(self.W_gate(x)) * self.W_in(x))  # (B, n, d_model)
        return self.W_out(self.act(self.W_in(x)))  # (B, n, d_model)


class Block(nn.Module):
    """One transformer block: attention and (unless attention-only) an MLP, each residual.

    Block ``layer`` is local (a sliding window) when the config lists it in ``local_layers``.
    With norm="sandwich" each sub-layer's output is normed too, ``norm_attn_out`` and
    ``norm_mlp_out``, before it joins the residual stream (Gemma 2 and 3); with
    ``parallel_residual`` attention and MLP both read the block's input (GPT-NeoX).
    """

    def __init__(self, config: ModelConfig, layer: int = 0) -> None:
        super().__init__()
        self.config = config
        self.local = layer in config.local_layers
        self.norm_attn = make_norm(config)
        self.attn = MultiHeadAttention(
            config.d_model,
            config.n_heads,
            config.n_kv_heads,
            config.bias,
            config.dropout,
            d_k=config.head_dim,
            out_bias=config.attn_out_bias,
            scale=config.attn_scale,
            softcap=config.attn_softcap,
            window=config.sliding_window if self.local else None,
        )
        if config.qk_norm:
            self.attn.q_norm = make_norm(config, config.d_k)
            self.attn.k_norm = make_norm(config, config.d_k)
        sandwich = config.norm == "sandwich"
        self.norm_attn_out = make_norm(config) if sandwich else None
        self.norm_mlp = None if config.attn_only else make_norm(config)
        self.mlp = None if config.attn_only else MLP(config)
        self.norm_mlp_out = make_norm(config) if sandwich and self.mlp is not None else None
        self.drop = nn.Dropout(config.dropout)

    def forward(
        self,
        x: Tensor,
        trace: Trace,
        head_mask: Tensor | None,
        allowed: Tensor | None,
        rope: Rotary | None,
        cache: KVCache | None = None,
    ) -> Tensor:
        """x (B, n, d_model) → (B, n, d_model). head_mask (h,) or (B, h); allowed (B, 1, 1, n);
        cache: this layer's keys and values so far, extended with the new ones."""
        post = self.config.norm == "post"
        trace.record("resid_pre", x)
        a_in = x if post else self.norm_attn(x)
        a = self.attn(
            a_in,
            causal=self.config.causal,
            allowed=allowed,
            head_mask=head_mask,
            cache=cache,
            rope=rope,
            trace=trace.scope("attn"),
        )
        assert isinstance(a, Tensor)
        a = self.drop(a)
        if self.norm_attn_out is not None:
            a = self.norm_attn_out(a)
        trace.record("attn_out", a)
        if self.config.parallel_residual:
            return self._parallel(x, a, trace)
        x = self.norm_attn(x + a) if post else x + a
        trace.record("resid_mid", x)
        if self.mlp is not None and self.norm_mlp is not None:
            m = self.drop(self.mlp(x if post else self.norm_mlp(x)))
            if self.norm_mlp_out is not None:
                m = self.norm_mlp_out(m)
            trace.record("mlp_out", m)
            x = self.norm_mlp(x + m) if post else x + m
        trace.record("resid_post", x)
        return x

    def _parallel(self, x: Tensor, a: Tensor, trace: Trace) -> Tensor:
        """GPT-NeoX's parallel residual: the MLP reads the block's input x, not x + a, and
        both outputs join the stream at once (resid_mid is x + a, what attention added)."""
        assert self.mlp is not None and self.norm_mlp is not None
        trace.record("resid_mid", x + a)
        m = self.drop(self.mlp(self.norm_mlp(x)))
        trace.record("mlp_out", m)
        x = m + a + x  # the order GPT-NeoX adds them in
        trace.record("resid_post", x)
        return x
