"""Inputs that reveal what heads do: a sentence with a repeat, repeated random tokens, user text.

A :class:`Probe` carries token ids (B, n), a display label per token of the first sequence, and
which positions are delimiters (special tokens such as [SEP], and punctuation) for the
first-token / delimiter scores of :mod:`headlab.heads`.

    sentence_probe        REPEAT_SENTENCE: natural text whose second half repeats the first, so
                          previous-token, duplicate and induction heads all have something to do
    random_repeat_probe   repeated random tokens after the model's start token, seeded: the
                          prefix-matching probe of Olsson et al. 2022 (random tokens, repeated,
                          so only an induction head can predict the second copy)
    text_probe            any text the user gives
"""

from __future__ import annotations

import string
import unicodedata
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor

REPEAT_SENTENCE = (
    "The old lighthouse keeper, tired but careful, climbed the stairs at dusk. "
    "The old lighthouse keeper, tired but careful, climbed the stairs at dusk."
)

PROBES = ("repeat", "random-repeat")


class TokenizerLike(Protocol):
    def encode(self, text: str) -> list[int]: ...
    def token_strings(self, ids: list[int]) -> list[str]: ...


@dataclass(frozen=True)
class Probe:
    """Token ids to run, with what the head scores need to know about them."""

    name: str  # "repeat", "random-repeat" or "text"
    tokens: Tensor  # (B, n) int64
    labels: list[str]  # display label of each token of the first sequence, length n
    delimiters: Tensor  # (B, n) bool: special tokens (other than position 0) and punctuation
    movable: Tensor  # (B, n) bool: ordinary tokens a position shuffle may move (content score)

    @property
    def n(self) -> int:
        return int(self.tokens.shape[1])


def is_punctuation(label: str) -> bool:
    """True for a token made only of punctuation ("." "," "?!" …), ignoring spaces."""
    text = label.strip()
    return bool(text) and all(
        c in string.punctuation or unicodedata.category(c).startswith("P") for c in text
    )


def _special_ids(tokenizer: TokenizerLike) -> set[int]:
    backend = getattr(tokenizer, "backend", None)
    decoder = getattr(backend, "get_added_tokens_decoder", None)
    if decoder is None:
        return set()
    return {int(i) for i, tok in decoder().items() if getattr(tok, "special", False)}


def make_probe(name: str, tokens: Tensor, tokenizer: TokenizerLike | None) -> Probe:
    """Wrap ids (B, n) into a Probe, marking delimiters and movable positions from the labels."""
    if tokens.dim() == 1:
        tokens = tokens.unsqueeze(0)
    B, n = tokens.shape
    specials = _special_ids(tokenizer) if tokenizer is not None else set()
    delimiters = torch.zeros(B, n, dtype=torch.bool)
    movable = torch.ones(B, n, dtype=torch.bool)
    for b in range(B):
        ids = tokens[b].tolist()
        labels = tokenizer.token_strings(ids) if tokenizer is not None else [str(i) for i in ids]
        for j, (i, label) in enumerate(zip(ids, labels, strict=True)):
            special = i in specials
            movable[b, j] = not special
            delimiters[b, j] = j > 0 and (special or is_punctuation(label))
    labels0 = (
        tokenizer.token_strings(tokens[0].tolist())
        if tokenizer
        else list(map(str, tokens[0].tolist()))
    )
    return Probe(name, tokens.long(), labels0, delimiters, movable)


def check_length(n: int, max_len: int) -> None:
    """Raise a ValueError for a probe the model cannot take (empty, or over its length)."""
    if n == 0:
        raise ValueError("the text is empty: give at least one word")
    if n > max_len:
        raise ValueError(
            f"the text is {n} tokens but the model takes at most {max_len}; shorten it"
        )


def text_probe(tokenizer: TokenizerLike, text: str, max_len: int) -> Probe:
    """The user's text as a probe (special tokens as the tokenizer adds them)."""
    if not text.strip():
        raise ValueError("the text is empty: give at least one word")
    ids = tokenizer.encode(text)
    check_length(len(ids), max_len)
    return make_probe("text", torch.tensor([ids]), tokenizer)


def sentence_probe(tokenizer: TokenizerLike, max_len: int) -> Probe:
    """The built-in sentence with a repeat (:data:`REPEAT_SENTENCE`)."""
    probe = text_probe(tokenizer, REPEAT_SENTENCE, max_len)
    return Probe("repeat", probe.tokens, probe.labels, probe.delimiters, probe.movable)


