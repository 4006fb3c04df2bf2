"""The published models' attention configurations, which ``headlab shapes --preset`` and the
page offer. Plain data, no torch: an unknown preset is refused before torch is imported.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from headlab.shapes.report import ShapeReport


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

    def report(self, seq_len: int | None = None, batch: int = 1, **kw: Any) -> ShapeReport:
        """:func:`trace_shapes` for this model; ``seq_len`` defaults to its context length."""
        from headlab.shapes.report import trace_shapes

        n = self.context if seq_len is None else seq_len
        return trace_shapes(self.d_model, self.n_heads, n, batch, self.n_kv_heads, self.bias, **kw)


# name, title, d_model, h, h_kv (None: MHA), bias, layers, context, source
_PUBLISHED = (
    ("transformer-base", "Transformer base", 512, 8, None, False, 6, 512,
     "Vaswani et al. 2017, Table 3 (base); projections without bias"),
    ("bert-base", "BERT-base", 768, 12, None, True, 12, 512, "Devlin et al. 2019"),
    ("gpt2-small", "GPT-2 small (124M)", 768, 12, None, True, 12, 1024, "Radford et al. 2019"),
    ("gpt2-medium", "GPT-2 medium (355M)", 1024, 16, None, True, 24, 1024, "Radford et al. 2019"),
    ("gpt2-large", "GPT-2 large (774M)", 1280, 20, None, True, 36, 1024, "Radford et al. 2019"),
    ("gpt2-xl", "GPT-2 XL (1.5B)", 1600, 25, None, True, 48, 1024, "Radford et al. 2019"),
    ("llama-2-7b", "Llama-2-7B", 4096, 32, None, False, 32, 4096, "Touvron et al. 2023"),
    ("llama-3-8b", "Llama-3-8B (GQA)", 4096, 32, 8, False, 32, 8192, "Meta 2024, Llama 3"),
    ("mistral-7b", "Mistral-7B (GQA)", 4096, 32, 8, False, 32, 8192,
     "Jiang et al. 2023, Table 1"),
    ("gpt3-175b", "GPT-3 175B", 12288, 96, None, True, 96, 2048, "Brown et al. 2020, Table 2.1"),
)  # fmt: skip


PRESETS: dict[str, Preset] = {row[0]: Preset(*row) for row in _PUBLISHED}
