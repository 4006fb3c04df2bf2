"""Weights in: each family's Hugging Face state dict as (headlab name, tensor) pairs, and the pairs
copied into a :class:`~headlab.model.Transformer` (:func:`from_hf`).

What a family's weights need beyond renaming: GPT-2's Conv1D keeps (in, out) and packs W_Q, W_K,
W_V side by side; BERT's segment-0 embedding folds into the position table (RoBERTa's table
read from padding_idx + 1 on, where its positions start); Gemma's RMSNorms
multiply by (1 + w), so their gains are stored as 1 + w; GPT-NeoX fuses W_Q, W_K, W_V per head
([q_0 k_0 v_0 q_1 k_1 v_1 …]); Phi-3 stacks them ([W_Q; W_K; W_V]) and stacks gate over up.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
from torch import Tensor

from headlab.convert.families import hf_config
from headlab.model import SkipInit, Transformer


def from_hf(hf_model: Any) -> Transformer:
    """A headlab Transformer with the weights of a Hugging Face model of a family in
    :data:`headlab.convert.SUPPORTED` (BERT, GPT-2, Llama, Qwen2, Qwen3, Mistral, Gemma,
    Gemma 2, Gemma 3, GPT-NeoX, Phi-3).

    Accepts the bare models (``BertModel``, ``GPT2Model``, ``LlamaModel`` …) and their heads
    (``GPT2LMHeadModel``, ``…ForCausalLM``, ``BertFor…`` — whose task heads are dropped).
    Returns the converted model in eval mode, float32 unless the source is float64.
    """
    config = hf_config(hf_model.config)
    state = {k: v.detach() for k, v in hf_model.state_dict().items()}
    with SkipInit():  # fill() replaces every weight: drawing random ones first only costs time
        model = Transformer(config)
    fill(model, converted_tensors(hf_model.config, state))
    dtype = torch.float64 if next(iter(state.values())).dtype == torch.float64 else torch.float32
    return model.to(dtype).eval()


def converted_tensors(c: Any, state: Mapping[str, Tensor]) -> Iterator[tuple[str, Tensor]]:
    """Every weight of the headlab model of HF config ``c`` as (headlab name, tensor), from the
    HF state ``state`` (names as in its checkpoint; a lazy mapping reads only what is asked).
    Block l's weights come together, in block order: a writer can flush layer by layer."""
    families = {
        "bert": _bert_tensors,
        "roberta": _bert_tensors,
        "xlm-roberta": _bert_tensors,
        "gpt2": _gpt2_tensors,
        "opt": _opt_tensors,
        "llama": _llama_tensors,
        "qwen2": _llama_tensors,
        "qwen3": _llama_tensors,
        "mistral": _llama_tensors,
        "olmo": _llama_tensors,
        "gemma": _gemma_tensors,
        "gemma2": _gemma_tensors,
        "gemma3_text": _gemma_tensors,
        "gpt_neox": _gpt_neox_tensors,
        "phi3": _phi3_tensors,
    }
    hf_config(c)  # refuses an unsupported family or variant with its reason
    return families[c.model_type](c, state)


def fill(model: Transformer, tensors: Iterator[tuple[str, Tensor]]) -> Transformer:
    """Copy (name, tensor) pairs into ``model``'s parameters; every parameter must be given."""
    params = dict(model.named_parameters())  # a tied unembedding is listed once, as embed
    given = set()
    for name, tensor in tensors:
        target = params.get(name)
        if target is None:
            raise ValueError(f"source has a weight {name} that the headlab model has no slot for")
        if target.shape != tensor.shape:
            raise ValueError(
                f"shape mismatch at {name}: headlab {tuple(target.shape)} vs source "
                f"{tuple(tensor.shape)}"
            )
        with torch.no_grad():
            target.copy_(tensor)
        given.add(name)
    missing = sorted(set(params) - given)
    if missing:
        raise ValueError(f"the source has no weights for {', '.join(missing[:5])}")
    return model


class _Stripped(Mapping[str, Tensor]):
    """A view of a state mapping whose keys lose a wrapper prefix (``model.``, ``bert.``)."""

    def __init__(self, state: Mapping[str, Tensor], prefix: str) -> None:
        self.state, self.prefix = state, prefix

    def __getitem__(self, key: str) -> Tensor:
        return self.state[self.prefix + key]

    def __iter__(self) -> Iterator[str]:
        n = len(self.prefix)
        return (k[n:] for k in self.state if k.startswith(self.prefix))

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and self.prefix + key in self.state