def repeated_random_tokens(
    candidates: Tensor,
    length: int = 25,
    repeats: int = 2,
    batch: int = 4,
    seed: int = 0,
    prefix: list[int] | None = None,
    suffix: list[int] | None = None,
) -> Tensor:
    """(batch, len(prefix) + length·repeats + len(suffix)) ids: a random run, repeated.

    ``length`` distinct ids are drawn without replacement from ``candidates`` (1-D) per
    sequence, seeded, then repeated ``repeats`` times between ``prefix`` (e.g. BOS / [CLS]) and
    ``suffix`` (e.g. [SEP]). Olsson et al. 2022 use 25 tokens, repeated, after a BOS.
    """
    if length > candidates.numel():
        raise ValueError(f"length {length} exceeds the {candidates.numel()} candidate ids")
    g = torch.Generator().manual_seed(seed)
    rows = []
    for _ in range(batch):
        run = candidates[torch.randperm(candidates.numel(), generator=g)[:length]]
        rows.append(
            torch.cat([torch.tensor(prefix or []), run.repeat(repeats), torch.tensor(suffix or [])])
        )
    return torch.stack(rows).long()  # (batch, n)


BOS_NAMES = ("<|endoftext|>", "<|begin_of_text|>", "<s>", "<bos>", "[CLS]")


def _frame(tokenizer: TokenizerLike) -> tuple[list[int], list[int]]:
    """The special ids the tokenizer puts before and after a text ([CLS] … [SEP]).

    A tokenizer that adds no start token (GPT-2's) gets its BOS-like special token in front,
    as Olsson et al. 2022 prepend a BOS to their probe.
    """
    ids = tokenizer.encode("word")
    inner = [j for j, i in enumerate(ids) if i not in _special_ids(tokenizer)]
    prefix, suffix = (ids[: inner[0]], ids[inner[-1] + 1 :]) if inner else ([], [])
    if not prefix:
        backend = getattr(tokenizer, "backend", None)
        token_to_id = getattr(backend, "token_to_id", None)
        bos = [token_to_id(name) for name in BOS_NAMES] if token_to_id else []
        prefix = [i for i in bos if i is not None and i in _special_ids(tokenizer)][:1]
    return prefix, suffix


def ordinary_token_ids(tokenizer: TokenizerLike, vocab_size: int) -> Tensor:
    """Ids of ordinary word tokens: not special, not punctuation, not a '##' continuation.

    Olsson et al. 2022 also drop the most and least common tokens; without frequencies the
    middle of the id range is kept (BPE and WordPiece ids roughly follow frequency).
    """
    specials = _special_ids(tokenizer)
    lo, hi = vocab_size // 20, vocab_size - vocab_size // 20
    ids = [i for i in range(lo, hi) if i not in specials]
    labels = tokenizer.token_strings(ids)
    keep = [
        i
        for i, s in zip(ids, labels, strict=True)
        if s.strip().isalpha() and not s.startswith("##") and not s.startswith("[")
    ]
    return torch.tensor(keep or ids)


def random_repeat_probe(
    tokenizer: TokenizerLike | None,
    vocab_size: int,
    max_len: int,
    length: int = 25,
    batch: int = 4,
    seed: int = 0,
    repeats: int = 4,
) -> Probe:
    """Repeated random tokens framed like the model's text (Olsson et al. 2022's evaluator).

    Olsson et al. repeat 25 random tokens 4 times; a shorter context keeps the 4 repeats and
    shortens the segment (down to 2 tokens, then fewer repeats). The repeats matter for the
    "mul" induction score: only queries after the first copy have a target, so with 2 copies
    even a perfect induction head scores under 0.5, with 4 copies about 0.75.
    """
    prefix, suffix = _frame(tokenizer) if tokenizer is not None else ([], [])
    room = max_len - len(prefix) - len(suffix)
    while repeats > 2 and room // repeats < 2:
        repeats -= 1
    length = min(length, room // repeats)
    if length < 2:
        raise ValueError(f"max_len {max_len} is too short for a repeated-random-tokens probe")
    candidates = (
        ordinary_token_ids(tokenizer, vocab_size)
        if tokenizer is not None
        else torch.arange(vocab_size)
    )
    tokens = repeated_random_tokens(candidates, length, repeats, batch, seed, prefix, suffix)
    return make_probe("random-repeat", tokens, tokenizer)
