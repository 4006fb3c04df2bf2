"""Choosing the next token: the checks a generation request must pass, and greedy or sampled
picks from the logits (used by :meth:`headlab.model.Transformer.generate`).
"""

from __future__ import annotations

import torch
from torch import Tensor

from headlab.model.config import ModelConfig


def generation_problems(
    n: int,
    config: ModelConfig,
    max_new_tokens: int,
    temperature: float,
    top_k: int | None,
    bounded: bool = True,
    kept: int = 0,
) -> list[str]:
    """Why a prompt of ``n`` tokens cannot be continued with these settings (empty: it can).
    ``bounded=False``: a cache with a window (sinks), so the context does not limit the length;
    it keeps ``kept`` = sinks + window positions, which must fit the context."""
    out = []
    if not config.causal:
        out.append("generation needs a causal (decoder) model; this one attends both ways")
    if max_new_tokens < 1:
        out.append(f"the number of new tokens must be at least 1, got {max_new_tokens}")
    elif bounded and n + max_new_tokens > config.max_len:
        room = config.max_len - n
        out.append(
            f"the prompt is {n} tokens and the model's context is {config.max_len}, so "
            + (
                f"at most {room} new tokens fit, not {max_new_tokens}"
                if room > 0
                else "there is no room for new tokens; shorten the prompt"
            )
        )
    if not bounded and not 1 <= kept <= config.max_len:
        out.append(f"sinks + window must be 1..{config.max_len} (the model's context), got {kept}")
    if temperature < 0:
        out.append(f"temperature must be 0 (greedy) or more, got {temperature}")
    if top_k is not None and top_k < 1:
        out.append(f"top_k must be at least 1 (or None for no limit), got {top_k}")
    return out


def pick_tokens(
    logits: Tensor, temperature: float, top_k: int | None, generator: torch.Generator | None
) -> Tensor:
    """logits (B, V) → next token ids (B,): argmax when temperature is 0, else a sample from
    softmax(logits / temperature) over the top_k most likely tokens (all when None).

    A temperature so small that logits / temperature overflows float32 (1e-320, say) picks
    the argmax too: that is the limit of sampling as the temperature goes to 0. Sampling from
    logits that are NaN or +infinity raises a ValueError: no distribution can be drawn."""
    if temperature == 0:
        return logits.argmax(dim=-1)
    if torch.isnan(logits).any() or torch.isposinf(logits).any():
        raise ValueError("the model's logits are not finite (NaN or infinity): cannot sample")
    scaled = logits.float() / temperature  # (B, V)
    if (torch.isfinite(logits) & ~torch.isfinite(scaled)).any():
        return logits.argmax(dim=-1)  # the temperature underflows: what sampling tends to
    if top_k is not None and top_k < scaled.shape[-1]:
        kth = scaled.topk(top_k, dim=-1).values[:, -1:]  # (B, 1)
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    probs = torch.softmax(scaled, dim=-1)
    if not torch.isfinite(probs).all():  # every logit −infinity
        raise ValueError("the model's logits are all -infinity: no token can be picked")
    return torch.multinomial(probs, 1, generator=generator)[:, 0]
