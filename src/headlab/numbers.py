"""Integer helpers the attention layer and the shape calculator share; no torch here, so the
calculator's checks answer before torch is imported."""

from __future__ import annotations

import math


def valid_head_counts(d_model: int) -> list[int]:
    """The head counts that split ``d_model`` evenly: its divisors, ascending (each divisor up
    to √d_model paired with its cofactor, so even a huge d_model answers quickly)."""
    small = [h for h in range(1, math.isqrt(max(d_model, 0)) + 1) if d_model % h == 0]
    return sorted(set(small) | {d_model // h for h in small})
