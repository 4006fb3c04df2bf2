"""Weights in: each family's Hugging Face state dict as (headlab name, tensor) pairs, and the pairs
copied into a :class:`~headlab.model.Transformer` (:func:`from_hf`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch import Tensor

from headlab.convert.families import hf_config
from headlab.model import Transformer


def from_hf(hf_model: Any) -> Transformer:
    """A headlab Transformer with the weights of a Hugging Face BERT, GPT-2 or Llama model.

    Accepts the bare models (``BertModel``, ``GPT2Model``, ``LlamaModel``) and their heads
    (``GPT2LMHeadModel``, ``LlamaForCausalLM``, ``BertFor…`` — whose task heads are dropped).
    Returns the converted model in eval mode, float32 unless the source is float64.
    """
    config = hf_config(hf_model.config)
    state = {k: v.detach() for k, v in hf_model.state_dict().items()}
    model = Transformer(config)
    fill(model, converted_tensors(hf_model.config, state))
    dtype = torch.float64 if next(iter(state.values())).dtype == torch.float64 else torch.float32
    return model.to(dtype).eval()


def converted_tensors(c: Any, state: Mapping[str, Tensor]) -> Iterator[tuple[str, Tensor]]:
    """Every weight of the headlab model of HF config ``c`` as (headlab name, tensor), from the
    HF state ``state`` (names as in its checkpoint; a lazy mapping reads only what is asked).
    Block l's weights come together, in block order: a writer can flush layer by layer."""
    families = {"bert": _bert_tensors, "gpt2": _gpt2_tensors, "llama": _llama_tensors}
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


# --- BERT --------------------------------------------------------------------------------------


def _bert_tensors(c: Any, state: Mapping[str, Tensor]) -> Iterator[tuple[str, Tensor]]:
    s = _strip(state, ("bert.",))
    yield "embed.weight", s["embeddings.word_embeddings.weight"]
    segment0 = s["embeddings.token_type_embeddings.weight"][0]  # (d_model,)
    yield "pos_embed.weight", s["embeddings.position_embeddings.weight"] + segment0
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


# --- Llama -------------------------------------------------------------------------------------


def _llama_tensors(c: Any, state: Mapping[str, Tensor]) -> Iterator[tuple[str, Tensor]]:
    s = _strip(state, ("model.",))
    yield "embed.weight", s["embed_tokens.weight"]
    for l in range(c.num_hidden_layers):
        p, b = f"layers.{l}.", f"blocks.{l}."
        yield from _linear(b + "norm_attn", s, p + "input_layernorm")
        for ours, theirs in (("W_Q", "q"), ("W_K", "k"), ("W_V", "v"), ("W_O", "o")):
            yield from _linear(f"{b}attn.{ours}", s, f"{p}self_attn.{theirs}_proj")
        yield from _linear(b + "norm_mlp", s, p + "post_attention_layernorm")
        for ours, theirs in (("W_gate", "gate"), ("W_in", "up"), ("W_out", "down")):
            yield from _linear(f"{b}mlp.{ours}", s, f"{p}mlp.{theirs}_proj")
    yield from _linear("final_norm", s, "norm")
    if not c.tie_word_embeddings:
        head = "lm_head.weight"
        yield "unembed.weight", state[head] if head in state else s["embed_tokens.weight"]
