"""Retrieval heads: which heads copy a fact out of a long context; does masking them break it.

Wu et al. 2024 find that a few heads (< 5% score above 0.1) do the copying when a model repeats a
fact from far back in its context: masking the top-k such heads breaks needle-in-a-haystack
retrieval, masking k random heads barely does. Here the haystack is Hamlet (the shipped
public-domain corpus), the needle a line "The secret number is NNNNN." with five random digits,
put at several depths of contexts of several lengths; a question at the end asks for the number
and the model answers greedily. A head's retrieval score is Wu et al.'s rule: at each generated
token, when the head's most-attended position lies inside the needle's digits and holds the token
just generated, it gains 1/|needle| (|needle|: the digits' tokens); scores are averaged over
probes. Accuracy (the whole number repeated) is then measured with the top-k heads masked, with k
heads drawn at random among the others (several draws, every one kept), and with none masked.
"""

from __future__ import annotations

import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from headlab.experiments import pyplot, save_figure, write_results
from headlab.files import one_thread
from headlab.model import Transformer
from headlab.trace import Trace

HAYSTACK_WORK = "hamlet"
NEEDLE = ("\nThe secret number is", ".\n")  # the fact's digits go between the two
QUESTION = "\nQuestion: What is the secret number?\nAnswer: The secret number is"
DIGITS = 5


@dataclass(frozen=True)
class RetrievalConfig:
    model: str = "smollm2"
    # context lengths in tokens: what two shared CPU cores allow in minutes (SmolLM2 reads
    # some tens of tokens a second there; 1,024-token probes worked in a trial but cost more)
    lengths: tuple[int, ...] = (64, 128, 192, 256)
    depths: tuple[float, ...] = (0.0, 0.25, 0.5, 0.75, 1.0)  # where the needle sits
    seeds: int = 2  # probes (number, haystack offset) per length and depth
    ks: tuple[int, ...] = (1, 4, 16)  # heads masked
    draws: int = 2  # random draws of k heads per k
    mask_lengths: tuple[int, ...] = (64,)  # the masking comparison's contexts
    question: str = QUESTION  # the cue at the end (the quick run's model has 64 positions)


FULL = RetrievalConfig()
QUICK = RetrievalConfig(model="default", lengths=(40, 52), depths=(0.0, 0.5, 1.0), seeds=1,
                        ks=(1, 2), draws=2, mask_lengths=(40,),
                        question="\nThe secret number is")  # fmt: skip


@dataclass(frozen=True)
class NeedleProbe:
    ids: Tensor  # (n,) the context, needle inside, question at the end
    answer: Tensor  # (a,) the fact's tokens, which the model should write next
    span: tuple[int, int]  # [start, end) of the fact's tokens in ids
    length: int
    depth: float
    seed: int


def build_probe(
    tokenizer: Any, hay: list[int], length: int, depth: float, seed: int,
    question: str = QUESTION,
) -> NeedleProbe:  # fmt: skip
    """A probe of exactly ``length`` tokens: haystack from a seeded offset, the needle after
    ``depth`` of it, the question last."""
    rng = random.Random(f"{length}-{depth}-{seed}")
    number = str(rng.randrange(10 ** (DIGITS - 1), 10**DIGITS))
    pre, fact, post = (tokenizer.encode(t) for t in (NEEDLE[0], " " + number, NEEDLE[1]))
    question = tokenizer.encode(question)
    room = length - len(pre) - len(fact) - len(post) - len(question)
    if room < 1:
        raise ValueError(f"a context of {length} tokens leaves no room for the haystack")
    start = rng.randrange(0, len(hay) - room)
    stack = hay[start : start + room]
    at = round(depth * room)
    ids = stack[:at] + pre + fact + post + stack[at:] + question
    span = (at + len(pre), at + len(pre) + len(fact))
    return NeedleProbe(torch.tensor(ids), torch.tensor(fact), span, length, depth, seed)


