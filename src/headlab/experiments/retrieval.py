"""Retrieval heads: which heads copy a fact out of a long context; does masking them break it.

Wu et al. 2024 find that a few heads (< 5% score above 0.1) do the copying when a model repeats a
fact from far back in its context: masking the top-k such heads breaks needle-in-a-haystack
retrieval, masking k random heads barely does. Here the haystack is Hamlet (the shipped
public-domain corpus), the needle a line "The secret number is NNNNN." with five random digits,
put at several depths of contexts of several lengths; a question at the end asks for the number
and the model answers greedily. A head's retrieval score is Wu et al.'s rule, computed by
:func:`headlab.heads.retrieval.retrieval_scores` (the one home of the probe and the score, which
``headlab heads --probe needle`` labels with); scores are averaged over probes. Accuracy (the
whole number repeated) is then measured with the top-k heads masked, with k heads drawn at random
among the others (several draws, every one kept), and with none masked.
"""

from __future__ import annotations

import random
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from headlab.experiments import pyplot, save_figure, write_results
from headlab.files import one_thread
from headlab.heads.labels import passes
from headlab.heads.retrieval import (
    QUESTION,
    SHORT_QUESTION,
    NeedleProbe,
    answer,
    build_needle,
    groups,
    haystack,
    score_needles,
)
from headlab.model import Transformer


@dataclass(frozen=True)
class RetrievalConfig:
    model: str = "smollm2"
    # context lengths in tokens: what two shared CPU cores allow in minutes (SmolLM2 reads
    # some tens of tokens a second there; 1,024-token probes worked in a trial but cost more)
    lengths: tuple[int, ...] = (64, 128, 192, 256)
    depths: tuple[float, ...] = (0.0, 0.25, 0.5, 0.75, 1.0)  # where the needle sits
    seeds: int = 2  # probes (number, haystack offset) per length and depth
    ks: tuple[int, ...] = tuple(range(1, 17))  # heads masked: every k from 1 to 16
    draws: int = 3  # random draws of k heads per k
    mask_lengths: tuple[int, ...] = (64,)  # the masking comparison's contexts (2 cores, minutes)
    question: str = QUESTION  # the cue at the end (the quick run's model has 64 positions)


FULL = RetrievalConfig()
QUICK = RetrievalConfig(
    model="default",
    lengths=(40, 52),
    depths=(0.0, 0.5, 1.0),
    seeds=1,
    ks=(1, 2),
    draws=2,
    mask_lengths=(40,),
    question=SHORT_QUESTION,
)
# Gemma 3 270M (72 heads, a 32k window): SmolLM2's sweep with a 512-token context added (one
# thread scored three 256-token needles in 10 s, so the whole run takes minutes, not hours)
GEMMA3 = replace(FULL, model="gemma3", lengths=(64, 128, 256, 512))
MODELS = {"smollm2": FULL, "gemma3": GEMMA3}  # the models ``--model`` takes: their full configs


def config(quick: bool, model: str | None) -> RetrievalConfig:
    """The run's config: the quick one (on ``model`` when given) or ``model``'s full one.
    Raises ValueError naming the valid models for any other name."""
    if model is not None and model not in MODELS:
        raise ValueError(f"model {model!r} has no retrieval config; valid: {', '.join(MODELS)}")
    if quick:
        return QUICK if model is None else replace(QUICK, model=model)
    return MODELS[model or FULL.model]


def score_probes(model: Transformer, probes: list[NeedleProbe]) -> list[dict[str, Any]]:
    """Per probe: whether the number came back whole, and every head's retrieval score."""
    rows = score_needles(model, probes)
    for r in rows:
        r.pop("generated")
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
    model: Transformer,
    probes: list[NeedleProbe],
    ranking: list[tuple[int, int]],
    cfg: RetrievalConfig,
    seed: int,
) -> dict[str, Any]:
    """Accuracy with no mask, the top-k heads masked, and k heads drawn among the rest."""
    rng = random.Random(seed)
    others = ranking[max(cfg.ks) :]
    rows = []
    for k in cfg.ks:
        draws = [sorted(rng.sample(others, k)) for _ in range(cfg.draws)]
        rows.append(
            {
                "k": k,
                "top": accuracy(model, probes, ranking[:k]),
                "random": [accuracy(model, probes, d) for d in draws],
                "random_heads": draws,
            }
        )
    return {
        "none": accuracy(model, probes, []),
        "by_k": rows,
        "probes": len(probes),
        "lengths": list(cfg.mask_lengths),
    }