def _strip(state: Mapping[str, Tensor], prefixes: tuple[str, ...]) -> Mapping[str, Tensor]:
    """Drop the wrapper prefix (``transformer.``, ``bert.``, ``model.``) if the keys carry one."""
    for prefix in prefixes:
        if any(k.startswith(prefix) for k in state):
            return _Stripped(state, prefix)
    return state


def _linear(
    ours: str, s: Mapping[str, Tensor], theirs: str, weight: Tensor | None = None
) -> Iterator[tuple[str, Tensor]]:
    """``ours.weight`` (and ``ours.bias`` if the source has one) from ``theirs.*``."""
    yield f"{ours}.weight", s[f"{theirs}.weight"] if weight is None else weight
    if f"{theirs}.bias" in s:
        yield f"{ours}.bias", s[f"{theirs}.bias"]


# --- GPT-2 -------------------------------------------------------------------------------------


def _gpt2_tensors(c: Any, state: Mapping[str, Tensor]) -> Iterator[tuple[str, Tensor]]:
    s = _strip(state, ("transformer.",))
    yield "embed.weight", s["wte.weight"]
    yield "pos_embed.weight", s["wpe.weight"]
    for l in range(c.n_layer):
        p, b = f"h.{l}.", f"blocks.{l}."
        yield from _linear(b + "norm_attn", s, p + "ln_1")
        # Conv1D keeps (in, out); c_attn's output columns are [W_Q | W_K | W_V]
        weights = s[p + "attn.c_attn.weight"].t().chunk(3, dim=0)
        biases = s[p + "attn.c_attn.bias"].chunk(3)
        for name, w, bias in zip(("W_Q", "W_K", "W_V"), weights, biases, strict=True):
            yield f"{b}attn.{name}.weight", w
            yield f"{b}attn.{name}.bias", bias
        yield from _linear(b + "attn.W_O", s, p + "attn.c_proj", s[p + "attn.c_proj.weight"].t())
        yield from _linear(b + "norm_mlp", s, p + "ln_2")
        yield from _linear(b + "mlp.W_in", s, p + "mlp.c_fc", s[p + "mlp.c_fc.weight"].t())
        yield from _linear(b + "mlp.W_out", s, p + "mlp.c_proj", s[p + "mlp.c_proj.weight"].t())
    yield from _linear("final_norm", s, "ln_f")


# --- OPT ---------------------------------------------------------------------------------------


def _opt_tensors(c: Any, state: Mapping[str, Tensor]) -> Iterator[tuple[str, Tensor]]:
    s = _strip(state, ("model.decoder.", "decoder."))
    yield "embed.weight", s["embed_tokens.weight"]
    yield "pos_embed.weight", s["embed_positions.weight"][2:]  # OPT's positions start at row 2
    for l in range(c.num_hidden_layers):
        p, b = f"layers.{l}.", f"blocks.{l}."
        yield from _linear(b + "norm_attn", s, p + "self_attn_layer_norm")
        for ours, theirs in (("W_Q", "q"), ("W_K", "k"), ("W_V", "v"), ("W_O", "out")):
            yield from _linear(f"{b}attn.{ours}", s, f"{p}self_attn.{theirs}_proj")
        yield from _linear(b + "norm_mlp", s, p + "final_layer_norm")
        yield from _linear(b + "mlp.W_in", s, p + "fc1")
        yield from _linear(b + "mlp.W_out", s, p + "fc2")
    yield from _linear("final_norm", s, "final_layer_norm")
    yield from _unembed(c, state, s, "embed_tokens.weight")


# --- BERT --------------------------------------------------------------------------------------


def _bert_tensors(c: Any, state: Mapping[str, Tensor]) -> Iterator[tuple[str, Tensor]]:
    s = _strip(state, ("bert.", "roberta."))
    yield "embed.weight", s["embeddings.word_embeddings.weight"]
    segment0 = s["embeddings.token_type_embeddings.weight"][0]  # (d_model,)
    table = s["embeddings.position_embeddings.weight"]
    if c.model_type != "bert":  # RoBERTa numbers positions from padding_idx + 1
        table = table[c.pad_token_id + 1 :]
    yield "pos_embed.weight", table + segment0
    yield from _linear("embed_norm", s, "embeddings.LayerNorm")
    for l in range(c.num_hidden_layers):
        p, b = f"encoder.layer.{l}.", f"blocks.{l}."
        a, o = p + "attention.self.", p + "attention.output."
        for ours, theirs in (("W_Q", "query"), ("W_K", "key"), ("W_V", "value")):
            yield from _linear(f"{b}attn.{ours}", s, a + theirs)
        yield from _linear(b + "attn.W_O", s, o + "dense")
        yield from _linear(b + "norm_attn", s, o + "LayerNorm")
        yield from _linear(b + "mlp.W_in", s, p + "intermediate.dense")
        yield from _linear(b + "mlp.W_out", s, p + "output.dense")
        yield from _linear(b + "norm_mlp", s, p + "output.LayerNorm")


