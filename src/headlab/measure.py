"""Probes and measurements, written once: what every experiment, the CLI and the server run.

Shape legend
    B   probe sequences
    n   tokens of a probe (the model's input)
    L   layers; h heads per layer

Probes: inputs that reveal what heads do. A :class:`Probe` carries token ids (B, n), a display
label per token of the first sequence, which positions are delimiters and which a position
shuffle may move (for :mod:`headlab.heads`), and where its copies are (``source``). The head
scores themselves live in :mod:`headlab.heads.scores`.

    PROBES                 the one vocabulary of probe names: the CLI, the API's schema and the
                           page (which reads it from the server) all take it from here
      "repeat"             the built-in sentence with a repeat (:data:`REPEAT_SENTENCE`)
      "random-repeat"      random tokens repeated 4 times after the model's start token: Olsson
                           et al. 2022's prefix-matching evaluator
      "text"               any text the user gives
    build_probe            one of the above for a model and its tokenizer
    repeated_random_tokens the one generator of repeated random runs (probes, held-out sets)

Losses and in-context scores:

    token_losses           (B, n) next-token cross-entropy of every position of tokens (B, n + 1)
    next_token_loss        its mean over targets (−100 = skip): the training loss
    copy_losses            loss on the first copy against the same tokens in a later copy
    icl_score              Olsson et al. 2022's in-context-learning score: loss late in the
                           context minus loss early in it
    reduce_patterns        each layer's attention weights handed to a reducing function as that
                           layer runs (streaming: one layer's (B, h, n, n) held at a time)
    run_patterns           every layer's attention weights on a probe, (L, B, h, n, n)

Papers: Olsson et al. 2022, "In-context Learning and Induction Heads".
"""

from __future__ import annotations

import bisect
import contextlib
import re
import string
import unicodedata
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import torch
import torch.nn.functional as F
from torch import Tensor

from headlab.devices import input_device
from headlab.trace import Enough, Trace

REPEAT_SENTENCE = (
    "The old lighthouse keeper, tired but careful, climbed the stairs at dusk. "
    "The old lighthouse keeper, tired but careful, climbed the stairs at dusk."
)

# name → (whether it reads the user's text, what it is): the one vocabulary of probes
PROBE_INFO: dict[str, tuple[bool, str]] = {
    "repeat": (False, "the built-in sentence with a repeat"),
    "random-repeat": (False, "random tokens, repeated 4 times (Olsson et al. 2022's probe)"),
    "text": (True, "the text you give"),
}
PROBES = tuple(PROBE_INFO)
R = TypeVar("R")


class TokenizerLike(Protocol):
    def encode(self, text: str) -> list[int]: ...
    def token_strings(self, ids: list[int]) -> list[str]: ...


# ---------------------------------------------------------------------------------------------
# Probes
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Probe:
    """Token ids to run, with what the head scores and the copy losses need to know about them."""

    name: str  # a PROBES name, or an experiment's own ("agreement", "copy")
    tokens: Tensor  # (B, n) int64
    labels: list[str]  # display label of each token of the first sequence, length n
    delimiters: Tensor  # (B, n) bool: special tokens (other than position 0) and punctuation
    # (B, n) bool: ordinary tokens, which the shuffled baseline may move and the content score
    # keeps (the others are its fixed keys)
    movable: Tensor
    source: Tensor  # (B, n) int64: the position each token copies, −1 where it copies nothing
    text: str = ""  # the text the probe was made from ("" for token probes)
    # the word each token is part of (−1: a special token), and each sequence's words: a text's
    # words from the tokenizer's character offsets, else one word per ordinary token
    word_index: Tensor | None = None  # (B, n) int64
    words: tuple[tuple[str, ...], ...] = ()  # per sequence, the text of word 0, 1, …

    @property
    def n(self) -> int:
        return int(self.tokens.shape[1])


def is_punctuation(label: str) -> bool:
    """True for a token made only of punctuation ("." "," "?!" …), ignoring spaces."""
    text = label.strip()
    return bool(text) and all(
        c in string.punctuation or unicodedata.category(c).startswith("P") for c in text
    )


