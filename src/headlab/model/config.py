"""The configuration of a :class:`~headlab.model.Transformer`: every choice that fixes its shape
and arithmetic, checked when made, each problem named with what would be valid.
"""

from __future__ import annotations

import json
import types
from dataclasses import MISSING, asdict, dataclass, fields
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints

from headlab.attention import check_config

Positional = Literal["learned", "rotary", "none"]
NormPlace = Literal["pre", "post", "sandwich", "none"]
NormKind = Literal["layernorm", "rmsnorm"]
Activation = Literal["gelu", "gelu_tanh", "relu", "silu"]
MlpKind = Literal["standard", "gated"]

_CHOICES = {
    "positional": ("learned", "rotary", "none"),
    "norm": ("pre", "post", "sandwich", "none"),
    "norm_kind": ("layernorm", "rmsnorm"),
    "activation": ("gelu", "gelu_tanh", "relu", "silu"),
    "mlp": ("standard", "gated"),
}


@dataclass(frozen=True)
class ModelConfig:
    """Everything that fixes a Transformer's shape and arithmetic (weights aside).

    The fields after ``init_std`` are the variants of the Hugging Face families headlab
    converts (:mod:`headlab.convert`); their defaults leave the GPT-style model unchanged.
    """

    vocab_size: int  # V, number of token ids
    d_model: int  # width of the residual stream
    n_layers: int  # number of blocks
    n_heads: int  # query heads per layer
    n_kv_heads: int | None = None  # key/value heads: None = n_heads (MHA), 1 = MQA, else GQA
    d_ff: int | None = None  # MLP hidden width; None = 4 · d_model
    max_len: int = 1024  # longest sequence the model accepts (learned positions need a table)
    positional: Positional = "learned"  # absolute learned table, rotary (RoPE) or none
    rope_theta: float = 10000.0  # RoPE base; used only when positional == "rotary"
    norm: NormPlace = "pre"  # pre-LN, post-LN (BERT), sandwich (pre and post, Gemma) or none
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
    head_dim: int | None = None  # d_k; None = d_model // n_heads (Gemma 3 270M: 256 at 640 / 4)
    rotary_dim: int | None = None  # leading dims of a head RoPE turns; None = all (NeoX: d_k / 4)
    rope_theta_local: float | None = None  # RoPE base on local layers; None = rope_theta (Gemma 3)
    sliding_window: int | None = None  # keys a local layer's query sees, itself included (Mistral)
    local_layers: tuple[int, ...] = ()  # the layers with the sliding window; others see all keys
    attn_scale: float | None = None  # factor on q·k; None = 1/√d_k (Gemma: query_pre_attn_scalar)
    attn_softcap: float | None = None  # scores → c·tanh(scores / c) before the softmax (Gemma 2)
    logit_softcap: float | None = None  # logits → c·tanh(logits / c) (Gemma 2)
    qk_norm: bool = False  # RMSNorm over each head's queries and keys, before RoPE (Gemma 3)
    embed_scale: float = 1.0  # token embeddings times this (Gemma: √d_model)
    parallel_residual: bool = False  # x + attn(norm(x)) + mlp(norm'(x)) (GPT-NeoX, Pythia)
    attn_out_bias: bool | None = None  # W_O's bias; None = as ``bias`` (Qwen2: Q/K/V only)

    def __post_init__(self) -> None:
        # read back from JSON the layers are a list; the config stays hashable and equal
        object.__setattr__(self, "local_layers", tuple(self.local_layers))
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
        out += check_config(self.d_model, self.n_heads, self.n_kv_heads, self.head_dim)
        if self.positional == "rotary" and self.n_heads > 0 and self.rotary_width % 2:
            out.append(f"rotary positions need an even rotated width, got {self.rotary_width}")
        if not 0.0 <= self.dropout < 1.0:
            out.append(f"dropout must be in [0, 1), got {self.dropout}")
        return out + self._variant_problems()

    def _variant_problems(self) -> list[str]:
        out = []
        if self.rotary_dim is not None and self.n_heads > 0 and not 0 < self.rotary_dim <= self.d_k:
            out.append(f"rotary_dim must be in 1..d_k={self.d_k} or None, got {self.rotary_dim}")
        if self.sliding_window is not None and self.sliding_window < 1:
            out.append(
                f"sliding_window must be a positive integer or None, got {self.sliding_window}"
            )
        if self.local_layers and (self.sliding_window is None or not self.causal):
            out.append("local_layers need a sliding_window and a causal model")
        bad = [l for l in self.local_layers if not 0 <= l < self.n_layers]
        if bad:
            out.append(f"local_layers must be in 0..{self.n_layers - 1}, got {bad}")
        for name in ("attn_softcap", "logit_softcap", "attn_scale"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                out.append(f"{name} must be positive or None, got {value}")
        if self.parallel_residual and (self.norm != "pre" or self.attn_only):
            out.append('parallel_residual needs norm="pre" and an MLP (attn_only=False)')
        return out

    @property
    def d_k(self) -> int:
        """Each head's width: ``head_dim``, else d_model // n_heads."""
        return self.head_dim if self.head_dim is not None else self.d_model // self.n_heads

    @property
    def rotary_width(self) -> int:
        """How many leading dims of each query and key head RoPE turns."""
        return self.rotary_dim if self.rotary_dim is not None else self.d_k

    @property
    def hidden(self) -> int:
        """The MLP hidden width actually used (d_ff, or 4 · d_model when d_ff is None)."""
        return self.d_ff if self.d_ff is not None else 4 * self.d_model

    def to_dict(self) -> dict:
        """Every field, less the family variants left at their defaults: the config of a model
        that uses none of them reads (and resumes from a checkpoint) as before they existed."""
        data = asdict(self)
        for f in fields(self)[_FIRST_VARIANT:]:
            if data[f.name] == f.default:
                del data[f.name]
        return data

    @classmethod
    def from_dict(cls, data: dict) -> ModelConfig:
        """Inverse of :meth:`to_dict`, for a dict read from JSON: unknown keys, a value of the
        wrong type (``"d_model": "x"``) and a required field left out are each a ValueError
        naming the field and what it takes."""
        if not isinstance(data, dict):
            raise ValueError(f"a model config is a JSON object, got {type(data).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown ModelConfig fields {unknown}; known: {sorted(known)}")
        hints = get_type_hints(cls)
        for f in fields(cls):
            takes = _takes(hints[f.name])
            if f.name not in data and f.default is MISSING:
                raise ValueError(f"the model config has no {f.name}; it takes {takes}")
            if f.name in data and not _fits(data[f.name], hints[f.name]):
                raise ValueError(f"{f.name} must be {takes}, got {data[f.name]!r}")
        return cls(**data)


_FIRST_VARIANT = [f.name for f in fields(ModelConfig)].index("head_dim")


def _fits(value: Any, hint: Any) -> bool:
    """Whether a value read from JSON has a field's type: an integer is no bool, a number may
    be an integer, a choice (Literal) is a string (which of them :meth:`ModelConfig.problems`
    says), a tuple of layers is a list of integers."""
    if get_origin(hint) in (Union, types.UnionType):
        return any(_fits(value, arg) for arg in get_args(hint))
    if hint is type(None):
        return value is None
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if get_origin(hint) is Literal:
        return isinstance(value, str)
    if get_origin(hint) is tuple:
        return isinstance(value, list | tuple) and all(_fits(v, int) for v in value)
    return True


def _takes(hint: Any) -> str:
    """What a field of type ``hint`` takes, in words: "an integer", "a number or null" …"""
    if get_origin(hint) in (Union, types.UnionType):
        return " or ".join(_takes(arg) for arg in get_args(hint))
    if get_origin(hint) is Literal:
        return "one of " + ", ".join(map(str, get_args(hint)))
    words = {type(None): "null", bool: "true or false", int: "an integer", float: "a number"}
    return words.get(hint, "a list of integers")


def config_json(path: str | Path) -> dict[str, Any]:
    """The JSON object in a model's ``config.json`` (headlab's or Hugging Face's); a ValueError
    naming the file and what is wrong: unreadable, not UTF-8, not JSON, not an object."""
    p = Path(path)
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except OSError as exc:  # a folder named config.json, no permission to read it
        raise ValueError(f"{p} cannot be read ({exc.strerror or exc})") from None
    except UnicodeDecodeError:
        raise ValueError(f"{p} is not UTF-8 text; a model config is JSON") from None
    except json.JSONDecodeError as exc:
        where = f"{exc.msg} at line {exc.lineno}, column {exc.colno}"
        raise ValueError(f"{p} is not valid JSON ({where}); a model config is JSON") from None
    if not isinstance(data, dict):
        raise ValueError(f"{p} holds a JSON {type(data).__name__}, not an object of fields")
    return data


def read_config(path: str | Path) -> ModelConfig:
    """The :class:`ModelConfig` in the file ``path`` (:meth:`ModelConfig.to_dict` as JSON); a
    ValueError naming the file and what is wrong with it: not JSON, a field left out, unknown
    or of the wrong type, a value out of range."""
    data = config_json(path)
    try:
        return ModelConfig.from_dict(data)
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None
