"""Retrieval heads: the needle-in-a-haystack probe and Wu et al. 2024's retrieval score.

Shape legend
    B   needle probes run together (same length, same answer length)
    L   layers; h heads per layer
    n   tokens of a probe; a tokens of its answer; s key positions

A needle probe is a stretch of Hamlet (the shipped public-domain corpus) with a line "The secret
number is NNNNN." put at some depth, and a question at the end asking for the number; the model
answers greedily. A head's retrieval score is Wu et al.'s rule: at each generated token, when
the head's most-attended position lies inside the needle's digits and holds the token just
generated, the head gains 1/|needle| (|needle|: the digits' tokens). Heads whose score, averaged
over probes, exceeds :data:`headlab.heads.labels.THRESHOLDS` ["retrieval"] (0.1, the paper's
line) are labelled "retrieval" by :func:`headlab.heads.analyse` when it is given the scores.

This module is the one home of the probe and the score: ``headlab heads --probe needle``, the
page's live needle and ``headlab experiment retrieval`` all call it.

Paper: Wu et al. 2024, "Retrieval Head Mechanistically Explains Long-Context Factuality".
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from headlab.heads.labels import passes
from headlab.heads.report import RetrievalScores
from headlab.measure import Probe, make_probe, special_ids
from headlab.model import Transformer
from headlab.trace import Trace

HAYSTACK_WORK = "hamlet"
NEEDLE = ("\nThe secret number is", ".\n")  # the fact's digits go between the two
QUESTION = "\nQuestion: What is the secret number?\nAnswer: The secret number is"
# the cue for models of few positions (the default model's 64): the question's words cost room
SHORT_QUESTION = "\nThe secret number is"
DIGITS = 5
DEPTHS = (0.0, 0.25, 0.5, 0.75, 1.0)  # the needle's depths in ``headlab heads --probe needle``
PROBE_LENGTH = 256  # its context in tokens, or the model's positions less room for the answer


@dataclass(frozen=True)
class NeedleProbe:
    ids: Tensor  # (n,) the context, needle inside, question at the end
    answer: Tensor  # (a,) the fact's tokens, which the model should write next
    span: tuple[int, int]  # [start, end) of the fact's tokens in ids
    length: int
    depth: float
    seed: int


def build_needle(
    tokenizer: Any,
    hay: list[int],
    length: int,
    depth: float,
    seed: int,
    question: str = QUESTION,
) -> NeedleProbe:
    """A probe of exactly ``length`` tokens: haystack from a seeded offset, the needle after
    ``depth`` of it, the question last. Raises ValueError when the length leaves no haystack."""
    rng = random.Random(f"{length}-{depth}-{seed}")
    number = str(rng.randrange(10 ** (DIGITS - 1), 10**DIGITS))
    pre, fact, post, cue = (
        pieces(tokenizer, t) for t in (NEEDLE[0], " " + number, NEEDLE[1], question)
    )
    start_token = tokenizer.encode("")  # what the tokenizer puts first (Gemma's <bos>), or []
    room = length - len(start_token) - len(pre) - len(fact) - len(post) - len(cue)
    if room < 1:
        raise ValueError(f"a context of {length} tokens leaves no room for the haystack")
    start = rng.randrange(0, len(hay) - room)
    stack = hay[start : start + room]
    at = round(depth * room)
    ids = start_token + stack[:at] + pre + fact + post + stack[at:] + cue
    span = (len(start_token) + at + len(pre), len(start_token) + at + len(pre) + len(fact))
    return NeedleProbe(torch.tensor(ids), torch.tensor(fact), span, length, depth, seed)


def pieces(tokenizer: Any, text: str) -> list[int]:
    """The tokens of ``text`` without the special tokens a tokenizer adds to every call
    (Gemma's <bos>): a piece of a probe, not a probe's start."""
    specials = special_ids(tokenizer)
    return [i for i in tokenizer.encode(text) if i not in specials]


def haystack(tokenizer: Any) -> list[int]:
    """The haystack play's tokens, from the copy shipped in the package (nothing downloaded)."""
    from headlab.corpus import shipped_work

    return pieces(tokenizer, shipped_work(HAYSTACK_WORK))


def groups(probes: list[NeedleProbe]) -> list[list[NeedleProbe]]:
    """Probes batched by (length, answer length): each batch runs as one."""
    out: dict[tuple[int, int], list[NeedleProbe]] = {}
    for p in probes:
        out.setdefault((len(p.ids), p.answer.numel()), []).append(p)
    return list(out.values())


@torch.inference_mode()
def answer(
    model: Transformer,
    probes: list[NeedleProbe],
    head_mask: Tensor | None = None,
    record: str | None = "top",
) -> tuple[Tensor, list[Tensor]]:
    """Greedy answers (B, a) to probes of one length and answer length, with ``head_mask``
    (n_layers, h); and, for each answer token, the attention row of the query that produced
    it: each head's most-attended position (L, B, h) with ``record="top"``, the whole row
    (L, B, h, s) with "weights", nothing with None (then attention runs fused)."""
    ids = torch.stack([p.ids for p in probes])  # (B, n)
    B, n = ids.shape
    a = probes[0].answer.numel()
    cache = model.new_cache(B, n + a - 1)
    # fills the cache; no weights kept, and no logits: the prefill's unembedding is most of its
    # cost for a large vocabulary (Gemma 3: 262k × 640)
    model.hidden_states(ids[:, :-1], head_mask=head_mask, cache=cache)
    reduce = (lambda name, w: w[:, :, -1].argmax(-1)) if record == "top" else None
    last, out, rows = ids[:, -1], [], []
    for _ in range(a):
        trace = Trace(only=("weights",), reduce=reduce) if record else None
        logits = model(last[:, None], head_mask=head_mask, cache=cache, trace=trace)[:, -1]
        if trace is not None:
            w = trace.stack("attn.weights")  # (L, B, h) or (L, B, h, 1, s): the one query's row
            rows.append(w if record == "top" else w[:, :, :, -1])
        last = logits.argmax(-1)  # (B,)
        out.append(last)
    return torch.stack(out, dim=1), rows


def retrieval_scores(tops: list[Tensor], generated: Tensor, probes: list[NeedleProbe]) -> Tensor:
    """(B, L, h) Wu et al.'s score of each head on each probe, from the most-attended
    positions ``tops`` (L, B, h) of the query that produced each answer token generated[:, t]
    (B, a): 1/|needle| each time that position is inside the needle and holds that token."""
    B, L, h = generated.shape[0], tops[0].shape[0], tops[0].shape[2]
    score = torch.zeros(B, L, h)
    for t, top in enumerate(tops):
        for b, p in enumerate(probes):
            seq = torch.cat([p.ids, generated[b]])
            pos = top[:, b]  # (L, h)
            inside = (pos >= p.span[0]) & (pos < p.span[1])
            same = seq[pos] == generated[b, t]
            score[b] += (inside & same).float() / (p.span[1] - p.span[0])
    return score


def score_needles(model: Transformer, probes: list[NeedleProbe]) -> list[dict[str, Any]]:
    """Per probe, in the order given: whether the number came back whole, what came back
    (a,), and every head's retrieval score (L, h). A ValueError saying why for a model that
    attends both ways: it cannot write an answer token by token."""
    if not model.config.causal:
        raise ValueError(
            "the needle probe has the model write back a number it read (Wu et al. 2024's "
            "retrieval test), which needs a causal (decoder) model; this one attends both "
            "ways: pick another probe, or a decoder model"
        )
    rows: dict[int, dict[str, Any]] = {}
    index = {id(p): i for i, p in enumerate(probes)}
    for batch in groups(probes):
        generated, tops = answer(model, batch)
        scores = retrieval_scores(tops, generated, batch)  # (B, L, h)
        for p, g, sc in zip(batch, generated, scores, strict=True):
            rows[index[id(p)]] = {
                "length": p.length,
                "depth": p.depth,
                "seed": p.seed,
                "correct": bool(torch.equal(g, p.answer)),
                "generated": g,
                "scores": sc,
            }
    return [rows[i] for i in range(len(probes))]


def needle_probes(
    tokenizer: Any, max_len: int, seed: int = 0, depths: tuple[float, ...] = DEPTHS
) -> list[NeedleProbe]:
    """The probes of ``headlab heads --probe needle``: one per depth, :data:`PROBE_LENGTH`
    tokens or what the model's ``max_len`` positions leave after the answer, the question
    short when that is under 128; ``seed`` picks the numbers and the haystack's offsets."""
    length = min(PROBE_LENGTH, max_len - 2 * DIGITS)
    question = QUESTION if length >= 128 else SHORT_QUESTION
    hay = haystack(tokenizer)
    return [build_needle(tokenizer, hay, length, d, seed, question) for d in depths]


def needle_analysis(
    model: Transformer, tokenizer: Any, seed: int = 0, max_len: int | None = None
) -> tuple[Probe, RetrievalScores, list[dict[str, Any]]]:
    """What :func:`headlab.heads.analyse` needs for the needle probe: the probes as one
    :class:`~headlab.measure.Probe` (B = one per depth), each head's retrieval score averaged
    over them, and per probe whether the model answered (with its answer's token ids).
    ``max_len``: the positions the probes may use (default the model's; the server's is less)."""
    needles = needle_probes(tokenizer, max_len or model.config.max_len, seed)
    rows = score_needles(model, needles)
    mean = torch.stack([r.pop("scores") for r in rows]).mean(0)  # (L, h)
    scores = {(l, i): float(mean[l, i]) for l in range(mean.shape[0]) for i in range(mean.shape[1])}
    for r, p in zip(rows, needles, strict=True):
        r["generated"] = r["generated"].tolist()
        r["answer"] = p.answer.tolist()
        r["span"] = list(p.span)
    probe = make_probe("needle", torch.stack([p.ids for p in needles]), tokenizer)
    return probe, scores, rows


def live_needle(
    model: Transformer, tokenizer: Any, depth: float = 0.5, seed: int = 0, top: int = 8
) -> dict[str, Any]:
    """One needle probe (as :func:`needle_probes` sizes it) at ``depth``, answered and scored:
    the needle, what the model wrote, whether it is the number, and the ``top`` heads by
    retrieval score on this one probe (those above 0 only), for the page's live look."""
    length = min(PROBE_LENGTH, model.config.max_len - 2 * DIGITS)
    question = QUESTION if length >= 128 else SHORT_QUESTION
    needle = build_needle(tokenizer, haystack(tokenizer), length, depth, seed, question)
    row = score_needles(model, [needle])[0]
    scores = row["scores"]  # (L, h)
    h = scores.shape[1]
    order = scores.flatten().argsort(descending=True, stable=True)[:top].tolist()
    heads = [
        {"layer": i // h, "head": i % h, "score": round(float(scores.flatten()[i]), 4)}
        for i in order
        if scores.flatten()[i] > 0
    ]
    lo, hi = needle.span
    return {
        "length": length,
        "depth": depth,
        "seed": seed,
        "needle": tokenizer.decode(needle.ids[lo:hi].tolist()).strip(),
        "question": question.strip(),
        "generated": tokenizer.decode(row["generated"].tolist()).strip(),
        "answered": row["correct"],
        "top_heads": heads,
        "heads": scores.numel(),
        "above_threshold": sum(passes("retrieval", float(x)) for x in scores.flatten()),
    }