# --- Llama, Qwen2, Qwen3, Mistral, OLMo -----------------------------------------------------------


def _llama_tensors(c: Any, state: Mapping[str, Tensor]) -> Iterator[tuple[str, Tensor]]:
    s = _strip(state, ("model.",))
    norm = _fixed_norm(c.hidden_size) if c.model_type == "olmo" else _stored_norm(s)
    yield "embed.weight", s["embed_tokens.weight"]
    for l in range(c.num_hidden_layers):
        p, b = f"layers.{l}.", f"blocks.{l}."
        yield from norm(b + "norm_attn", p + "input_layernorm")
        for ours, theirs in (("W_Q", "q"), ("W_K", "k"), ("W_V", "v"), ("W_O", "o")):
            yield from _linear(f"{b}attn.{ours}", s, f"{p}self_attn.{theirs}_proj")
        if c.model_type == "qwen3":  # QK-norm with Llama's gains, not Gemma's 1 + w
            yield from _linear(f"{b}attn.q_norm", s, p + "self_attn.q_norm")
            yield from _linear(f"{b}attn.k_norm", s, p + "self_attn.k_norm")
        yield from norm(b + "norm_mlp", p + "post_attention_layernorm")
        for ours, theirs in (("W_gate", "gate"), ("W_in", "up"), ("W_out", "down")):
            yield from _linear(f"{b}mlp.{ours}", s, f"{p}mlp.{theirs}_proj")
    yield from norm("final_norm", "norm")
    yield from _unembed(c, state, s, "embed_tokens.weight")


Norm = Callable[[str, str], Iterator[tuple[str, Tensor]]]  # (ours, theirs) → the norm's tensors


def _stored_norm(s: Mapping[str, Tensor]) -> Norm:
    """A norm whose parameters the checkpoint stores under its own name."""
    return lambda ours, theirs: _linear(ours, s, theirs)


def _fixed_norm(width: int) -> Norm:
    """OLMo 1's LayerNorms, which have no parameters: a gain of 1 and a bias of 0 each."""
    ones, zeros = torch.ones(width), torch.zeros(width)

    def norm(ours: str, _theirs: str) -> Iterator[tuple[str, Tensor]]:
        yield f"{ours}.weight", ones
        yield f"{ours}.bias", zeros

    return norm


def _unembed(
    c: Any,
    state: Mapping[str, Tensor],
    s: Mapping[str, Tensor],
    embed: str,
    heads: tuple[str, ...] = ("lm_head",),
) -> Iterator[tuple[str, Tensor]]:
    """The unembedding of an untied model: its LM head (the first of ``heads`` the state has),
    or the embedding for a bare model."""
    if not c.tie_word_embeddings:
        names = [h + ".weight" for h in heads if h + ".weight" in state]
        yield "unembed.weight", state[names[0]] if names else s[embed]


# --- Gemma, Gemma 2, Gemma 3 ----------------------------------------------------------------------


def _gain(s: Mapping[str, Tensor], name: str) -> Tensor:
    """A Gemma RMSNorm's gain: it multiplies by (1 + w), headlab's by its weight."""
    return 1.0 + s[name + ".weight"]