@torch.inference_mode()
def answer(
    model: Transformer, probes: list[NeedleProbe], head_mask: Tensor | None = None,
    record: str | None = "top",
) -> tuple[Tensor, list[Tensor]]:  # fmt: skip
    """Greedy answers (B, a) to probes of one length and answer length, with ``head_mask``
    (n_layers, h); and, for each answer token, the attention row of the query that produced
    it: each head's most-attended position (L, B, h) with ``record="top"``, the whole row
    (L, B, h, s) with "weights", nothing with None (then attention runs fused)."""
    ids = torch.stack([p.ids for p in probes])  # (B, n)
    B, n = ids.shape
    a = probes[0].answer.numel()
    cache = model.new_cache(B, n + a - 1)
    model(ids[:, :-1], head_mask=head_mask, cache=cache)  # fills the cache; no weights kept
    reduce = (lambda name, w: w[:, :, -1].argmax(-1)) if record == "top" else None
    last, out, rows = ids[:, -1], [], []
    for _ in range(a):
        trace = Trace(only=("weights",), reduce=reduce) if record else None
        logits = model(last[:, None], head_mask=head_mask, cache=cache, trace=trace)[:, -1]
        if trace is not None:
            rows.append(trace.stack("attn.weights"))
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


def haystack(tokenizer: Any) -> list[int]:
    """The haystack play's tokens."""
    from headlab.corpus import fetch_corpus, read_corpus

    return tokenizer.encode(dict(read_corpus(fetch_corpus()))[HAYSTACK_WORK])


def groups(probes: list[NeedleProbe]) -> list[list[NeedleProbe]]:
    """Probes batched by (length, answer length): each batch runs as one."""
    out: dict[tuple[int, int], list[NeedleProbe]] = {}
    for p in probes:
        out.setdefault((len(p.ids), p.answer.numel()), []).append(p)
    return list(out.values())


def score_probes(model: Transformer, probes: list[NeedleProbe]) -> list[dict[str, Any]]:
    """Per probe: whether the number came back whole, and every head's retrieval score."""
    rows = []
    for batch in groups(probes):
        generated, tops = answer(model, batch)
        scores = retrieval_scores(tops, generated, batch)  # (B, L, h)
        for p, g, sc in zip(batch, generated, scores, strict=True):
            rows.append({"length": p.length, "depth": p.depth, "seed": p.seed,
                         "correct": bool(torch.equal(g, p.answer)), "scores": sc})  # fmt: skip
    return rows


def accuracy(model: Transformer, probes: list[NeedleProbe], heads: list[tuple[int, int]]) -> float:
    """Share of probes answered whole with ``heads`` [(layer, head)] masked (output × 0)."""
    mask = torch.ones(model.config.n_layers, model.config.n_heads)
    for layer, head in heads:
        mask[layer, head] = 0.0
    right = 0
    for batch in groups(probes):
        generated, _ = answer(model, batch, mask, record=None)
        right += sum(bool(torch.equal(g, p.answer)) for g, p in zip(generated, batch, strict=True))
    return right / len(probes)


def masking(
    model: Transformer, probes: list[NeedleProbe], ranking: list[tuple[int, int]],
    cfg: RetrievalConfig, seed: int,
) -> dict[str, Any]:  # fmt: skip
    """Accuracy with no mask, the top-k heads masked, and k heads drawn among the rest."""
    rng = random.Random(seed)
    others = ranking[max(cfg.ks) :]
    rows = []
    for k in cfg.ks:
        draws = [sorted(rng.sample(others, k)) for _ in range(cfg.draws)]
        rows.append({"k": k, "top": accuracy(model, probes, ranking[:k]),
                     "random": [accuracy(model, probes, d) for d in draws],
                     "random_heads": draws})  # fmt: skip
    return {"none": accuracy(model, probes, []), "by_k": rows,
            "probes": len(probes), "lengths": list(cfg.mask_lengths)}  # fmt: skip


