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

    config       :class:`ModelConfig` and the choices each field takes
    layers       the norms, :class:`Rotary`, :class:`MLP` and :class:`Block`
    transformer  :class:`Transformer` (cache, ``generate``, save / load) and :class:`SkipInit`
    sampling     the next-token pick and the checks a generation request must pass

Papers: Vaswani et al. 2017; Radford et al. 2019 (GPT-2); Devlin et al. 2019 (BERT);
Touvron et al. 2023 (Llama); Elhage et al. 2021 (attention-only models).
"""

from headlab.model.config import (
    Activation,
    MlpKind,
    ModelConfig,
    NormKind,
    NormPlace,
    Positional,
)
from headlab.model.layers import MLP, Block, RMSNorm, Rotary, make_norm
from headlab.model.sampling import generation_problems, pick_tokens
from headlab.model.transformer import SkipInit, Transformer

__all__ = [
    "MLP",
    "Activation",
    "Block",
    "MlpKind",
    "ModelConfig",
    "NormKind",
    "NormPlace",
    "Positional",
    "RMSNorm",
    "Rotary",
    "SkipInit",
    "Transformer",
    "generation_problems",
    "make_norm",
    "pick_tokens",
]