def special_ids(tokenizer: Any) -> set[int]:
    """Ids of the tokenizer's special tokens ([CLS], [SEP], <|endoftext|> …), if it says."""
    backend = getattr(tokenizer, "backend", None)
    decoder = getattr(backend, "get_added_tokens_decoder", None)
    if decoder is None:
        return set()
    return {int(i) for i, tok in decoder().items() if getattr(tok, "special", False)}


WORD = re.compile(r"\w+(?:['’]\w+)*|[^\w\s]")  # a run of letters/digits (with "'s"), or one mark


def token_words(
    text: str,
    offsets: Sequence[tuple[int, int]],
    special: Sequence[bool],
    spans: Sequence[tuple[int, int]] | None = None,
) -> tuple[list[int], list[str]]:
    """Which word of ``text`` each token belongs to: ``(index per token, words)``.

    Words are ``spans`` (character ranges, e.g. a parser's tokens) or, by default, runs of
    letters and digits (an inner apostrophe kept: "keeper's") and single punctuation marks; a
    token belongs to the word holding its first non-space character (``offsets`` are the
    tokenizer's character spans), −1 for special tokens and tokens outside every word.
    """
    if spans is None:
        spans = [(m.start(), m.end()) for m in WORD.finditer(text)]
    starts = [a for a, _ in spans]
    index = []
    for (a, b), is_special in zip(offsets, special, strict=True):
        while a < b and text[a].isspace():
            a += 1
        k = bisect.bisect_right(starts, a) - 1
        index.append(k if not is_special and a < b and k >= 0 and a < spans[k][1] else -1)
    return index, [text[a:b] for a, b in spans]


def word_zipf(words: Sequence[str]) -> list[float]:
    """Each word's English frequency on the Zipf scale (log10 of its count per billion words)
    from the ``wordfreq`` package's table (``headlab[syntax]``); 0 for a word it has never
    seen, NaN for punctuation (not a word). Raises ModuleNotFoundError without wordfreq."""
    import wordfreq

    return [
        float("nan") if is_punctuation(w) else float(wordfreq.zipf_frequency(w, "en"))
        for w in words
    ]


def same_token(tokens: Tensor) -> Tensor:
    """(B, n, n) bool from tokens (B, n): positions i and j hold the same token (i == j too).
    The one same-token matrix: copy sources here, every token rule in :mod:`headlab.heads`."""
    return tokens[:, :, None] == tokens[:, None, :]


def earlier_occurrence(tokens: Tensor) -> Tensor:
    """(B, n) → (B, n): the latest earlier position holding the same token, −1 if none.

    The copy source of a text probe, where no generator says where the copies are.
    """
    B, n = tokens.shape
    same = torch.tril(same_token(tokens), diagonal=-1)  # (B, n, n)
    pos = torch.arange(n).expand(B, n, n)
    return torch.where(same, pos, -1).amax(dim=-1)  # (B, n)


def make_probe(
    name: str,
    tokens: Tensor,
    tokenizer: TokenizerLike | None,
    source: Tensor | None = None,
    text: str = "",
    words: tuple[list[int], list[str]] | None = None,
) -> Probe:
    """Wrap ids (B, n) into a Probe: delimiters and movable positions from the token labels,
    ``source`` as given (a generator knows its copies) or each token's earlier occurrence;
    ``words`` (one sequence: :func:`token_words`) or one word per ordinary token."""
    if tokens.dim() == 1:
        tokens = tokens.unsqueeze(0)
    tokens = tokens.long()
    B, n = tokens.shape
    specials = special_ids(tokenizer) if tokenizer is not None else set()
    delimiters = torch.zeros(B, n, dtype=torch.bool)
    movable = torch.ones(B, n, dtype=torch.bool)
    labels0: list[str] = []
    word_index = torch.full((B, n), -1, dtype=torch.long)
    word_text = []
    for b in range(B):
        ids = tokens[b].tolist()
        labels = tokenizer.token_strings(ids) if tokenizer is not None else [str(i) for i in ids]
        labels0 = labels0 or list(labels)
        for j, (i, label) in enumerate(zip(ids, labels, strict=True)):
            movable[b, j] = i not in specials
            delimiters[b, j] = j > 0 and (i in specials or is_punctuation(label))
        ordinary = movable[b].nonzero()[:, 0]
        word_index[b, ordinary] = torch.arange(ordinary.numel())
        word_text.append(tuple(labels[j].strip() for j in ordinary.tolist()))
    if words is not None:
        word_index, word_text = torch.tensor([words[0]]), [tuple(words[1])]
    source = earlier_occurrence(tokens) if source is None else source.long()
    return Probe(
        name, tokens, labels0, delimiters, movable, source, text, word_index, tuple(word_text)
    )