def run(*, quick: bool = False, seeds: int = 1, seed: int = 0, out: Path | None = None) -> dict:
    """Score every head on needle probes, then mask; write results.json and retrieval.png.
    ``seeds`` probes per length and depth (at least the config's), from ``seed``."""
    from headlab import zoo

    cfg = QUICK if quick else FULL
    t0 = time.perf_counter()
    with one_thread():
        model, tokenizer = zoo.load(cfg.model)
        hay = haystack(tokenizer)
        seed_list = range(seed, seed + max(seeds, cfg.seeds))

        def make(lengths: tuple[int, ...]) -> list[NeedleProbe]:
            return [build_probe(tokenizer, hay, n, d, s, cfg.question)
                    for n in lengths for d in cfg.depths for s in seed_list]  # fmt: skip

        rows = score_probes(model, make(cfg.lengths))
        mean = torch.stack([r.pop("scores") for r in rows]).mean(0)  # (L, h)
        order = mean.flatten().argsort(descending=True).tolist()
        h = mean.shape[1]
        ranking = [(i // h, i % h) for i in order]
        masked = masking(model, make(cfg.mask_lengths), ranking, cfg, seed)
    results = summary(cfg, quick, list(seed_list), rows, mean, ranking, masked)
    results["figures"] = [f for f in [_figure(results, out)] if f]
    results["wall_seconds"] = time.perf_counter() - t0
    write_results(out, results)
    return results


def summary(
    cfg: RetrievalConfig, quick: bool, seed_list: list[int], rows: list[dict[str, Any]],
    mean: Tensor, ranking: list[tuple[int, int]], masked: dict[str, Any],
) -> dict[str, Any]:  # fmt: skip
    """The results dict: scores, the share above 0.1, the heat map, masking, a verdict."""
    L, h = mean.shape
    heat = [[sum(r["correct"] for r in rows if r["length"] == n and r["depth"] == d)
             / max(1, sum(1 for r in rows if r["length"] == n and r["depth"] == d))
             for n in cfg.lengths] for d in cfg.depths]  # fmt: skip
    top = [
        {"layer": l, "head": hh, "score": round(float(mean[l, hh]), 4)} for l, hh in ranking[:16]
    ]
    results = {
        "experiment": "retrieval",
        "quick": quick,
        "model": cfg.model,
        "config": asdict(cfg),
        "seeds": seed_list,
        "rule": "Wu et al. 2024: 1/|needle| per answer token whose query's most-attended "
        "position is inside the needle and holds that token; mean over probes",
        "scores": [[round(float(x), 5) for x in row] for row in mean],
        "share_above_0_1": float((mean > 0.1).float().mean()),
        "heads": L * h,
        "top_heads": top,
        "accuracy": sum(r["correct"] for r in rows) / len(rows),
        "heat": {"depths": list(cfg.depths), "lengths": list(cfg.lengths), "accuracy": heat},
        "probes": rows,
        "masking": masked,
    }
    results["verdict"] = verdict(results)
    return results


def verdict(results: dict[str, Any]) -> list[str]:
    """Sentences from the measured numbers."""
    m = results["masking"]
    lines = [f"{results['share_above_0_1']:.1%} of {results['heads']} heads score above 0.1; "
             f"unmasked accuracy {results['accuracy']:.2f} on the scoring probes"]  # fmt: skip
    for row in m["by_k"]:
        rand = row["random"]
        lines.append(f"k={row['k']}: top-k masked {row['top']:.2f}, random k "
                     f"{sum(rand) / len(rand):.2f} (draws {', '.join(f'{x:.2f}' for x in rand)}), "
                     f"none {m['none']:.2f}")  # fmt: skip
    return lines


def _figure(results: dict, out: Path | None) -> str | None:
    plt = pyplot()
    fig, (hist, acc, heat) = plt.subplots(1, 3, figsize=(15, 4))
    flat = [x for row in results["scores"] for x in row]
    hist.hist(flat, bins=30, color="C0")
    hist.axvline(0.1, color="k", ls="--")
    hist.set_yscale("log")
    hist.set_xlabel("retrieval score")
    hist.set_ylabel("heads")
    hist.set_title(f"{results['model']}: {results['share_above_0_1']:.1%} above 0.1")
    m = results["masking"]
    ks = [r["k"] for r in m["by_k"]]
    acc.plot(ks, [r["top"] for r in m["by_k"]], "o-", color="C3", label="top-k masked")
    for r in m["by_k"]:
        acc.plot([r["k"]] * len(r["random"]), r["random"], ".", color="C0")
    acc.plot(ks, [sum(r["random"]) / len(r["random"]) for r in m["by_k"]], "s--", color="C0",
             label="random k masked (dots: draws)")  # fmt: skip
    acc.axhline(m["none"], color="k", ls=":", label="no mask")
    acc.set_xscale("log", base=2)
    acc.set_xlabel("heads masked (k)")
    acc.set_ylabel("needle accuracy")
    acc.set_ylim(-0.05, 1.05)
    acc.legend(fontsize=8)
    grid = results["heat"]
    image = heat.imshow(grid["accuracy"], vmin=0, vmax=1, cmap="viridis", aspect="auto")
    heat.set_xticks(range(len(grid["lengths"])), grid["lengths"])
    heat.set_yticks(range(len(grid["depths"])), grid["depths"])
    heat.set_xlabel("context length (tokens)")
    heat.set_ylabel("needle depth")
    fig.colorbar(image, ax=heat, label="accuracy")
    fig.tight_layout()
    return save_figure(fig, out, "retrieval.png")
