"""The published models' attention configurations, which ``headlab shapes --preset`` and the
page offer. Plain data, no torch: an unknown preset is refused before torch is imported.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from headlab.shapes.figures import ShapeReport


@dataclass(frozen=True)
class Preset:
    """A published model's attention configuration."""

    name: str  # the key in PRESETS, e.g. "gpt2-small"
    title: str  # e.g. "GPT-2 small (124M)"
    d_model: int
    n_heads: int
    n_kv_heads: int | None  # None: MHA
    bias: bool  # biases on the Q, K, V and output projections
    n_layers: int
    context: int  # the context length the model was trained with
    source: str  # where the sizes are published
    d_k: int | None = None  # each head's width; None: d_model // h (Gemma 3 270M: 256)
    window: int | None = None  # keys a local layer's query sees (sliding window); None: all
    local_layers: tuple[int, ...] = ()  # the layers with that window; the others are global

    def report(self, seq_len: int | None = None, batch: int = 1, **kw: Any) -> ShapeReport:
        """:func:`trace_shapes` for this model; ``seq_len`` defaults to its context length."""
        from headlab.shapes.report import trace_shapes

        n = self.context if seq_len is None else seq_len
        kw.setdefault("d_k", self.d_k)
        return trace_shapes(self.d_model, self.n_heads, n, batch, self.n_kv_heads, self.bias, **kw)


# name, title, d_model, h, h_kv (None: MHA), bias, layers, context, source
_PUBLISHED = (
    (
        "transformer-base",
        "Transformer base",
        512,
        8,
        None,
        False,
        6,
        512,
        "Vaswani et al. 2017, Table 3 (base); projections without bias",
    ),
    ("bert-base", "BERT-base", 768, 12, None, True, 12, 512, "Devlin et al. 2019"),
    ("gpt2-small", "GPT-2 small (124M)", 768, 12, None, True, 12, 1024, "Radford et al. 2019"),
    ("gpt2-medium", "GPT-2 medium (355M)", 1024, 16, None, True, 24, 1024, "Radford et al. 2019"),
    ("gpt2-large", "GPT-2 large (774M)", 1280, 20, None, True, 36, 1024, "Radford et al. 2019"),
    ("gpt2-xl", "GPT-2 XL (1.5B)", 1600, 25, None, True, 48, 1024, "Radford et al. 2019"),
    ("llama-2-7b", "Llama-2-7B", 4096, 32, None, False, 32, 4096, "Touvron et al. 2023"),
    ("llama-3-8b", "Llama-3-8B (GQA)", 4096, 32, 8, False, 32, 8192, "Meta 2024, Llama 3"),
    ("mistral-7b", "Mistral-7B (GQA)", 4096, 32, 8, False, 32, 8192, "Jiang et al. 2023, Table 1"),
    ("gpt3-175b", "GPT-3 175B", 12288, 96, None, True, 96, 2048, "Brown et al. 2020, Table 2.1"),
    (
        "smollm2-135m",
        "SmolLM2-135M (GQA)",
        576,
        9,
        3,
        False,
        30,
        8192,
        "Allal et al. 2025; HuggingFaceTB/SmolLM2-135M config.json",
    ),
)


# Gemma 3 270M (Gemma Team 2025; google/gemma-3-270m config.json): one K/V head (MQA), heads
# 256 wide at d_model 640, a 512-key window on five layers in six, global attention on the sixth
GEMMA3_270M = Preset(
    "gemma-3-270m",
    "Gemma 3 270M (MQA, d_k 256)",
    640,
    4,
    1,
    False,
    18,
    32768,
    "Gemma Team 2025; google/gemma-3-270m config.json",
    d_k=256,
    window=512,
    local_layers=tuple(layer for layer in range(18) if layer % 6 != 5),
)


PRESETS: dict[str, Preset] = {
    **{row[0]: Preset(*row) for row in _PUBLISHED},
    GEMMA3_270M.name: GEMMA3_270M,
}