def check_length(n: int, max_len: int) -> None:
    """Raise a ValueError for a probe the model cannot take (empty, or over its length)."""
    if n == 0:
        raise ValueError("the text is empty: give at least one word")
    if n > max_len:
        raise ValueError(
            f"the text is {n} tokens but the model takes at most {max_len}; shorten it"
        )


def text_probe(tokenizer: TokenizerLike, text: str, max_len: int, name: str = "text") -> Probe:
    """The user's text as a probe (special tokens as the tokenizer adds them)."""
    if not text.strip():
        raise ValueError("the text is empty: give at least one word")
    ids = tokenizer.encode(text)
    check_length(len(ids), max_len)
    words = None
    offsets = getattr(tokenizer, "offsets", None)
    if offsets is not None:
        specials = special_ids(tokenizer)
        words = token_words(text, offsets(text), [i in specials for i in ids])
    return make_probe(name, torch.tensor([ids]), tokenizer, text=text, words=words)


def sentence_probe(tokenizer: TokenizerLike, max_len: int) -> Probe:
    """The built-in sentence with a repeat (:data:`REPEAT_SENTENCE`), named "repeat"."""
    return text_probe(tokenizer, REPEAT_SENTENCE, max_len, name="repeat")


def repeated_random_tokens(
    candidates: Tensor,
    length: int,
    repeats: int,
    batch: int,
    generator: torch.Generator,
    prefix: Sequence[int] = (),
    suffix: Sequence[int] = (),
) -> tuple[Tensor, Tensor]:
    """``(tokens, source)``, each (batch, len(prefix) + length·repeats + len(suffix)).

    Per sequence, ``length`` distinct ids are drawn without replacement from ``candidates``
    (1-D), then repeated ``repeats`` times between ``prefix`` (BOS / [CLS]) and ``suffix``
    ([SEP]). ``source`` is the position each token copies (the same token one copy earlier),
    −1 in the first copy and the frame. Olsson et al. 2022 repeat 25 tokens after a BOS.
    """
    if length > candidates.numel():
        raise ValueError(f"length {length} exceeds the {candidates.numel()} candidate ids")
    rows = []
    for _ in range(batch):
        run = candidates[torch.randperm(candidates.numel(), generator=generator)[:length]]
        pre, post = torch.tensor(prefix, dtype=torch.long), torch.tensor(suffix, dtype=torch.long)
        rows.append(torch.cat([pre, run.repeat(repeats).long(), post]))
    tokens = torch.stack(rows).long()  # (batch, n)
    p, body = len(prefix), length * repeats
    source = torch.full_like(tokens, -1)
    source[:, p + length : p + body] = torch.arange(p, p + body - length)
    return tokens, source


BOS_NAMES = ("<|endoftext|>", "<|begin_of_text|>", "<s>", "<bos>", "[CLS]", "<|im_start|>")


def frame(tokenizer: TokenizerLike) -> tuple[list[int], list[int]]:
    """The special ids the tokenizer puts before and after a text ([CLS] … [SEP]).

    A tokenizer that adds no start token (GPT-2's) gets its BOS-like special token in front,
    as Olsson et al. 2022 prepend a BOS to their probe.
    """
    ids = tokenizer.encode("word")
    specials = special_ids(tokenizer)
    inner = [j for j, i in enumerate(ids) if i not in specials]
    prefix, suffix = (ids[: inner[0]], ids[inner[-1] + 1 :]) if inner else ([], [])
    if not prefix:
        backend = getattr(tokenizer, "backend", None)
        token_to_id = getattr(backend, "token_to_id", None)
        bos = [token_to_id(name) for name in BOS_NAMES] if token_to_id else []
        prefix = [i for i in bos if i is not None and i in specials][:1]
    return prefix, suffix


