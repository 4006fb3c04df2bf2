"""Weights in: Hugging Face BERT, GPT-2 and Llama models as headlab Transformers.

Each converter reads a ``transformers`` model's config and state dict (no download, no
network) and copies every weight into a :class:`headlab.model.Transformer` whose arithmetic
is the same, so logits, hidden states and every head's attention weights match Hugging Face's
eager attention. What each family needs:

    GPT-2  pre-LN, learned positions, causal. ``Conv1D`` stores weights as (in, out), the
           transpose of ``nn.Linear``; ``c_attn`` packs W_Q, W_K, W_V side by side.
           Activation "gelu_new" is the tanh approximation (Radford et al. 2019).
    BERT   post-LN, learned positions, bidirectional, a LayerNorm after the embeddings. The
           token-type embedding of segment 0 is added to every position, so it is folded into
           the position table (headlab runs single-segment inputs). BertModel has no LM head:
           the logits use the tied word embeddings; compare hidden states (Devlin et al. 2019).
    Llama  pre-RMSNorm, rotary positions (half-split), grouped-query attention, SwiGLU MLP, no
           biases (Touvron et al. 2023; Ainslie et al. 2023).

:func:`from_hf` picks the converter from ``config.model_type``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from headlab.model import Block, ModelConfig, Transformer

SUPPORTED = ("bert", "gpt2", "llama")

_GPT2_ACT = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu"}
_GPT2_ACT |= {"relu": "relu", "silu": "silu"}


def from_hf(hf_model: Any) -> Transformer:
    """A headlab Transformer with the weights of a Hugging Face BERT, GPT-2 or Llama model.

    Accepts the bare models (``BertModel``, ``GPT2Model``, ``LlamaModel``) and their heads
    (``GPT2LMHeadModel``, ``LlamaForCausalLM``, ``BertFor…`` — whose task heads are dropped).
    Returns the converted model in eval mode, float32 unless the source is float64.
    """
    kind = getattr(hf_model.config, "model_type", None)
    converters = {"bert": _from_bert, "gpt2": _from_gpt2, "llama": _from_llama}
    if kind not in converters:
        raise ValueError(
            f"cannot convert a {kind!r} model; supported Hugging Face families: "
            f"{', '.join(SUPPORTED)}"
        )
    state = {k: v.detach() for k, v in hf_model.state_dict().items()}
    model = converters[kind](hf_model.config, state)
    dtype = torch.float64 if next(iter(state.values())).dtype == torch.float64 else torch.float32
    return model.to(dtype).eval()


def _strip(state: dict[str, Tensor], prefixes: tuple[str, ...]) -> dict[str, Tensor]:
    """Drop the wrapper prefix (``transformer.``, ``bert.``, ``model.``) if the keys carry one."""
    for prefix in prefixes:
        if any(k.startswith(prefix) for k in state):
            return {k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)}
    return state


def _copy(target: nn.Parameter | Tensor | None, source: Tensor) -> None:
    if target is None:
        raise ValueError("source has a weight that the headlab model has no slot for")
    if target.shape != source.shape:
        raise ValueError(
            f"shape mismatch: headlab {tuple(target.shape)} vs HF {tuple(source.shape)}"
        )
    with torch.no_grad():
        target.copy_(source)


def _copy_linear(linear: nn.Linear, weight: Tensor, bias: Tensor | None) -> None:
    _copy(linear.weight, weight)
    if bias is not None:
        _copy(linear.bias, bias)


def _copy_norm(norm: nn.Module, state: dict[str, Tensor], name: str) -> None:
    _copy(norm.weight, state[f"{name}.weight"])  # type: ignore[arg-type]
    if f"{name}.bias" in state:
        _copy(norm.bias, state[f"{name}.bias"])  # type: ignore[arg-type]


def _blocks(model: Transformer) -> list[Block]:
    return [b for b in model.blocks if isinstance(b, Block)]


# --- GPT-2 -------------------------------------------------------------------------------------


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


def _from_gpt2(c: Any, state: dict[str, Tensor]) -> Transformer:
    s = _strip(state, ("transformer.",))
    model = Transformer(gpt2_config(c))
    _copy(model.embed.weight, s["wte.weight"])
    assert model.pos_embed is not None
    _copy(model.pos_embed.weight, s["wpe.weight"])
    for l, block in enumerate(_blocks(model)):
        p = f"h.{l}."
        _copy_norm(block.norm_attn, s, p + "ln_1")
        # Conv1D keeps (in, out); c_attn's output columns are [W_Q | W_K | W_V]
        w_q, w_k, w_v = s[p + "attn.c_attn.weight"].t().chunk(3, dim=0)
        b_q, b_k, b_v = s[p + "attn.c_attn.bias"].chunk(3)
        attn = block.attn
        _copy_linear(attn.W_Q, w_q, b_q)
        _copy_linear(attn.W_K, w_k, b_k)
        _copy_linear(attn.W_V, w_v, b_v)
        _copy_linear(attn.W_O, s[p + "attn.c_proj.weight"].t(), s[p + "attn.c_proj.bias"])
        assert block.norm_mlp is not None and block.mlp is not None
        _copy_norm(block.norm_mlp, s, p + "ln_2")
        _copy_linear(block.mlp.W_in, s[p + "mlp.c_fc.weight"].t(), s[p + "mlp.c_fc.bias"])
        _copy_linear(block.mlp.W_out, s[p + "mlp.c_proj.weight"].t(), s[p + "mlp.c_proj.bias"])
    _copy_norm(model.final_norm, s, "ln_f")
    return model


# --- BERT --------------------------------------------------------------------------------------


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


def _from_bert(c: Any, state: dict[str, Tensor]) -> Transformer:
    s = _strip(state, ("bert.",))
    model = Transformer(bert_config(c))
    _copy(model.embed.weight, s["embeddings.word_embeddings.weight"])
    segment0 = s["embeddings.token_type_embeddings.weight"][0]  # (d_model,)
    assert model.pos_embed is not None and model.embed_norm is not None
    _copy(model.pos_embed.weight, s["embeddings.position_embeddings.weight"] + segment0)
    _copy_norm(model.embed_norm, s, "embeddings.LayerNorm")
    for l, block in enumerate(_blocks(model)):
        p = f"encoder.layer.{l}."
        attn, a = block.attn, p + "attention.self."
        _copy_linear(attn.W_Q, s[a + "query.weight"], s[a + "query.bias"])
        _copy_linear(attn.W_K, s[a + "key.weight"], s[a + "key.bias"])
        _copy_linear(attn.W_V, s[a + "value.weight"], s[a + "value.bias"])
        o = p + "attention.output."
        _copy_linear(attn.W_O, s[o + "dense.weight"], s[o + "dense.bias"])
        _copy_norm(block.norm_attn, s, o + "LayerNorm")
        assert block.norm_mlp is not None and block.mlp is not None
        i, out = p + "intermediate.dense.", p + "output."
        _copy_linear(block.mlp.W_in, s[i + "weight"], s[i + "bias"])
        _copy_linear(block.mlp.W_out, s[out + "dense.weight"], s[out + "dense.bias"])
        _copy_norm(block.norm_mlp, s, out + "LayerNorm")
    return model


# --- Llama -------------------------------------------------------------------------------------


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


def _from_llama(c: Any, state: dict[str, Tensor]) -> Transformer:
    if c.hidden_act != "silu":
        raise ValueError(f"Llama activation {c.hidden_act!r} is not supported (only silu)")
    s = _strip(state, ("model.",))
    model = Transformer(llama_config(c))
    _copy(model.embed.weight, s["embed_tokens.weight"])
    for l, block in enumerate(_blocks(model)):
        p = f"layers.{l}."
        _copy_norm(block.norm_attn, s, p + "input_layernorm")
        for ours, theirs in (("W_Q", "q"), ("W_K", "k"), ("W_V", "v"), ("W_O", "o")):
            name = f"{p}self_attn.{theirs}_proj."
            _copy_linear(getattr(block.attn, ours), s[name + "weight"], s.get(name + "bias"))
        assert block.norm_mlp is not None and block.mlp is not None and block.mlp.W_gate
        _copy_norm(block.norm_mlp, s, p + "post_attention_layernorm")
        for ours, theirs in (("W_gate", "gate"), ("W_in", "up"), ("W_out", "down")):
            name = f"{p}mlp.{theirs}_proj."
            _copy_linear(getattr(block.mlp, ours), s[name + "weight"], s.get(name + "bias"))
    _copy_norm(model.final_norm, s, "norm")
    if not model.config.tie_embeddings:
        _copy(
            model.unembed.weight,
            state["lm_head.weight"] if "lm_head.weight" in state else s["embed_tokens.weight"],
        )
    return model