def run(
    *,
    quick: bool = False,
    seeds: int = 1,
    seed: int = 0,
    out: Path | None = None,
    model: str | None = None,
) -> dict:
    """Score every head on needle probes, then mask; write results.json and retrieval.png.
    ``seeds`` probes per length and depth (at least the config's), from ``seed``; ``model`` one
    of :data:`MODELS` (default SmolLM2, the quick run the default model)."""
    from headlab import zoo

    cfg = config(quick, model)
    t0 = time.perf_counter()
    with one_thread():
        net, tokenizer = zoo.load(cfg.model)
        hay = haystack(tokenizer)
        seed_list = range(seed, seed + max(seeds, cfg.seeds))

        def make(lengths: tuple[int, ...]) -> list[NeedleProbe]:
            return [
                build_needle(tokenizer, hay, n, d, s, cfg.question)
                for n in lengths
                for d in cfg.depths
                for s in seed_list
            ]

        rows = score_probes(net, make(cfg.lengths))
        mean = torch.stack([r.pop("scores") for r in rows]).mean(0)  # (L, h)
        order = mean.flatten().argsort(descending=True).tolist()
        h = mean.shape[1]
        ranking = [(i // h, i % h) for i in order]
        masked = masking(net, make(cfg.mask_lengths), ranking, cfg, seed)
    results = summary(cfg, quick, list(seed_list), rows, mean, ranking, masked)
    results["figures"] = [f for f in [_figure(results, out)] if f]
    results["wall_seconds"] = time.perf_counter() - t0
    write_results(out, results)
    return results


def summary(
    cfg: RetrievalConfig,
    quick: bool,
    seed_list: list[int],
    rows: list[dict[str, Any]],
    mean: Tensor,
    ranking: list[tuple[int, int]],
    masked: dict[str, Any],
) -> dict[str, Any]:
    """The results dict: scores, the share above 0.1, the heat map, masking, a verdict."""
    L, h = mean.shape
    heat = [
        [
            sum(r["correct"] for r in rows if r["length"] == n and r["depth"] == d)
            / max(1, sum(1 for r in rows if r["length"] == n and r["depth"] == d))
            for n in cfg.lengths
        ]
        for d in cfg.depths
    ]
    top = [
        {"layer": l, "head": hh, "score": round(float(mean[l, hh]), 4)} for l, hh in ranking[:16]
    ]
    results = {
        "experiment": "retrieval",
        "command": "headlab experiment retrieval"
        + (" --quick" if quick else " --ship")
        + ("" if cfg.model in (FULL.model, QUICK.model) else f" --model {cfg.model}"),
        "quick": quick,
        "model": cfg.model,
        "config": asdict(cfg),
        "seeds": seed_list,
        "rule": "Wu et al. 2024: 1/|needle| per answer token whose query's most-attended "
        "position is inside the needle and holds that token; mean over probes",
        "scores": [[round(float(x), 5) for x in row] for row in mean],
        # the labels' rule (headlab.heads.labels.passes): above 0.1, as Wu et al. count
        "share_above_0_1": sum(passes("retrieval", float(x)) for x in mean.flatten())
        / mean.numel(),
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
    lines = [
        f"{results['share_above_0_1']:.1%} of {results['heads']} heads score above 0.1; "
        f"unmasked accuracy {results['accuracy']:.2f} on the scoring probes"
    ]
    for row in m["by_k"]:
        rand = row["random"]
        lines.append(
            f"k={row['k']}: top-k masked {row['top']:.2f}, random k "
            f"{sum(rand) / len(rand):.2f} (draws {', '.join(f'{x:.2f}' for x in rand)}), "
            f"none {m['none']:.2f}"
        )
    return lines


def png(results: dict) -> bytes:
    """The run's figure as PNG bytes (the notebook view, :func:`headlab.show.retrieval_view`); empty
    when the run has nothing to draw."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        name = _figure(results, Path(tmp))
        return b"" if name is None else (Path(tmp) / name).read_bytes()


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
    acc.plot(
        ks,
        [sum(r["random"]) / len(r["random"]) for r in m["by_k"]],
        "s--",
        color="C0",
        label="random k masked (dots: draws)",
    )
    acc.axhline(m["none"], color="k", ls=":", label="no mask")
    acc.set_xticks(ks)
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