def ordinary_token_ids(tokenizer: TokenizerLike, vocab_size: int) -> Tensor:
    """Ids of ordinary word tokens: not special, not punctuation, not a '##' continuation.

    Olsson et al. 2022 also drop the most and least common tokens; without frequencies the
    middle of the id range is kept (BPE and WordPiece ids roughly follow frequency).
    """
    specials = special_ids(tokenizer)
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
    prefix, suffix = frame(tokenizer) if tokenizer is not None else ([], [])
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
    g = torch.Generator().manual_seed(seed)
    tokens, source = repeated_random_tokens(candidates, length, repeats, batch, g, prefix, suffix)
    return make_probe("random-repeat", tokens, tokenizer, source)


def build_probe(
    name: str,
    tokenizer: TokenizerLike,
    max_len: int,
    vocab_size: int,
    text: str | None = None,
    seed: int = 0,
) -> Probe:
    """The probe ``name`` (a :data:`PROBES` name) for a model of ``max_len`` tokens and
    ``vocab_size`` ids, ready for head analysis.

    "text" needs ``text``; "repeat" and "random-repeat" take none. Raises ValueError with a
    sentence for the user on an unknown name, missing, extra, empty or over-long text.
    """
    if name not in PROBES:
        raise ValueError(f"unknown probe {name!r}; valid probes: {', '.join(PROBES)}")
    if name == "text":
        if text is None:
            raise ValueError("probe 'text' needs a text; give one, or use probe 'repeat'")
        return text_probe(tokenizer, text, max_len)
    if text is not None:
        raise ValueError(f"probe {name!r} takes no text; leave the text out or use probe 'text'")
    if name == "repeat":
        return sentence_probe(tokenizer, max_len)
    return random_repeat_probe(tokenizer, vocab_size, max_len, seed=seed)


# ---------------------------------------------------------------------------------------------
# Running a probe, losses and in-context scores
# ---------------------------------------------------------------------------------------------


def layer_index(name: str) -> int:
    """The layer l of a trace name ``blocks.{l}.…`` (e.g. "blocks.3.attn.weights" → 3)."""
    parts = name.split(".")
    if len(parts) < 2 or parts[0] != "blocks" or not parts[1].isdigit():
        raise ValueError(f"{name!r} is not a per-layer trace name (blocks.<layer>.…)")
    return int(parts[1])


def reduce_patterns(
    model: Any,
    tokens: Tensor,
    reduce: Callable[[int, Tensor], R],
    progress: Callable[[int, int], None] | None = None,
    place: Callable[[int, tuple[int, ...], torch.dtype, torch.device], Tensor | None] | None = None,
) -> list[R]:
    """Run ``model`` on ``tokens`` (B, n) and reduce each layer's attention weights as it runs.

    ``reduce(layer, weights)`` gets layer l's weights (B, h, n, n), in the model's dtype and on
    the device that layer runs on, while the model is still inside that layer; the weights
    are not kept, so the extra memory at any moment is one layer's patterns plus what
    ``reduce`` keeps, not L layers'. ``progress(done, L)`` is called after each layer.
    Returns ``[reduce(0, ·), …, reduce(L − 1, ·)]``. The forward stops at the last layer's
    weights (MiniLM's forward spends 14% after them), but on a model accelerate dispatched,
    whose hooks must see each block to its end. ``place(layer, shape, dtype, device)`` may
    give the tensor layer l's softmax is written into (where ``reduce`` keeps it anyway,
    saving it a copy; :meth:`headlab.trace.Trace.place`), or None.
    """
    results: dict[int, R] = {}
    L, stop = int(model.config.n_layers), not getattr(model, "hf_device_map", None)

    def hook(name: str, weights: Tensor) -> None:
        results[layer_index(name)] = reduce(layer_index(name), weights)
        if progress is not None:
            progress(len(results), L)
        if stop and len(results) == L:
            raise Enough

    def where(name: str, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> Any:
        assert place is not None
        return place(layer_index(name), shape, dtype, device)

    trace = Trace(only=("weights",), reduce=hook, place=None if place is None else where)
    with torch.inference_mode(), contextlib.suppress(Enough):
        model.hidden_states(tokens.to(input_device(model)), trace=trace)
    return [results[l] for l in range(L)]


def run_patterns(model: Any, tokens: Tensor) -> Tensor:
    """Every layer's attention weights on ``tokens`` (B, n): (L, B, h, n, n), float32, CPU.

    Runs the hidden states only (the unembedding is not needed for patterns). Holds all L
    layers' patterns: for long inputs reduce them as they come (:func:`reduce_patterns`).
    """
    out: list[Tensor] = []  # the result, allocated once the first layer's shape is known

    def keep(layer: int, weights: Tensor) -> None:
        if not out:
            out.append(torch.empty(model.config.n_layers, *weights.shape, dtype=torch.float32))
        out[0][layer].copy_(weights)

    reduce_patterns(model, tokens, keep)
    return out[0]  # (L, B, h, n, n)


def next_token_pair(tokens: Tensor) -> tuple[Tensor, Tensor]:
    """(B, n + 1) token ids → ``(inputs, targets)``, each (B, n), for next-token prediction."""
    return tokens[:, :-1], tokens[:, 1:]


def token_losses(model: Any, batch: Tensor | tuple[Tensor, Tensor], **kw: Any) -> Tensor:
    """(B, n) cross-entropy of every next-token prediction (0 where the target is −100).

    ``batch`` is ``(inputs, targets)``, each (B, n), or tokens (B, n + 1) whose targets are the
    tokens shifted by one; keywords (``trace``, ``head_mask``) go to the model.
    """
    inputs, targets = next_token_pair(batch) if isinstance(batch, Tensor) else batch
    logits = model(inputs, **kw)  # (B, n, V)
    return F.cross_entropy(logits.transpose(1, 2), targets, reduction="none", ignore_index=-100)


def next_token_loss(model: Any, batch: Tensor | tuple[Tensor, Tensor], **kw: Any) -> Tensor:
    """Mean next-token cross-entropy over the targets that are not −100: the training loss.

    ``batch`` as for :func:`token_losses`; ``model(inputs, **kw)`` gives (B, n, V) logits.
    """
    inputs, targets = next_token_pair(batch) if isinstance(batch, Tensor) else batch
    logits = model(inputs, **kw)  # (B, n, vocab)
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=-100)


