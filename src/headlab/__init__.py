"""headlab: multi-head attention you can run, measure and see."""

from headlab.attention import (
    KVCache,
    MultiHeadAttention,
    attention,
    causal_allowed,
    merge_heads,
    repeat_kv,
    split_heads,
)
from headlab.trace import Trace

__version__ = "0.1.0"

__all__ = [
    "KVCache",
    "MultiHeadAttention",
    "Trace",
    "__version__",
    "attention",
    "causal_allowed",
    "merge_heads",
    "repeat_kv",
    "split_heads",
]
