"""Per-family config builders: the headlab :class:`~headlab.model.ModelConfig` of a Hugging Face
config, one builder per family, refusing a variant whose arithmetic headlab does not reproduce.

    bert         post-LN encoder, learned positions
    roberta      (and xlm-roberta) BERT's arithmetic, positions counted from padding_idx + 1
    gpt2         pre-LN decoder, learned positions
    opt          GPT-2's layout with separate W_Q, W_K, W_V and ReLU; positions from row 2 of
                 the table on
    llama        pre-RMSNorm, RoPE, grouped-query attention, SwiGLU
    qwen2        Llama with biases on W_Q, W_K, W_V (none on W_O); optional sliding window on
                 the layers from ``max_window_layers`` on
    mistral      Llama with a sliding window on every layer
    olmo         (OLMo 1) Llama with LayerNorms that have no gain or bias; clip_qkv refused
    qwen3        Llama with QK-norm (an RMSNorm over each head's queries and keys, before RoPE),
                 a head width of its own, biases on all four attention projections when
                 ``attention_bias`` (none in the MLP); the sliding window as Qwen2's
    gemma        (Gemma 1) pre-norm (1 + w) RMSNorms, GeGLU, embeddings × √d_model, d_k chosen
                 apart from d_model / h (256), multi-query attention in the 2B model
    gemma2       queries scaled by query_pre_attn_scalar^−½, scores and logits soft-capped,
                 a sliding window on alternate layers, embeddings × √d_model, (1 + w) RMSNorms
                 before and after each sub-layer, GeGLU, d_k chosen apart from d_model / h
    gemma3_text  Gemma 2's layout with QK-norm, local layers (window, RoPE base 10,000) among
                 global ones (RoPE base 1,000,000), no score soft-capping
    gpt_neox     (Pythia) LayerNorm, parallel residual, RoPE on a leading fraction of each head
    phi3         Llama's arithmetic with W_Q, W_K, W_V fused and the gate and up projections
                 fused; optional partial rotary and sliding window
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from headlab.model import ModelConfig

_GPT2_ACT = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu"}
_GPT2_ACT |= {"relu": "relu", "silu": "silu"}


def hf_config(c: Any) -> ModelConfig:
    """The headlab config of a Hugging Face config of a family in :data:`SUPPORTED`."""
    kind = getattr(c, "model_type", None)
    if kind not in _BUILDERS:
        raise ValueError(
            f"cannot convert a {kind!r} model; supported Hugging Face families: "
            f"{', '.join(SUPPORTED)}"
        )
    return _BUILDERS[kind](c)


def _rope(c: Any, family: str, params: dict | None = None) -> tuple[float, float]:
    """(base θ, rotated fraction of each head) of a config's default RoPE; scaled RoPE
    variants (linear, dynamic, YaRN, longrope, llama3) are refused."""
    rope = params if params is not None else (getattr(c, "rope_parameters", None) or {})
    rope_type = rope.get("rope_type", "default")
    if rope_type != "default":
        raise ValueError(f"{family} rope_type {rope_type!r}: only the default RoPE converts")
    theta = rope.get("rope_theta", getattr(c, "rope_theta", 10000.0))
    return float(theta), float(rope.get("partial_rotary_factor", 1.0))


def _head_dim(c: Any) -> int | None:
    """A config's head width when it is not hidden / heads (else None: headlab's default)."""
    d = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    return None if d * c.num_attention_heads == c.hidden_size else d


def _local_layers(c: Any) -> tuple[int, ...]:
    """The layers a config marks "sliding_attention" (all of them when it has no layer_types
    but a sliding window: Mistral, Phi-3)."""
    if getattr(c, "sliding_window", None) is None:
        return ()
    types = getattr(c, "layer_types", None)
    if types is None:
        return tuple(range(c.num_hidden_layers))
    return tuple(l for l, t in enumerate(types) if t == "sliding_attention")


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


def opt_config(c: Any) -> ModelConfig:
    """The headlab config of an ``OPTConfig``: GPT-2's layout (pre-LN, learned positions, a
    final LayerNorm) with separate W_Q, W_K, W_V; OPT numbers positions from row 2 of its
    table, which the weights' converter drops. Refused: a projection around the embedding
    (``word_embed_proj_dim``, OPT-350m), post-LN blocks, LayerNorms without gains or biases,
    and a removed final LayerNorm, none of which headlab computes."""
    if c.word_embed_proj_dim != c.hidden_size:
        raise ValueError(
            "OPT with word_embed_proj_dim unlike hidden_size (a projection around "
            "the embedding, as in OPT-350m) does not convert"
        )
    if not c.do_layer_norm_before or getattr(c, "_remove_final_layer_norm", False):
        raise ValueError(
            "OPT with post-LN blocks or no final LayerNorm does not convert; only "
            "do_layer_norm_before=True with the final LayerNorm"
        )
    if not (c.enable_bias and c.layer_norm_elementwise_affine):
        raise ValueError("OPT without biases or LayerNorm gains does not convert")
    if c.activation_function not in _GPT2_ACT:
        raise ValueError(f"OPT activation {c.activation_function!r} is not supported")
    return ModelConfig(
        vocab_size=c.vocab_size,
        d_model=c.hidden_size,
        n_layers=c.num_hidden_layers,
        n_heads=c.num_attention_heads,
        d_ff=c.ffn_dim,
        max_len=c.max_position_embeddings,
        positional="learned",
        norm="pre",
        norm_eps=1e-5,
        causal=True,
        activation=_GPT2_ACT[c.activation_function],  # type: ignore[arg-type]
        tie_embeddings=bool(c.tie_word_embeddings),
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


def roberta_config(c: Any) -> ModelConfig:
    """The headlab config of a ``RobertaConfig`` or ``XLMRobertaConfig``: BERT's, with the
    positions that follow padding_idx (RoBERTa numbers a sequence without padding from
    padding_idx + 1; the weights' converter takes the table from there), so the longest input
    is what remains of the table."""
    return replace(bert_config(c), max_len=c.max_position_embeddings - c.pad_token_id - 1)


def llama_config(c: Any, family: str = "Llama", mlp_bias: bool | None = None) -> ModelConfig:
    """The headlab config of a ``LlamaConfig`` (default RoPE). Qwen2, Qwen3, Mistral, OLMo and
    Phi-3 share its arithmetic: their builders start from it under their own ``family`` name.
    ``mlp_bias``: the family's own (Qwen3: none); else the config's, which must agree with
    ``attention_bias``."""
    theta, fraction = _rope(c, family)
    if c.hidden_act != "silu":
        raise ValueError(f"{family} activation {c.hidden_act!r} is not supported (only silu)")
    bias = bool(getattr(c, "attention_bias", False))
    if mlp_bias is None and bias != getattr(c, "mlp_bias", False):
        raise ValueError(f"{family} attention_bias and mlp_bias must agree to convert")
    head_dim = _head_dim(c)
    d_k = head_dim or c.hidden_size // c.num_attention_heads
    return ModelConfig(
        vocab_size=c.vocab_size,
        d_model=c.hidden_size,
        n_layers=c.num_hidden_layers,
        n_heads=c.num_attention_heads,
        n_kv_heads=c.num_key_value_heads,
        head_dim=head_dim,
        d_ff=c.intermediate_size,
        max_len=c.max_position_embeddings,
        positional="rotary",
        rope_theta=theta,
        rotary_dim=None if fraction == 1.0 else int(d_k * fraction),
        norm="pre",
        norm_kind="rmsnorm",
        causal=True,
        norm_eps=getattr(c, "rms_norm_eps", 1e-5),  # OLMo has none (its builder sets its own)
        activation="silu",
        mlp="gated",
        bias=bias,
        mlp_bias=bias if mlp_bias is None else mlp_bias,
        tie_embeddings=bool(c.tie_word_embeddings),
    )


def qwen2_config(c: Any) -> ModelConfig:
    """The headlab config of a ``Qwen2Config``: biases on W_Q, W_K, W_V only; the sliding
    window (when ``use_sliding_window``) on the layers its layer_types mark."""
    local = _local_layers(c)
    return replace(
        llama_config(c, "Qwen2"),
        bias=True,
        attn_out_bias=False,
        sliding_window=c.sliding_window if local else None,
        local_layers=local,
    )


def qwen3_config(c: Any) -> ModelConfig:
    """The headlab config of a ``Qwen3Config``: Llama's with QK-norm (Llama-style RMSNorm gains,
    ``rms_norm_eps``), W_Q, W_K, W_V and W_O biased together when ``attention_bias``, no MLP
    bias, and the sliding window (when ``use_sliding_window``) on the layers its layer_types
    mark."""
    local = _local_layers(c) if getattr(c, "use_sliding_window", False) else ()
    return replace(
        llama_config(c, "Qwen3", mlp_bias=False),
        qk_norm=True,
        sliding_window=c.sliding_window if local else None,
        local_layers=local,
    )


def olmo_config(c: Any) -> ModelConfig:
    """The headlab config of an ``OlmoConfig`` (OLMo 1): Llama's arithmetic with LayerNorms
    (eps 1e-5) that have no gain or bias, which the weights' converter gives as ones and
    zeros; all four attention projections biased together with ``attention_bias``. Clamping
    the projections (``clip_qkv``) is refused: headlab does not compute it."""
    if getattr(c, "clip_qkv", None) is not None:
        raise ValueError(
            f"OLMo with clip_qkv={c.clip_qkv} (queries, keys and values clamped) "
            "does not convert; only clip_qkv=None"
        )
    base = llama_config(c, "OLMo", mlp_bias=False)
    return replace(base, norm_kind="layernorm", norm_eps=1e-5)


def mistral_config(c: Any) -> ModelConfig:
    """The headlab config of a ``MistralConfig``: a sliding window on every layer."""
    local = _local_layers(c)
    window = c.sliding_window if local else None
    return replace(llama_config(c, "Mistral"), sliding_window=window, local_layers=local)


def phi3_config(c: Any) -> ModelConfig:
    """The headlab config of a ``Phi3Config`` (the fused projections are split by the weights'
    converter; partial rotary and the sliding window come as in Llama and Mistral)."""
    local = _local_layers(c)
    window = c.sliding_window if local else None
    return replace(llama_config(c, "Phi-3"), sliding_window=window, local_layers=local)


def gemma_config(c: Any) -> ModelConfig:
    """The headlab config of a ``GemmaConfig`` (Gemma 1): Llama's layout with (1 + w) RMSNorm
    gains (the weights' converter adds the 1), GeGLU, embeddings × √d_model and a head width of
    its own; 1/√d_k scaling, no window, no soft-capping."""
    theta, _ = _rope(c, "Gemma")
    act = _gelu(c, "Gemma")
    return ModelConfig(
        vocab_size=c.vocab_size,
        d_model=c.hidden_size,
        n_layers=c.num_hidden_layers,
        n_heads=c.num_attention_heads,
        n_kv_heads=c.num_key_value_heads,
        head_dim=_head_dim(c),
        d_ff=c.intermediate_size,
        max_len=c.max_position_embeddings,
        positional="rotary",
        rope_theta=theta,
        norm="pre",
        norm_kind="rmsnorm",
        norm_eps=c.rms_norm_eps,
        causal=True,
        activation=act,
        mlp="gated",
        bias=c.attention_bias,
        mlp_bias=False,
        tie_embeddings=bool(c.tie_word_embeddings),
        embed_scale=float(c.hidden_size) ** 0.5,
    )


def _gelu(c: Any, family: str) -> Any:
    """A Gemma config's GeGLU activation as headlab names it (its tanh form, or the exact one)."""
    if getattr(c, "use_bidirectional_attention", False):
        raise ValueError(f"{family} with use_bidirectional_attention: only causal converts")
    act = getattr(c, "hidden_activation", None) or c.hidden_act
    if act not in ("gelu_pytorch_tanh", "gelu_new", "gelu"):
        raise ValueError(f"{family} activation {act!r} is not supported")
    return "gelu" if act == "gelu" else "gelu_tanh"


def gemma2_config(c: Any) -> ModelConfig:
    """The headlab config of a ``Gemma2Config``."""
    return _gemma_config(c, "Gemma 2", _rope(c, "Gemma 2")[0])


def _gemma_config(c: Any, family: str, theta: float) -> ModelConfig:
    """What Gemma 2 and 3 share: sandwich (1 + w) RMSNorms, GeGLU, embeddings × √d_model,
    queries scaled by query_pre_attn_scalar^−½, soft-capping where the config asks for it."""
    act = _gelu(c, family)
    local = _local_layers(c)
    return ModelConfig(
        vocab_size=c.vocab_size,
        d_model=c.hidden_size,
        n_layers=c.num_hidden_layers,
        n_heads=c.num_attention_heads,
        n_kv_heads=c.num_key_value_heads,
        head_dim=_head_dim(c),
        d_ff=c.intermediate_size,
        max_len=c.max_position_embeddings,
        positional="rotary",
        rope_theta=theta,
        norm="sandwich",
        norm_kind="rmsnorm",
        norm_eps=c.rms_norm_eps,
        causal=True,
        activation=act,
        mlp="gated",
        bias=c.attention_bias,
        mlp_bias=False,
        tie_embeddings=bool(c.tie_word_embeddings),
        sliding_window=c.sliding_window if local else None,
        local_layers=local,
        attn_scale=float(c.query_pre_attn_scalar) ** -0.5,
        attn_softcap=c.attn_logit_softcapping,
        logit_softcap=c.final_logit_softcapping,
        embed_scale=float(c.hidden_size) ** 0.5,
    )


def gemma3_config(c: Any) -> ModelConfig:
    """The headlab config of a ``Gemma3TextConfig``: Gemma 2's plus QK-norm and a RoPE base per
    layer type. transformers' Gemma 3 attention caps no scores (QK-norm bounds them instead),
    whatever attn_logit_softcapping says; headlab computes what it computes."""
    rope = c.rope_parameters
    theta, _ = _rope(c, "Gemma 3", rope["full_attention"])
    local_theta, _ = _rope(c, "Gemma 3", rope.get("sliding_attention", rope["full_attention"]))
    base = _gemma_config(c, "Gemma 3", theta)
    local = local_theta if base.local_layers else None
    return replace(base, qk_norm=True, attn_softcap=None, rope_theta_local=local)


def gpt_neox_config(c: Any) -> ModelConfig:
    """The headlab config of a ``GPTNeoXConfig`` (Pythia): RoPE on the first
    ⌊d_k · partial_rotary_factor⌋ dims of each head, the parallel residual when set."""
    theta, fraction = _rope(c, "GPT-NeoX")
    if c.hidden_act not in _GPT2_ACT:
        raise ValueError(f"GPT-NeoX activation {c.hidden_act!r} is not supported")
    d_k = c.hidden_size // c.num_attention_heads
    return ModelConfig(
        vocab_size=c.vocab_size,
        d_model=c.hidden_size,
        n_layers=c.num_hidden_layers,
        n_heads=c.num_attention_heads,
        d_ff=c.intermediate_size,
        max_len=c.max_position_embeddings,
        positional="rotary",
        rope_theta=theta,
        rotary_dim=None if fraction == 1.0 else int(d_k * fraction),
        norm="pre",
        norm_eps=c.layer_norm_eps,
        causal=True,
        activation=_GPT2_ACT[c.hidden_act],  # type: ignore[arg-type]
        bias=c.attention_bias,
        mlp_bias=True,
        tie_embeddings=bool(c.tie_word_embeddings),
        parallel_residual=c.use_parallel_residual,
    )


_BUILDERS = {
    "bert": bert_config,
    "roberta": roberta_config,
    "xlm-roberta": roberta_config,
    "gpt2": gpt2_config,
    "opt": opt_config,
    "llama": llama_config,
    "qwen2": qwen2_config,
    "qwen3": qwen3_config,
    "mistral": mistral_config,
    "olmo": olmo_config,
    "gemma": gemma_config,
    "gemma2": gemma2_config,
    "gemma3_text": gemma3_config,
    "gpt_neox": gpt_neox_config,
    "phi3": phi3_config,
}
SUPPORTED = tuple(_BUILDERS)  # the model_type of every family headlab converts
