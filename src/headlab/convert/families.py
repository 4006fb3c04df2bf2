"""Per-family config builders: the headlab :class:`~headlab.model.ModelConfig` of a Hugging Face
GPT-2, BERT or Llama config, refusing a variant whose arithmetic headlab does not reproduce.
"""

from __future__ import annotations

from typing import Any

from headlab.model import ModelConfig

SUPPORTED = ("bert", "gpt2", "llama")

_GPT2_ACT = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu"}
_GPT2_ACT |= {"relu": "relu", "silu": "silu"}


def hf_config(c: Any) -> ModelConfig:
    """The headlab config of a Hugging Face BERT, GPT-2 or Llama config."""
    configs = {"bert": bert_config, "gpt2": gpt2_config, "llama": llama_config}
    kind = getattr(c, "model_type", None)
    if kind not in configs:
        raise ValueError(
            f"cannot convert a {kind!r} model; supported Hugging Face families: "
            f"{', '.join(SUPPORTED)}"
        )
    return configs[kind](c)


def gpt2_config(c: Any) -> ModelConfig:
    """The headlab config of a ``GPT2Config``."""
    if c.activation_function not in _GPT2_ACT:
        raise ValueError(f"GPT-2 activation {c.activation_function!r} is not supported")
    if getattr(c, "scale_attn_by_inverse_layer_idx", False) or not c.scale_attn_weights:
        raise ValueError("only GPT-2's standard 1/sqrt(d_k) attention scaling is supported")
    return ModelConfig(
        vocab_size=c.vocab_size,
        d_model=c.n_embd,
        n_layers=c.n_layer,
        n_heads=c.n_head,
        d_ff=c.n_inner,
        max_len=c.n_positions,
        positional="learned",
        norm="pre",
        norm_eps=c.layer_norm_epsilon,
        causal=True,
        activation=_GPT2_ACT[c.activation_function],  # type: ignore[arg-type]
        tie_embeddings=True,
    )


def bert_config(c: Any) -> ModelConfig:
    """The headlab config of a ``BertConfig`` (absolute positions only)."""
    position_type = getattr(c, "position_embedding_type", None) or "absolute"
    if position_type != "absolute":
        raise ValueError(
            f"BERT position_embedding_type {position_type!r}: only 'absolute' converts"
        )
    if c.hidden_act not in ("gelu", "relu", "gelu_new"):
        raise ValueError(f"BERT activation {c.hidden_act!r} is not supported")
    return ModelConfig(
        vocab_size=c.vocab_size,
        d_model=c.hidden_size,
        n_layers=c.num_hidden_layers,
        n_heads=c.num_attention_heads,
        d_ff=c.intermediate_size,
        max_len=c.max_position_embeddings,
        positional="learned",
        norm="post",
        norm_eps=c.layer_norm_eps,
        embed_norm=True,
        causal=False,
        activation={"gelu_new": "gelu_tanh"}.get(c.hidden_act, c.hidden_act),
        tie_embeddings=True,
    )


def llama_config(c: Any) -> ModelConfig:
    """The headlab config of a ``LlamaConfig`` (default RoPE, head_dim = hidden / heads)."""
    rope = getattr(c, "rope_parameters", None) or {}
    rope_type = rope.get("rope_type", "default")
    theta = rope.get("rope_theta", getattr(c, "rope_theta", 10000.0))
    if rope_type != "default":
        raise ValueError(f"Llama rope_type {rope_type!r}: only the default RoPE converts")
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    if head_dim * c.num_attention_heads != c.hidden_size:
        raise ValueError(
            f"Llama head_dim={head_dim} × {c.num_attention_heads} heads != hidden_size="
            f"{c.hidden_size}; headlab needs d_k = d_model / h"
        )
    if c.hidden_act != "silu":
        raise ValueError(f"Llama activation {c.hidden_act!r} is not supported (only silu)")
    if c.attention_bias != getattr(c, "mlp_bias", False):
        raise ValueError("Llama attention_bias and mlp_bias must agree to convert")
    return ModelConfig(
        vocab_size=c.vocab_size,
        d_model=c.hidden_size,
        n_layers=c.num_hidden_layers,
        n_heads=c.num_attention_heads,
        n_kv_heads=c.num_key_value_heads,
        d_ff=c.intermediate_size,
        max_len=c.max_position_embeddings,
        positional="rotary",
        rope_theta=float(theta),
        norm="pre",
        norm_kind="rmsnorm",
        norm_eps=c.rms_norm_eps,
        causal=True,
        activation="silu",
        mlp="gated",
        bias=c.attention_bias,
        mlp_bias=c.attention_bias,
        tie_embeddings=bool(c.tie_word_embeddings),
    )
