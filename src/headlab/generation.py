"""Text in, text out: a prompt continued by a zoo model, for the CLI (and anything above it).

:meth:`headlab.model.Transformer.generate` works on token ids with a KV cache; this wraps it
with a tokenizer: encode the prompt, decode the new tokens, and stop at the model's end token
(SmolLM2-Instruct ends its answers with ``<|im_end|>``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import torch

from headlab.model import Transformer

END_TOKENS = ("<|im_end|>", "<|endoftext|>", "</s>", "<eos>")


@dataclass(frozen=True)
class Generation:
    """A prompt and what the model wrote after it."""

    prompt: str
    prompt_ids: list[int]  # the prompt's tokens, as the model saw them
    new_ids: list[int]  # the generated tokens (the end token included when it came)
    new_tokens: list[str]  # a display label per generated token
    text: str  # the generated tokens decoded
    stopped: bool  # True when the model emitted its end token before the limit

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def end_token(tokenizer: Any) -> int | None:
    """The id of the tokenizer's end-of-text token (the first of :data:`END_TOKENS` it has)."""
    backend = getattr(tokenizer, "backend", None)
    token_to_id = getattr(backend, "token_to_id", None)
    if token_to_id is None:
        return None
    for name in END_TOKENS:
        found = token_to_id(name)
        if found is not None:
            return int(found)
    return None


def generate_text(
    model: Transformer,
    tokenizer: Any,
    prompt: str,
    max_new_tokens: int = 32,
    temperature: float = 0.0,
    top_k: int | None = None,
    seed: int | None = None,
    window: int | None = None,
    sinks: int = 0,
) -> Generation:
    """Continue ``prompt`` by up to ``max_new_tokens`` tokens (greedy unless temperature > 0;
    one too small to divide the logits by, such as 1e-320, is greedy too:
    :func:`headlab.model.sampling.pick_tokens`).

    With ``window`` the KV cache keeps the first ``sinks`` tokens and the last ``window``
    (StreamingLLM, :meth:`Transformer.new_sink_cache`): prompt and continuation may then run
    past the model's context.

    Raises ValueError with a sentence for an empty prompt, a prompt that leaves no room in the
    model's context, or settings out of range (see :meth:`Transformer.generate`).
    """
    ids = tokenizer.encode(prompt) if prompt.strip() else []
    if not ids:
        raise ValueError("the prompt is empty: give at least one word")
    eos = end_token(tokenizer)
    tokens = torch.tensor([ids], device=next(model.parameters()).device)
    out = model.generate(
        tokens, max_new_tokens, temperature, top_k, seed, eos_id=eos, window=window, sinks=sinks
    )
    new = out[0, len(ids) :].tolist()
    stopped = eos is not None and eos in new
    if stopped:
        new = new[: new.index(eos) + 1]
    shown = new[:-1] if stopped else new
    return Generation(
        prompt, ids, new, tokenizer.token_strings(new), tokenizer.decode(shown), stopped
    )
