"""A small transformer built on headlab's attention: GPT-style by default, BERT- and Llama-shaped
when converted from Hugging Face (see :mod:`headlab.convert`).

Shape legend
    B        batch
    n        tokens (query positions)
    s        key positions: cached + new (s == n without a cache)
    d_model  model width
    h        query heads per layer, h_kv key/value heads
    d_ff     hidden width of the feed-forward block
    V        vocabulary size

``Transformer(config)(tokens, trace=Trace())`` returns logits (B, n, V) and fills the trace with
a named cache of activations (with a KV cache, the weights are (B, h, n, s)):

    embed                      token (+ position) embeddings, after the embedding norm if any
    blocks.{l}.resid_pre       the residual stream entering block l           (B, n, d_model)
    blocks.{l}.attn.*          everything MultiHeadAttention records; among them
    blocks.{l}.attn.weights    each head's attention pattern                   (B, h, n, n)
    blocks.{l}.attn.head_out   each head's output, before W_O                  (B, h, n, d_k)
    blocks.{l}.attn_out        the attention sub-layer's output                (B, n, d_model)
    blocks.{l}.resid_mid       the residual stream between attention and MLP   (B, n, d_model)
    blocks.{l}.mlp_out         the MLP sub-layer's output (absent if attn_only)(B, n, d_model)
    blocks.{l}.resid_post      the residual stream leaving block l             (B, n, d_model)
    final                      the last hidden state, after the final norm     (B, n, d_model)

Norm placement: "pre" (GPT-2, Llama: x + f(norm(x)), then a final norm), "post" (BERT:
norm(x + f(x)), no final norm) or "none". Positions: "learned" absolute embeddings (GPT-2,
BERT), "rotary" (Su et al. 2021, RoFormer; the half-split layout Llama uses) or "none".
Decoding: ``forward(new_tokens, cache=model.new_cache(B, capacity))`` keeps one
:class:`headlab.attention.KVCache` per layer, so each step runs only the new tokens; positions
(learned or rotary) continue from the number of tokens cached. :meth:`Transformer.generate`
decodes greedily or by sampling with it.

Papers: Vaswani et al. 2017; Radford et al. 2019 (GPT-2); Devlin et al. 2019 (BERT);
Touvron et al. 2023 (Llama); Elhage et al. 2021 (attention-only models).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode

from headlab.attention import KVCache, MultiHeadAttention, check_config
from headlab.trace import Trace

Positional = Literal["learned", "rotary", "none"]
NormPlace = Literal["pre", "post", "none"]
NormKind = Literal["layernorm", "rmsnorm"]
Activation = Literal["gelu", "gelu_tanh", "relu", "silu"]
MlpKind = Literal["standard", "gated"]

_CHOICES = {
    "positional": ("learned", "rotary", "none"),
    "norm": ("pre", "post", "none"),
    "norm_kind": ("layernorm", "rmsnorm"),
    "activation": ("gelu", "gelu_tanh", "relu", "silu"),
    "mlp": ("standard", "gated"),
}


@dataclass(frozen=True)
class ModelConfig:
    """Everything that fixes a Transformer's shape and arithmetic (weights aside)."""

    vocab_size: int  # V, number of token ids
    d_model: int  # width of the residual stream
    n_layers: int  # number of blocks
    n_heads: int  # query heads per layer
    n_kv_heads: int | None = None  # key/value heads: None = n_heads (MHA), 1 = MQA, else GQA
    d_ff: int | None = None  # MLP hidden width; None = 4 · d_model
    max_len: int = 1024  # longest sequence the model accepts (learned positions need a table)
    positional: Positional = "learned"  # absolute learned table, rotary (RoPE) or none
    rope_theta: float = 10000.0  # RoPE base; used only when positional == "rotary"
    norm: NormPlace = "pre"  # where the norms sit: pre-LN, post-LN (BERT) or none
    norm_kind: NormKind = "layernorm"  # LayerNorm (GPT-2, BERT) or RMSNorm (Llama)
    norm_eps: float = 1e-5  # epsilon inside every norm
    embed_norm: bool = False  # a norm right after the embeddings (BERT)
    attn_only: bool = False  # no MLPs: the attention-only models of Elhage et al. 2021
    causal: bool = True  # decoder (causal) or encoder (bidirectional) attention
    activation: Activation = "gelu"  # MLP nonlinearity; gelu_tanh is GPT-2's "gelu_new"
    mlp: MlpKind = "standard"  # W_out(act(W_in x)) or gated W_down(act(W_gate x) · W_up x)
    bias: bool = True  # biases in the attention projections
    mlp_bias: bool = True  # biases in the MLP
    tie_embeddings: bool = True  # unembedding = embedding matrix transposed
    dropout: float = 0.0  # attention-weight and residual dropout (training only)
    init_std: float = 0.02  # standard deviation of the random initial weights

    def __post_init__(self) -> None:
        problems = self.problems()
        if problems:
            raise ValueError("invalid ModelConfig: " + "; ".join(problems))

    def problems(self) -> list[str]:
        """Every problem with this configuration, each saying what would be valid."""
        out = []
        for name in ("vocab_size", "n_layers", "max_len"):
            if getattr(self, name) < 1:
                out.append(f"{name} must be a positive integer, got {getattr(self, name)}")
        if self.d_ff is not None and self.d_ff < 1:
            out.append(f"d_ff must be a positive integer or None, got {self.d_ff}")
        for name, valid in _CHOICES.items():
            if getattr(self, name) not in valid:
                out.append(f"{name} must be one of {', '.join(valid)}; got {getattr(self, name)!r}")
        out += check_config(self.d_model, self.n_heads, self.n_kv_heads)
        if self.positional == "rotary" and self.n_heads > 0 and (self.d_model // self.n_heads) % 2:
            out.append(f"rotary positions need an even d_k, got {self.d_model // self.n_heads}")
        if not 0.0 <= self.dropout < 1.0:
            out.append(f"dropout must be in [0, 1), got {self.dropout}")
        return out

    @property
    def d_k(self) -> int:
        return self.d_model // self.n_heads

    @property
    def hidden(self) -> int:
        """The MLP hidden width actually used (d_ff, or 4 · d_model when d_ff is None)."""
        return self.d_ff if self.d_ff is not None else 4 * self.d_model

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> ModelConfig:
        """Inverse of :meth:`to_dict`; unknown keys are an error naming the known ones."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown ModelConfig fields {unknown}; known: {sorted(known)}")
        return cls(**data)


class SkipInit(TorchFunctionMode):
    """Inside this context ``torch.nn.init``'s random fills do nothing: the new modules keep
    uninitialised memory. For weights about to be loaded from a file, where drawing 135 M
    random numbers first took longer than reading the file. Torch function modes are per
    thread, so other threads are unaffected.
    """

    SKIPPED = frozenset(
        {nn.init.normal_, nn.init.uniform_, nn.init.kaiming_uniform_, nn.init.trunc_normal_}
    )

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in self.SKIPPED:
            return args[0] if args else kwargs["tensor"]
        return func(*args, **kwargs)


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


def make_norm(config: ModelConfig) -> nn.Module:
    """The norm this config asks for (LayerNorm or RMSNorm), or identity when norm == "none"."""
    if config.norm == "none":
        return nn.Identity()
    if config.norm_kind == "rmsnorm":
        return RMSNorm(config.d_model, config.norm_eps)
    return nn.LayerNorm(config.d_model, eps=config.norm_eps)


class Rotary(nn.Module):
    """Rotary position embedding (Su et al. 2021), half-split layout as in HF Llama.

    Rotates each (x_i, x_{i + d_k/2}) pair of a query or key (B, heads, n, d_k) by the angle
    position · θ^(−2i/d_k). Called as the ``rope`` hook of :class:`MultiHeadAttention`.
    """

    def __init__(self, d_k: int, theta: float) -> None:
        super().__init__()
        inv_freq = 1.0 / theta ** (torch.arange(0, d_k, 2, dtype=torch.float32) / d_k)
        self.inv_freq: Tensor
        self.register_buffer("inv_freq", inv_freq, persistent=False)  # (d_k/2,)

    def forward(self, x: Tensor, offset: int = 0) -> Tensor:
        n, d_k = x.shape[-2], x.shape[-1]  # x (B, heads, n, d_k)
        pos = torch.arange(offset, offset + n, device=x.device, dtype=torch.float32)
        freqs = pos[:, None] * self.inv_freq.to(x.device)[None, :]  # (n, d_k/2), on x's device
        angles = torch.cat([freqs, freqs], dim=-1)  # (n, d_k)
        cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
        x1, x2 = x[..., : d_k // 2], x[..., d_k // 2 :]
        rotated = torch.cat([-x2, x1], dim=-1)  # (B, heads, n, d_k)
        return x * cos + rotated * sin


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
    """One transformer block: attention and (unless attention-only) an MLP, each residual."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.norm_attn = make_norm(config)
        self.attn = MultiHeadAttention(
            config.d_model, config.n_heads, config.n_kv_heads, config.bias, config.dropout
        )
        self.norm_mlp = None if config.attn_only else make_norm(config)
        self.mlp = None if config.attn_only else MLP(config)
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
        trace.record("attn_out", a)
        x = self.norm_attn(x + a) if post else x + a
        trace.record("resid_mid", x)
        if self.mlp is not None and self.norm_mlp is not None:
            m = self.drop(self.mlp(x if post else self.norm_mlp(x)))
            trace.record("mlp_out", m)
            x = self.norm_mlp(x + m) if post else x + m
        trace.record("resid_post", x)
        return x


class Transformer(nn.Module):
    """Embedding → blocks → final norm → unembedding, recording into an optional Trace."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.embed = nn.Embedding(config.vocab_size, config.d_model)
        self.pos_embed = (
            nn.Embedding(config.max_len, config.d_model) if config.positional == "learned" else None
        )
        self.embed_norm = make_norm(config) if config.embed_norm else None
        self.rotary = (
            Rotary(config.d_k, config.rope_theta) if config.positional == "rotary" else None
        )
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layers))
        self.final_norm = make_norm(config) if config.norm == "pre" else nn.Identity()
        self.unembed = nn.Linear(config.d_model, config.vocab_size, bias=False)
        self.drop = nn.Dropout(config.dropout)
        self._init_weights()
        if config.tie_embeddings:
            self.unembed.weight = self.embed.weight

    def _init_weights(self) -> None:
        std = self.config.init_std
        for module in self.modules():
            if isinstance(module, nn.Linear | nn.Embedding):
                nn.init.normal_(module.weight, std=std)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)
        # scale the residual-writing projections by depth, as GPT-2 does
        for block in self.blocks:
            assert isinstance(block, Block)
            out_std = std / math.sqrt(2 * self.config.n_layers)
            nn.init.normal_(block.attn.W_O.weight, std=out_std)
            if block.mlp is not None:
                nn.init.normal_(block.mlp.W_out.weight, std=out_std)

    def forward(
        self,
        tokens: Tensor,
        *,
        trace: Trace | None = None,
        head_mask: Tensor | None = None,
        allowed: Tensor | None = None,
        cache: list[KVCache] | None = None,
    ) -> Tensor:
        """tokens (B, n) int → logits (B, n, V).

        trace: receives the named activations listed in the module docstring.
        head_mask: (n_layers, h) or (B, n_layers, h) factors on each head's output (1 keeps,
        0 ablates), reaching every layer (Michel et al. 2019).
        allowed: (B, n) bool, False at padding positions, which no query may attend to.
        cache: one :class:`KVCache` per layer (:meth:`new_cache`); the tokens continue the
        cached ones, at positions cache length … cache length + n − 1.
        """
        x = self.hidden_states(
            tokens, trace=trace, head_mask=head_mask, allowed=allowed, cache=cache
        )
        return self.unembed(x)  # (B, n, V)

    def hidden_states(
        self,
        tokens: Tensor,
        *,
        trace: Trace | None = None,
        head_mask: Tensor | None = None,
        allowed: Tensor | None = None,
        cache: list[KVCache] | None = None,
    ) -> Tensor:
        """tokens (B, n) → the final hidden state (B, n, d_model), before the unembedding."""
        trace = trace if trace is not None else Trace.off()
        offset = self._check_cache(cache, tokens, allowed)
        B, n = self._check_tokens(tokens, offset)
        masks = self._layer_head_masks(head_mask, B)
        key_allowed = self._check_allowed(allowed, B, n)
        layer_caches: list[KVCache | None] = list(cache) if cache else [None] * len(self.blocks)
        x = self.embed(tokens)  # (B, n, d_model)
        if self.pos_embed is not None:
            positions = torch.arange(offset, offset + n, device=tokens.device)
            x = x + self.pos_embed(positions)  # (B, n, d_model)
        if self.embed_norm is not None:
            x = self.embed_norm(x)
        x = self.drop(x)
        trace.record("embed", x)
        for l, block in enumerate(self.blocks):
            scope = trace.scope(f"blocks.{l}")
            x = block(x, scope, masks[l], key_allowed, self.rotary, layer_caches[l])
        x = self.final_norm(x)
        trace.record("final", x)
        return x

    def _check_tokens(self, tokens: Tensor, offset: int = 0) -> tuple[int, int]:
        if tokens.dim() != 2 or tokens.dtype not in (torch.long, torch.int32, torch.int64):
            raise ValueError(
                f"tokens must be an integer tensor of shape (B, n), got {tuple(tokens.shape)} "
                f"{tokens.dtype}; add a batch dimension with tokens.unsqueeze(0)"
            )
        B, n = tokens.shape
        if n < 1 or offset + n > self.config.max_len:
            cached = f" after {offset} cached positions" if offset else ""
            raise ValueError(
                f"sequence length {n}{cached} is outside 1..{self.config.max_len - offset} "
                f"(max_len {self.config.max_len})"
            )
        if tokens.numel() and (tokens.min() < 0 or tokens.max() >= self.config.vocab_size):
            raise ValueError(
                f"token ids must be in 0..{self.config.vocab_size - 1}, got "
                f"{int(tokens.min())}..{int(tokens.max())}"
            )
        return B, n

    def _check_cache(
        self, cache: list[KVCache] | None, tokens: Tensor, allowed: Tensor | None
    ) -> int:
        """The number of positions already cached (0 without a cache), after checking it."""
        if cache is None:
            return 0
        L = self.config.n_layers
        if len(cache) != L or len({c.length for c in cache}) != 1:
            raise ValueError(
                f"cache must hold one KVCache per layer ({L}), all of the same length; "
                "make it with model.new_cache(batch, capacity)"
            )
        if allowed is not None:
            raise ValueError("a KV cache decodes unpadded sequences: pass allowed=None with it")
        if not self.config.causal:
            raise ValueError("a KV cache needs a causal model; this one attends both ways")
        if tokens.dim() == 2 and cache[0].k.shape[0] != tokens.shape[0]:
            raise ValueError(
                f"the cache holds {cache[0].k.shape[0]} sequences but tokens has "
                f"{tokens.shape[0]}; make one with model.new_cache({tokens.shape[0]}, capacity)"
            )
        return cache[0].length

    def new_cache(self, batch: int, capacity: int) -> list[KVCache]:
        """An empty KV cache per layer for ``batch`` sequences of up to ``capacity`` positions.

        Each layer's holds keys and values (B, h_kv, capacity, d_k): 2 · L · B · h_kv · s · d_k
        numbers in all for s positions, h / h_kv times fewer than with one K/V head per query
        head (Shazeer 2019; Ainslie et al. 2023).
        """
        if not 1 <= capacity <= self.config.max_len:
            raise ValueError(
                f"cache capacity must be 1..{self.config.max_len} (max_len), got {capacity}"
            )
        return [block.attn.new_cache(batch, capacity) for block in self._blocks()]

    def _blocks(self) -> list[Block]:
        return [block for block in self.blocks if isinstance(block, Block)]

    def _layer_head_masks(self, head_mask: Tensor | None, B: int) -> list[Tensor | None]:
        L, h = self.config.n_layers, self.config.n_heads
        if head_mask is None:
            return [None] * L
        if head_mask.shape == (L, h):
            return list(head_mask.to(self.embed.weight.dtype))
        if head_mask.shape == (B, L, h):
            return list(head_mask.to(self.embed.weight.dtype).transpose(0, 1))
        raise ValueError(
            f"head_mask has shape {tuple(head_mask.shape)}; expected (n_layers, h) = ({L}, {h}) "
            f"or (B, n_layers, h) = ({B}, {L}, {h})"
        )

    def _check_allowed(self, allowed: Tensor | None, B: int, n: int) -> Tensor | None:
        if allowed is None:
            return None
        if allowed.dtype != torch.bool or allowed.shape != (B, n):
            raise ValueError(
                f"allowed must be a bool tensor of shape (B, n) = ({B}, {n}) with False at "
                f"padding; got {tuple(allowed.shape)} {allowed.dtype}"
            )
        return allowed[:, None, None, :]  # (B, 1, 1, n)

    @torch.inference_mode()
    def generate(
        self,
        tokens: Tensor,
        max_new_tokens: int,
        temperature: float = 0.0,
        top_k: int | None = None,
        seed: int | None = None,
        eos_id: int | None = None,
    ) -> Tensor:
        """tokens (B, n) → (B, n + new): the prompt followed by up to ``max_new_tokens`` tokens.

        One forward pass over the prompt fills a KV cache (:meth:`new_cache`); every further
        step runs only the newest token. temperature 0 picks the most likely token (greedy);
        above 0, tokens are sampled from softmax(logits / temperature), restricted to the
        ``top_k`` most likely when given, with a generator seeded by ``seed``. With ``eos_id``
        a sequence that emits it is padded with it, and decoding stops once all have.
        Raises ValueError for settings outside these ranges or a prompt that leaves no room.
        """
        n = tokens.shape[-1]
        problems = generation_problems(n, self.config, max_new_tokens, temperature, top_k)
        if problems:
            raise ValueError("; ".join(problems))
        B, n = self._check_tokens(tokens)
        cache = self.new_cache(B, n + max_new_tokens)
        generator = None if seed is None else torch.Generator(tokens.device).manual_seed(seed)
        hidden = self.hidden_states(tokens, cache=cache)[:, -1]  # (B, d_model)
        out, done = [tokens], torch.zeros(B, dtype=torch.bool, device=tokens.device)
        for step in range(max_new_tokens):
            logits = self.unembed(hidden)  # (B, V)
            new = pick_tokens(logits, temperature, top_k, generator)  # (B,)
            if eos_id is not None:
                new = new.masked_fill(done, eos_id)
                done |= new == eos_id
            out.append(new[:, None])
            if step + 1 == max_new_tokens or bool(done.all()):
                break
            hidden = self.hidden_states(new[:, None], cache=cache)[:, -1]  # (B, d_model)
        return torch.cat(out, dim=1)  # (B, n + new)

    def save(self, directory: str | Path) -> Path:
        """Write ``config.json`` and ``model.safetensors`` into ``directory``, each atomically;
        returns it. For a whole folder at once, save into :func:`headlab.files.new_folder`."""
        from safetensors.torch import save_model

        from headlab.files import write_atomic, write_json

        path = Path(directory)
        write_json(path / "config.json", self.config.to_dict(), indent=2)
        write_atomic(path / "model.safetensors", lambda file: save_model(self, str(file)))
        return path

    @classmethod
    def load(cls, directory: str | Path, device: str | torch.device = "cpu") -> Transformer:
        """The model saved by :meth:`save` in ``directory``, in eval mode."""
        from safetensors.torch import load_file

        path = Path(directory)
        for name in ("config.json", "model.safetensors"):
            if not (path / name).is_file():
                raise FileNotFoundError(
                    f"{path / name} is missing; expected a Transformer.save dir"
                )
        config = ModelConfig.from_dict(json.loads((path / "config.json").read_text()))
        with torch.device(device), SkipInit():  # every weight is replaced by the file's
            model = cls(config)
        # the file's tensors become the weights, no copy: they are mapped from the file
        # (privately, so writing to a weight never changes the file) and read in on first use
        state = load_file(str(path / "model.safetensors"), device=str(device))
        if config.tie_embeddings:  # saved once, under either name
            shared = state.pop("unembed.weight", None)
            state.setdefault("embed.weight", shared)  # type: ignore[arg-type]
        missing, unexpected = model.load_state_dict(state, strict=False, assign=True)
        if config.tie_embeddings:
            model.unembed.weight = model.embed.weight  # assign replaced the shared Parameter
            missing = [k for k in missing if k != "unembed.weight"]
        if missing or unexpected:
            raise ValueError(
                f"{path / 'model.safetensors'} does not fit its config.json: missing "
                f"{sorted(missing) or 'nothing'}, unexpected {sorted(unexpected) or 'nothing'}"
            )
        return model.eval()

    def num_params(self) -> int:
        """Number of distinct parameters (tied embeddings counted once)."""
        return sum(p.numel() for p in self.parameters())


def generation_problems(
    n: int, config: ModelConfig, max_new_tokens: int, temperature: float, top_k: int | None
) -> list[str]:
    """Why a prompt of ``n`` tokens cannot be continued with these settings (empty: it can)."""
    out = []
    if not config.causal:
        out.append("generation needs a causal (decoder) model; this one attends both ways")
    if max_new_tokens < 1:
        out.append(f"the number of new tokens must be at least 1, got {max_new_tokens}")
    elif n + max_new_tokens > config.max_len:
        room = config.max_len - n
        out.append(
            f"the prompt is {n} tokens and the model's context is {config.max_len}, so "
            + (f"at most {room} new tokens fit, not {max_new_tokens}" if room > 0
               else "there is no room for new tokens; shorten the prompt")
        )  # fmt: skip
    if temperature < 0:
        out.append(f"temperature must be 0 (greedy) or more, got {temperature}")
    if top_k is not None and top_k < 1:
        out.append(f"top_k must be at least 1 (or None for no limit), got {top_k}")
    return out


def pick_tokens(
    logits: Tensor, temperature: float, top_k: int | None, generator: torch.Generator | None
) -> Tensor:
    """logits (B, V) → next token ids (B,): argmax when temperature is 0, else a sample from
    softmax(logits / temperature) over the top_k most likely tokens (all when None)."""
    if temperature == 0:
        return logits.argmax(dim=-1)
    scaled = logits.float() / temperature  # (B, V)
    if top_k is not None and top_k < scaled.shape[-1]:
        kth = scaled.topk(top_k, dim=-1).values[:, -1:]  # (B, 1)
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    probs = torch.softmax(scaled, dim=-1)
    return torch.multinomial(probs, 1, generator=generator)[:, 0]