def copy_targets(source: Tensor) -> tuple[Tensor, Tensor]:
    """Which next-token targets lie in a later copy, and the same tokens in the earlier copy.

    source (B, n + 1) as in :class:`Probe`. Target k predicts token k + 1; it is "later" when
    tokens k and k + 1 both copy consecutive earlier tokens (the first token of a copy is left
    out: nothing announces it), and "first" marks the targets of those earlier tokens.
    Returns ``(first, later)``, each (B, n) bool.
    """
    prev, cur = source[:, :-1], source[:, 1:]
    later = (cur >= 0) & (prev >= 0) & (prev == cur - 1)  # (B, n)
    first = torch.zeros_like(later)
    rows, cols = torch.nonzero(later, as_tuple=True)
    first[rows, source[:, 1:][rows, cols] - 1] = True
    return first, later


def copy_losses(losses: Tensor, source: Tensor) -> tuple[float, float]:
    """Mean loss on tokens of an earlier copy and on the same tokens in a later copy.

    losses (B, n) from :func:`token_losses` on tokens (B, n + 1) whose copies ``source`` names.
    A large gap is in-context learning: the later copy is predicted from the earlier one.
    """
    first, later = copy_targets(source)
    return float(losses[first].mean()), float(losses[later].mean())


def icl_score(losses: Tensor, early: slice, late: slice) -> float:
    """Olsson et al. 2022's in-context-learning score: mean loss at the ``late`` targets minus
    mean loss at the ``early`` ones, losses (B, n). Theirs is the 500th token minus the 50th of
    512; :func:`icl_positions` scales that to n. Negative: more context, better predictions."""
    return float(losses[:, late].mean() - losses[:, early].mean())


def icl_positions(n: int, window: int = 1) -> tuple[slice, slice]:
    """Olsson et al.'s 50th and 500th of 512 tokens as target slices of an n-target context,
    ``window`` targets wide each (the late one ends at the last target with window > 1)."""
    if window == 1:
        early, late = max(0, round(50 / 512 * n) - 1), min(n - 1, round(500 / 512 * n) - 1)
        return slice(early, early + 1), slice(late, late + 1)
    early = max(window - 1, (n + 1) // 10)
    return slice(early - window + 1, early + 1), slice(n - window, n)