def _gemma_tensors(c: Any, state: Mapping[str, Tensor]) -> Iterator[tuple[str, Tensor]]:
    s = _strip(state, ("model.",))
    yield "embed.weight", s["embed_tokens.weight"]
    norms: tuple[tuple[str, str], ...] = (
        ("norm_attn", "input_layernorm"),
        ("norm_attn_out", "post_attention_layernorm"),
        ("norm_mlp", "pre_feedforward_layernorm"),
        ("norm_mlp_out", "post_feedforward_layernorm"),
    )
    if c.model_type == "gemma":  # Gemma 1: a norm before each sub-layer only
        norms = (("norm_attn", "input_layernorm"), ("norm_mlp", "post_attention_layernorm"))
    for l in range(c.num_hidden_layers):
        p, b = f"layers.{l}.", f"blocks.{l}."
        for ours, theirs in norms:
            yield f"{b}{ours}.weight", _gain(s, p + theirs)
        for ours, theirs in (("W_Q", "q"), ("W_K", "k"), ("W_V", "v"), ("W_O", "o")):
            yield from _linear(f"{b}attn.{ours}", s, f"{p}self_attn.{theirs}_proj")
        if c.model_type == "gemma3_text":
            yield f"{b}attn.q_norm.weight", _gain(s, p + "self_attn.q_norm")
            yield f"{b}attn.k_norm.weight", _gain(s, p + "self_attn.k_norm")
        for ours, theirs in (("W_gate", "gate"), ("W_in", "up"), ("W_out", "down")):
            yield from _linear(f"{b}mlp.{ours}", s, f"{p}mlp.{theirs}_proj")
    yield "final_norm.weight", _gain(s, "norm")
    yield from _unembed(c, state, s, "embed_tokens.weight")


# --- GPT-NeoX (Pythia) -------------------------------------------------------------------------


def _gpt_neox_tensors(c: Any, state: Mapping[str, Tensor]) -> Iterator[tuple[str, Tensor]]:
    s = _strip(state, ("gpt_neox.",))
    h, d = c.num_attention_heads, c.hidden_size // c.num_attention_heads
    yield "embed.weight", s["embed_in.weight"]
    for l in range(c.num_hidden_layers):
        p, b = f"layers.{l}.", f"blocks.{l}."
        yield from _linear(b + "norm_attn", s, p + "input_layernorm")
        # the fused rows are (head, [q k v], d_k): each head's q, k and v side by side
        qkv = p + "attention.query_key_value"
        weight = s[qkv + ".weight"].view(h, 3, d, -1)  # (h, 3, d_k, d_model)
        bias = s[qkv + ".bias"].view(h, 3, d) if qkv + ".bias" in s else None
        for i, name in enumerate(("W_Q", "W_K", "W_V")):
            yield f"{b}attn.{name}.weight", weight[:, i].reshape(h * d, -1)
            if bias is not None:
                yield f"{b}attn.{name}.bias", bias[:, i].reshape(h * d)
        yield from _linear(b + "attn.W_O", s, p + "attention.dense")
        yield from _linear(b + "norm_mlp", s, p + "post_attention_layernorm")
        yield from _linear(b + "mlp.W_in", s, p + "mlp.dense_h_to_4h")
        yield from _linear(b + "mlp.W_out", s, p + "mlp.dense_4h_to_h")
    yield from _linear("final_norm", s, "final_layer_norm")
    # transformers 5 names the head lm_head; Pythia's files (and older versions) embed_out
    yield from _unembed(c, state, s, "embed_in.weight", heads=("lm_head", "embed_out"))


# --- Phi-3 -------------------------------------------------------------------------------------


def _phi3_tensors(c: Any, state: Mapping[str, Tensor]) -> Iterator[tuple[str, Tensor]]:
    s = _strip(state, ("model.",))
    d = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    widths = [c.num_attention_heads * d, c.num_key_value_heads * d, c.num_key_value_heads * d]
    yield "embed.weight", s["embed_tokens.weight"]
    for l in range(c.num_hidden_layers):
        p, b = f"layers.{l}.", f"blocks.{l}."
        yield from _linear(b + "norm_attn", s, p + "input_layernorm")
        # qkv_proj's rows are [W_Q; W_K; W_V], gate_up_proj's [W_gate; W_up]
        q, k, v = s[p + "self_attn.qkv_proj.weight"].split(widths, dim=0)
        yield from ((f"{b}attn.{n}.weight", w) for n, w in (("W_Q", q), ("W_K", k), ("W_V", v)))
        yield from _linear(b + "attn.W_O", s, p + "self_attn.o_proj")
        yield from _linear(b + "norm_mlp", s, p + "post_attention_layernorm")
        gate, up = s[p + "mlp.gate_up_proj.weight"].chunk(2, dim=0)
        yield f"{b}mlp.W_gate.weight", gate
        yield f"{b}mlp.W_in.weight", up
        yield from _linear(b + "mlp.W_out", s, p + "mlp.down_proj")
    yield from _linear("final_norm", s, "norm")
    yield from _unembed(c, state, s, "embed_tokens.weight")
