"""Attention sinks in streaming: perplexity with a full cache, a window only, and sinks + window.

Xiao et al. 2023 (StreamingLLM) keep the first s tokens and a window of the last w in the KV
cache, positions taken as cache slots (:class:`headlab.model.streaming.SinkCache`); with s = 0 a
model's perplexity jumps once the first token leaves the window, and a few sinks bring it back.
Here a long stretch of the held-out play (never trained on by the default model; ≥ 4 × the
largest window) is read token by token under each policy, for s = 0, 1, 2, 4 and a few windows,
on the default model (its trained context is 64 tokens: the stretch runs four times past it,
and the full cache with it) and on SmolLM2 where it is fetched. Beside each, every layer's sink
share on the first stretch (Gu et al. 2024: heads whose mean weight on the first token exceeds
0.3, from :func:`headlab.heads.analyse`).
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from headlab.experiments import pyplot, save_figure, write_results
from headlab.files import one_thread
from headlab.model import Transformer

VALIDATION_WORK = "twelfth_night"  # the default model's held-out play (default_model.recipe)
START = 2000  # the stretch starts this many tokens into the play (past the title matter)


@dataclass(frozen=True)
class ModelPlan:
    """What one model is measured on: the windows and sink counts, the text length."""

    name: str  # a zoo name
    windows: tuple[int, ...]
    sinks: tuple[int, ...]
    tokens: int  # length of the stretch read; ≥ 4 × the largest window
    start_token: bool  # prepend the model's start token (id 0), as it was trained


@dataclass(frozen=True)
class SinksConfig:
    plans: tuple[ModelPlan, ...]


FULL = SinksConfig(
    (
        ModelPlan("default", (8, 16, 32), (0, 1, 2, 4), 256, True),
        ModelPlan("smollm2", (32, 64, 128), (0, 1, 2, 4), 512, False),
    )
)
QUICK = SinksConfig((ModelPlan("default", (16,), (0, 4), 64, True),))


def stretch(tokenizer: Any, plan: ModelPlan) -> torch.Tensor:
    """(1, tokens) ids of the held-out play from :data:`START`, after a start token if asked."""
    from headlab.corpus import fetch_corpus, read_corpus

    text = dict(read_corpus(fetch_corpus()))[VALIDATION_WORK]
    ids = tokenizer.encode(text)[START:]
    head = [0] if plan.start_token else []
    ids = (head + ids)[: plan.tokens]
    return torch.tensor([ids])


@torch.inference_mode()
def perplexity(model: Transformer, ids: torch.Tensor, sinks: int, window: int) -> dict[str, Any]:
    """Next-token perplexity of ids (1, N) read through a sink cache: over all tokens, and over
    those read after the cache first filled (where the policies differ)."""
    logits = model(ids, cache=model.new_sink_cache(1, sinks, window))  # (1, N, V)
    nll = F.cross_entropy(logits[0, :-1].float(), ids[0, 1:], reduction="none")  # (N − 1,)
    late = nll[sinks + window :]
    return {
        "sinks": sinks,
        "window": window,
        "ppl": math.exp(float(nll.mean())),
        "ppl_after_fill": math.exp(float(late.mean())) if late.numel() else None,
    }


def sink_share(model: Transformer, tokenizer: Any, ids: torch.Tensor) -> list[dict[str, Any]]:
    """Each layer's sink share on the stretch's first tokens (within the trained context)."""
    from headlab.heads import analyse
    from headlab.measure import make_probe

    n = min(ids.shape[1], model.config.max_len, 128)
    return analyse(model, make_probe("text", ids[:, :n], tokenizer), content=False).sinks


def measure_model(plan: ModelPlan) -> dict[str, Any] | None:
    """Every policy's perplexity on one model, with its sink shares; None when not fetched."""
    from headlab import zoo

    if plan.name in zoo.FETCHABLE and not zoo.is_fetched(plan.name):
        return None  # never downloaded here: `headlab fetch smollm2` first
    t0 = time.perf_counter()
    model, tokenizer = zoo.load(plan.name)
    ids = stretch(tokenizer, plan)
    full = perplexity(model, ids, 0, ids.shape[1])
    runs = [perplexity(model, ids, s, w) for w in plan.windows for s in plan.sinks]
    return {
        "model": plan.name,
        "context": model.config.max_len,
        "tokens": ids.shape[1],
        "start_token": plan.start_token,
        "full_cache": full,
        "runs": runs,
        "sink_share": sink_share(model, tokenizer, ids),
        "seconds": time.perf_counter() - t0,
    }


