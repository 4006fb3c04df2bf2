"""Weights in: Hugging Face models of fifteen families as headlab Transformers.

Each converter reads a ``transformers`` model's config and state dict (no download, no
network) and copies every weight into a :class:`headlab.model.Transformer` whose arithmetic
is the same, so logits, hidden states and every head's attention weights match Hugging Face's
eager attention. What each family needs:

    GPT-2  pre-LN, learned positions, causal. ``Conv1D`` stores weights as (in, out), the
           transpose of ``nn.Linear``; ``c_attn`` packs W_Q, W_K, W_V side by side.
           Activation "gelu_new" is the tanh approximation (Radford et al. 2019).
    OPT    GPT-2's layout with separate W_Q, W_K, W_V and ReLU; its positions start at row 2
           of the table, so the table is read from there (Zhang et al. 2022).
    BERT   post-LN, learned positions, bidirectional, a LayerNorm after the embeddings. The
           token-type embedding of segment 0 is added to every position, so it is folded into
           the position table (headlab runs single-segment inputs). BertModel has no LM head:
           the logits use the tied word embeddings; compare hidden states (Devlin et al. 2019).
    RoBERTa, XLM-RoBERTa   BERT's arithmetic; positions are counted from padding_idx + 1, so
           the position table is read from that row on (Liu et al. 2019; Conneau et al. 2020).
    Llama  pre-RMSNorm, rotary positions (half-split), grouped-query attention, SwiGLU MLP, no
           biases (Touvron et al. 2023; Ainslie et al. 2023).
    Qwen2, Qwen3, Mistral, Phi-3   Llama's arithmetic, with biases on W_Q/W_K/W_V (Qwen2), QK-norm
           and a head width of its own (Qwen3), a sliding window (Mistral; Jiang et al. 2023),
           fused projections and partial rotary (Phi-3).
    OLMo   (OLMo 1) Llama's arithmetic with LayerNorms that have no gain or bias, converted
           as gains of 1 and biases of 0 (Groeneveld et al. 2024).
    Gemma   (Gemma 1) Llama's layout with (1 + w) RMSNorm gains, GeGLU, embeddings × √d_model
           and a head width of its own (Gemma Team 2024).
    Gemma 2, Gemma 3   sandwich (1 + w) RMSNorms, embeddings × √d_model, query pre-scaling,
           soft-capped scores and logits (Gemma 2), QK-norm and local/global layers with their
           own RoPE bases (Gemma 3), sliding windows on the local layers (Gemma Team 2024, 2025).
    GPT-NeoX (Pythia)   LayerNorm, parallel residual, RoPE on a quarter of each head, W_Q/W_K/W_V
           fused per head (Black et al. 2022; Biderman et al. 2023).

:func:`from_hf` picks the converter from ``config.model_type``. Each family is written once, as
a list of (headlab name, tensor) pairs (:func:`converted_tensors`); the same pairs fill a model
in memory (:func:`from_hf`) or, read lazily from the checkpoint's files, a headlab checkpoint on
disk one layer at a time (:func:`convert_checkpoint`), which accelerate then places across GPUs,
CPU and disk for a model larger than memory (:func:`dispatch`).

    families   :func:`hf_config` and one config builder per family (:data:`SUPPORTED` names
               their ``model_type``: bert, roberta, xlm-roberta, gpt2, opt, llama, qwen2, qwen3,
               mistral, olmo, gemma, gemma2, gemma3_text, gpt_neox, phi3)
    weights    each family's tensors under headlab's names; :func:`fill`, :func:`from_hf`
    shards     :class:`CheckpointState` (lazy reads) and :func:`convert_checkpoint`
    placement  :func:`dispatch` and :func:`device_placement` (accelerate)
"""

from headlab.convert.families import SUPPORTED, bert_config, gpt2_config, hf_config, llama_config
from headlab.convert.placement import DEVICE_MAPS, NO_SPLIT, device_placement, dispatch
from headlab.convert.shards import CheckpointState, checkpoint_config, convert_checkpoint
from headlab.convert.weights import converted_tensors, fill, from_hf

__all__ = [
    "DEVICE_MAPS",
    "NO_SPLIT",
    "SUPPORTED",
    "CheckpointState",
    "bert_config",
    "checkpoint_config",
    "convert_checkpoint",
    "converted_tensors",
    "device_placement",
    "dispatch",
    "fill",
    "from_hf",
    "gpt2_config",
    "hf_config",
    "llama_config",
]
