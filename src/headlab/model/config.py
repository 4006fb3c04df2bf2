"""The configuration of a :class:`~headlab.model.Transformer`: every choice that fixes its shape
and arithmetic, checked when made, each problem named with what would be valid.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Literal

from headlab.attention import check_config

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