def run(*, quick: bool = False, seeds: int = 1, seed: int = 0, out: Path | None = None) -> dict:
    """Measure every model of the plan; write results.json and sinks.png; return the results.
    Nothing here is random, so ``seeds`` and ``seed`` change nothing."""
    cfg = QUICK if quick else FULL
    t0 = time.perf_counter()
    with one_thread():
        models = [m for m in (measure_model(p) for p in cfg.plans) if m is not None]
    results: dict[str, Any] = {
        "experiment": "sinks",
        "quick": quick,
        "config": asdict(cfg),
        "text": f"{VALIDATION_WORK}, from token {START}",
        "models": models,
        "skipped": [p.name for p in cfg.plans if p.name not in {m["model"] for m in models}],
        "verdict": [verdict(m) for m in models],
    }
    results["figures"] = [f for f in [_figure(results, out)] if f]
    results["wall_seconds"] = time.perf_counter() - t0
    write_results(out, results)
    return results


def verdict(m: dict[str, Any]) -> str:
    """A sentence from the measured numbers: full cache, the largest window alone and with
    the most sinks."""
    w = max(r["window"] for r in m["runs"])
    at_w = [r for r in m["runs"] if r["window"] == w]
    alone = next(r for r in at_w if r["sinks"] == 0)
    best = max(at_w, key=lambda r: r["sinks"])
    return (
        f"{m['model']} over {m['tokens']} tokens (context {m['context']}): full cache "
        f"perplexity {m['full_cache']['ppl']:.1f}; window {w} alone {alone['ppl']:.1f}; "
        f"{best['sinks']} sinks + window {w} {best['ppl']:.1f}"
    )


def png(results: dict) -> bytes:
    """The run's figure as PNG bytes (the notebook view, :func:`headlab.show.sinks_view`); empty
    when the run has nothing to draw."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        name = _figure(results, Path(tmp))
        return b"" if name is None else (Path(tmp) / name).read_bytes()


def _figure(results: dict, out: Path | None) -> str | None:
    models = results["models"]
    if not models:
        return None
    plt = pyplot()
    fig, axes = plt.subplots(2, len(models), figsize=(5.5 * len(models), 7), squeeze=False)
    for col, m in enumerate(models):
        ax, share = axes[0][col], axes[1][col]
        for i, w in enumerate(sorted({r["window"] for r in m["runs"]})):
            rows = [r for r in m["runs"] if r["window"] == w]
            ax.plot(
                [r["sinks"] for r in rows],
                [r["ppl"] for r in rows],
                "o-",
                color=f"C{i}",
                label=f"window {w}",
            )
        ax.axhline(m["full_cache"]["ppl"], color="k", ls="--", label="full cache")
        ax.set_yscale("log")
        ax.set_xticks(sorted({r["sinks"] for r in m["runs"]}))
        ax.set_xlabel("sinks kept (first tokens)")
        ax.set_ylabel("perplexity (log scale)")
        ax.set_title(f"{m['model']}: {m['tokens']} tokens, context {m['context']}")
        ax.legend(fontsize=8)
        layers = m["sink_share"]
        share.bar([r["layer"] for r in layers], [r["share"] for r in layers], color="C7")
        share.set_xticks([r["layer"] for r in layers][:: max(1, len(layers) // 10)])
        share.set_xlabel("layer")
        share.set_ylabel("sink share (heads with α₁ > 0.3)")
        share.set_ylim(0, 1)
    fig.tight_layout()
    return save_figure(fig, out, "sinks.png")
