"""Sharing key/value heads: KV-cache bytes, decode speed and quality of MHA, GQA and MQA.

For one model size and h_kv in {h, h/2, h/4, 1}:

1. KV-cache bytes of real caches after a decode, against the shape calculator's figure
   (``headlab.shapes.trace_shapes``) and the formula 2 · L · B · h_kv · s · d_k · bytes.
2. Decode throughput with the cache (tokens/s) at context lengths 256 … 4096, as ratios to MHA
   measured in the same run: every repeat times all variants back to back, and the median of the
   repeats is reported, so load from other processes hits every variant alike.
2b. With SmolLM2-135M fetched (``headlab models --fetch smollm2``): its decode speed with its 3
   K/V heads against the same weights with every K/V head copied for its 3 query heads (9 K/V
   heads, :func:`expand_kv_heads`: the same function, 3× the cache), tokens/s and cache bytes
   at contexts up to its 8192 positions, interleaved repeats, medians.
3. Quality: an MHA language model of the agreement grammar's sentences
   (:class:`headlab.training.tasks.AgreementTask`) is converted to GQA by mean-pooling
   the K/V heads of each group (Ainslie et al. 2023, "GQA: Training Generalized Multi-Query
   Transformer Models from Multi-Head Checkpoints"), evaluated right after the conversion and after
   continued training for 5% of the original steps, against GQA trained from scratch; the loss is
   next-token cross-entropy on held-out sentences.

Shapes: the cache of one layer is (B, h_kv, s, d_k) for keys and the same for values.
Papers: Shazeer 2019 (MQA); Ainslie et al. 2023 (GQA).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from headlab.attention import KVCache, MultiHeadAttention
from headlab.experiments import pyplot, save_figure, write_results
from headlab.experiments.design_common import fit, mean_loss, spread
from headlab.files import one_thread
from headlab.model import ModelConfig, SkipInit, Transformer
from headlab.shapes import trace_shapes
from headlab.training.tasks import AgreementTask, sentence_pair
from headlab.training.train import TrainConfig


@dataclass(frozen=True)
class GqaConfig:
    """Sizes of the speed part (a stack of attention layers) and of the quality part."""

    d_model: int = 256  # speed: model width
    n_heads: int = 8  # h, query heads (both parts)
    n_layers: int = 4  # speed: attention layers, each with its own cache
    batch: int = 4  # speed: sequences decoded together
    contexts: tuple[int, ...] = (256, 512, 1024, 2048, 4096)  # cached positions before decoding
    decode_tokens: int = 16  # new tokens timed per measurement
    repeats: int = 5  # measurements per variant; the median is reported
    q_d_model: int = 64  # quality: model width (2-layer attention-only)
    q_steps: int = 800  # quality: training steps of the MHA model and of each scratch model
    q_lr: float = 3e-3  # quality: peak learning rate
    q_batch: int = 64  # quality: sentences per step
    eval_batches: int = 8  # quality: fixed validation batches


FULL = GqaConfig()
QUICK = GqaConfig(
    d_model=128,
    n_layers=2,
    batch=2,
    contexts=(256, 1024),
    decode_tokens=8,
    repeats=3,
    q_d_model=32,
    q_steps=200,
    eval_batches=4,
)


def kv_variants(n_heads: int) -> list[int]:
    """h_kv in {h, h/2, h/4, 1}, the divisors that exist, largest first."""
    return sorted({k for k in (n_heads, n_heads // 2, n_heads // 4, 1) if k >= 1}, reverse=True)


# ---------------------------------------------------------------------------------------------
# 1) and 2): cache bytes and decode throughput
# ---------------------------------------------------------------------------------------------


def decode_stack(cfg: GqaConfig, n_kv_heads: int, seed: int = 0) -> nn.ModuleList:
    """``n_layers`` MultiHeadAttention layers with h_kv key/value heads, seeded weights."""
    torch.manual_seed(seed)
    layers = [MultiHeadAttention(cfg.d_model, cfg.n_heads, n_kv_heads) for _ in range(cfg.n_layers)]
    return nn.ModuleList(layers).eval()


@torch.no_grad()
def timed_decode(
    layers: nn.ModuleList, batch: int, context: int, tokens: int
) -> tuple[float, list[KVCache]]:
    """Seconds to decode ``tokens`` new positions after ``context`` cached ones; and the caches.

    The caches are pre-filled with random keys and values (their content does not change the
    arithmetic); each new token goes through every layer with a residual and a layer norm.
    """
    attns = [layer for layer in layers if isinstance(layer, MultiHeadAttention)]
    d_model, h_kv, d_k = attns[0].d_model, attns[0].n_kv_heads, attns[0].d_k
    caches = [layer.new_cache(batch, context + tokens) for layer in attns]
    for cache in caches:
        cache.append(torch.randn(batch, h_kv, context, d_k), torch.randn(batch, h_kv, context, d_k))
    x = torch.randn(batch, 1, d_model)  # (B, 1, d_model)
    t0 = time.perf_counter()
    for _ in range(tokens):
        for layer, cache in zip(attns, caches, strict=True):
            x = F.layer_norm(x + layer(x, causal=True, cache=cache), (d_model,))
    return time.perf_counter() - t0, caches


def cache_bytes(cfg: GqaConfig, n_kv_heads: int, s: int, caches: list[KVCache]) -> dict[str, int]:
    """The KV-cache bytes three ways: held by the real caches, the calculator, the formula."""
    d_k = cfg.d_model // cfg.n_heads
    report = trace_shapes(cfg.d_model, cfg.n_heads, 1, cfg.batch, n_kv_heads, cache_len=s - 1)
    return {
        "measured": sum(c.nbytes for c in caches),
        "calculator": int(report.to_dict()["kv_cache_bytes"]) * cfg.n_layers,
        "formula": 2 * cfg.n_layers * cfg.batch * n_kv_heads * s * d_k * 4,
    }


def measure_decode(cfg: GqaConfig) -> dict[str, Any]:
    """Cache bytes and median decode tokens/s for every h_kv and context; ratios to MHA."""
    variants = kv_variants(cfg.n_heads)
    stacks = {k: decode_stack(cfg, k) for k in variants}
    rows: list[dict[str, Any]] = []
    kv_rows: list[dict[str, Any]] = []
    for context in cfg.contexts:
        times: dict[int, list[float]] = {k: [] for k in variants}
        timed_decode(stacks[variants[0]], cfg.batch, context, 2)  # warm-up
        for _ in range(cfg.repeats):
            for k in variants:  # interleaved, so outside load falls on every variant alike
                seconds, caches = timed_decode(stacks[k], cfg.batch, context, cfg.decode_tokens)
                times[k].append(seconds)
                if len(times[k]) == 1 and context == cfg.contexts[-1]:
                    s = context + cfg.decode_tokens
                    kv_rows.append({"n_kv_heads": k, "s": s, **cache_bytes(cfg, k, s, caches)})
        tps = {k: cfg.batch * cfg.decode_tokens / statistics.median(times[k]) for k in variants}
        for k in variants:
            rows.append(
                {
                    "context": context,
                    "n_kv_heads": k,
                    "tokens_per_s": tps[k],
                    "ratio_vs_mha": tps[k] / tps[cfg.n_heads],
                }
            )
    mha = next(r["measured"] for r in kv_rows if r["n_kv_heads"] == cfg.n_heads)
    for r in kv_rows:
        r["shrink_vs_mha"] = mha / r["measured"]
    return {"kv_cache": kv_rows, "decode": rows}


@dataclass(frozen=True)
class LmDecodeConfig:
    """SmolLM2's decode timing: cached positions, batch, timed tokens, repeats."""

    contexts: tuple[int, ...] = (512, 2048, 8176)  # cached positions (8176 + 16 = its 8192)
    batch: int = 1  # sequences decoded together
    decode_tokens: int = 16  # new tokens timed per measurement
    repeats: int = 5  # measurements per variant; the median is reported


SMOLLM2 = LmDecodeConfig()


@torch.no_grad()
def timed_lm_decode(
    model: Transformer, batch: int, context: int, tokens: int, base_kv: int = 3, seed: int = 0
) -> tuple[float, list[KVCache], list[int]]:
    """Seconds for ``model`` to decode ``tokens`` greedy tokens after ``context`` cached ones;
    the caches; the tokens of sequence 0.

    The caches are filled with seeded random keys/values for ``base_kv`` K/V heads (the
    arithmetic does not depend on their content), each copied for its query heads when the
    model has more, so a model and its :func:`expand_kv_heads` copy decode the same tokens.
    """
    cfg = model.config
    copies = (cfg.n_kv_heads or cfg.n_heads) // base_kv
    g = torch.Generator().manual_seed(seed)
    caches = model.new_cache(batch, context + tokens)
    for cache in caches:
        k, v = (torch.randn(batch, base_kv, context, cfg.d_k, generator=g) for _ in range(2))
        cache.append(k.repeat_interleave(copies, 1), v.repeat_interleave(copies, 1))
    x = torch.zeros(batch, 1, dtype=torch.long)  # (B, 1)
    out = []
    t0 = time.perf_counter()
    for _ in range(tokens):
        x = model(x, cache=caches)[:, -1].argmax(-1, keepdim=True)  # (B, 1)
        out.append(int(x[0, 0]))
    return time.perf_counter() - t0, caches, out


def smollm2_decode(cfg: LmDecodeConfig = SMOLLM2) -> dict[str, Any] | None:
    """SmolLM2 with 3 K/V heads against the same weights with 9: median tokens/s per context,
    their ratio, and the cache bytes three ways; None when SmolLM2 is not fetched."""
    from headlab import smollm2, zoo

    if not smollm2.is_fetched():
        return None
    model, _ = zoo.load("smollm2")
    variants = {3: model, 9: expand_kv_heads(model, 9)}
    rows, kv_rows, same = [], [], True
    for context in cfg.contexts:
        times: dict[int, list[float]] = {k: [] for k in variants}
        held: dict[int, int] = {}
        for _ in range(cfg.repeats):
            decoded = []
            for k, m in variants.items():  # interleaved: outside load hits both alike
                seconds, caches, out = timed_lm_decode(m, cfg.batch, context, cfg.decode_tokens)
                times[k].append(seconds)
                decoded.append(out)
                held[k] = sum(c.nbytes for c in caches)
                del caches  # up to 1.1 GiB at the longest context
            same = same and decoded[0] == decoded[1]
        s = context + cfg.decode_tokens
        for k, m in variants.items():
            tps = cfg.batch * cfg.decode_tokens / statistics.median(times[k])
            rows.append({"context": context, "n_kv_heads": k, "tokens_per_s": tps})
            kv_rows.append(
                {
                    "context": context,
                    "n_kv_heads": k,
                    "s": s,
                    "measured": held[k],
                    **lm_cache_bytes(m, cfg.batch, s),
                }
            )
        rows[-2]["ratio_vs_9"] = rows[-2]["tokens_per_s"] / rows[-1]["tokens_per_s"]
    return {"config": asdict(cfg), "decode": rows, "kv_cache": kv_rows, "same_tokens": same}


def lm_cache_bytes(model: Transformer, batch: int, s: int) -> dict[str, int]:
    """A model's KV-cache bytes for ``s`` positions as the calculator says (one layer's, times
    L) and as the formula 2 · L · B · h_kv · s · d_k · 4 bytes says."""
    cfg = model.config
    h_kv = cfg.n_kv_heads or cfg.n_heads
    layer = trace_shapes(cfg.d_model, cfg.n_heads, 1, batch, h_kv, cfg.bias, cache_len=s - 1)
    return {
        "calculator": int(layer.to_dict()["kv_cache_bytes"]) * cfg.n_layers,
        "formula": 2 * cfg.n_layers * batch * h_kv * s * cfg.d_k * 4,
    }


# ---------------------------------------------------------------------------------------------
# 3): quality after mean-pooling conversion, continued training, and from scratch
# ---------------------------------------------------------------------------------------------


def pool_kv_heads(model: Transformer, n_kv_heads: int) -> Transformer:
    """A copy of ``model`` with each group of h/h_kv key/value heads mean-pooled into one.

    W_K and W_V (h·d_k, d_model) become (h_kv·d_k, d_model): the rows of the g = h/h_kv heads
    of a group are averaged (Ainslie et al. 2023, section 2.1); biases alike. Everything else is
    copied unchanged. Query head i uses key/value head i // g, as :func:`repeat_kv` arranges.
    """
    cfg = model.config
    h = cfg.n_heads
    if n_kv_heads < 1 or h % n_kv_heads:
        raise ValueError(f"n_kv_heads must divide n_heads={h}; got {n_kv_heads}")
    g, d_k = h // n_kv_heads, cfg.d_k
    pooled = Transformer(replace(cfg, n_kv_heads=n_kv_heads))
    state = {}
    for name, tensor in model.state_dict().items():
        if ".attn.W_K." in name or ".attn.W_V." in name:
            grouped = tensor.reshape(n_kv_heads, g, d_k, *tensor.shape[1:])  # (h_kv, g, d_k, …)
            tensor = grouped.mean(dim=1).reshape(n_kv_heads * d_k, *tensor.shape[1:])
        state[name] = tensor
    pooled.load_state_dict(state)
    return pooled


def expand_kv_heads(model: Transformer, n_kv_heads: int) -> Transformer:
    """A copy of ``model`` with each key/value head repeated, h_kv → ``n_kv_heads`` heads.

    The inverse direction of :func:`pool_kv_heads`, and exact: query head i used K/V head
    i // (h/h_kv) and now uses a copy of it, so the logits are unchanged while the KV cache
    grows n_kv_heads / h_kv times. ``n_kv_heads = h`` turns a GQA model into the MHA model it
    computes the same function as.
    """
    cfg = model.config
    h, h_kv = cfg.n_heads, cfg.n_kv_heads or cfg.n_heads
    if n_kv_heads % h_kv or h % n_kv_heads:
        raise ValueError(
            f"n_kv_heads must be a multiple of h_kv={h_kv} that divides h={h}; got {n_kv_heads}"
        )
    r, d_k = n_kv_heads // h_kv, cfg.d_k
    with SkipInit():  # every weight is copied below
        wide = Transformer(replace(cfg, n_kv_heads=n_kv_heads))
    state = {}
    for name, tensor in model.state_dict().items():
        if ".attn.W_K." in name or ".attn.W_V." in name:
            heads = tensor.reshape(h_kv, d_k, *tensor.shape[1:])  # (h_kv, d_k, …)
            tensor = heads.repeat_interleave(r, dim=0).reshape(n_kv_heads * d_k, *tensor.shape[1:])
        state[name] = tensor
    wide.load_state_dict(state)
    return wide.eval()


def _quality_model(cfg: GqaConfig, n_kv_heads: int) -> Transformer:
    task = AgreementTask()
    config = ModelConfig(
        vocab_size=task.vocab_size,
        d_model=cfg.q_d_model,
        n_layers=2,
        n_heads=cfg.n_heads,
        n_kv_heads=n_kv_heads,
        max_len=task.seq_len,
        attn_only=True,
    )
    return Transformer(config)


def quality_seed(cfg: GqaConfig, seed: int) -> dict[str, Any]:
    """One seed: validation loss of MHA, converted, uptrained and scratch models per h_kv."""
    task = AgreementTask()
    gen = torch.Generator().manual_seed(10_000 + seed)  # held-out sentences, never trained on
    val = [sentence_pair(task.sample(cfg.q_batch, gen, "test")) for _ in range(cfg.eval_batches)]

    def batches(g: torch.Generator) -> Any:
        return sentence_pair(task.sample(cfg.q_batch, g, "train"))

    train_cfg = TrainConfig(
        steps=cfg.q_steps,
        lr=cfg.q_lr,
        seed=seed,
        eval_every=0,
        warmup_steps=max(1, cfg.q_steps // 20),
    )
    up_steps = max(1, round(0.05 * cfg.q_steps))
    up_cfg = replace(train_cfg, steps=up_steps, warmup_steps=max(1, up_steps // 10))
    torch.manual_seed(seed)
    mha = _quality_model(cfg, cfg.n_heads)
    fit(mha, train_cfg, batches)
    out: dict[str, Any] = {"mha": mean_loss(mha, val), "by_kv": {}}
    for k in kv_variants(cfg.n_heads)[1:]:
        converted = pool_kv_heads(mha, k)
        row = {"converted": mean_loss(converted, val)}
        fit(converted, replace(up_cfg, seed=seed + 1), batches)
        row["uptrained"] = mean_loss(converted, val)
        torch.manual_seed(seed)
        scratch = _quality_model(cfg, k)
        fit(scratch, train_cfg, batches)
        row["scratch"] = mean_loss(scratch, val)
        out["by_kv"][k] = row
    return out


# ---------------------------------------------------------------------------------------------
# The experiment
# ---------------------------------------------------------------------------------------------


def run(*, quick: bool = False, seeds: int = 1, seed: int = 0, out: Path | None = None) -> dict:
    """Run all three parts; write ``results.json`` and figures into ``out``; return the results."""
    cfg = QUICK if quick else FULL
    t0 = time.perf_counter()
    with one_thread():
        speed = measure_decode(cfg)
        lm = None if quick else smollm2_decode()
        per_seed = [quality_seed(cfg, seed + i) for i in range(seeds)]
    quality: dict[str, Any] = {
        "steps": cfg.q_steps,
        "uptrain_steps": max(1, round(0.05 * cfg.q_steps)),
        "mha": spread([r["mha"] for r in per_seed]),
        "by_kv": [
            {
                "n_kv_heads": k,
                **{
                    part: spread([r["by_kv"][k][part] for r in per_seed])
                    for part in ("converted", "uptrained", "scratch")
                },
            }
            for k in kv_variants(cfg.n_heads)[1:]
        ],
    }
    results = {
        "experiment": "gqa",
        "quick": quick,
        "seeds": [seed + i for i in range(seeds)],
        "config": asdict(cfg),
        "threads": 1,
        **speed,
        "smollm2": lm
        if lm is not None
        else ("skipped in --quick" if quick else "not fetched (headlab models --fetch smollm2)"),
        "quality": quality,
        "verdict": verdicts(speed, quality) + lm_verdicts(lm),
        "reference": {
            "paper": "Ainslie et al. 2023, GQA; Shazeer 2019, MQA",
            "t5_xxl": {"MHA": [1.51, 47.2], "GQA-8": [0.28, 47.1], "MQA": [0.24, 46.6]},
            "t5_xxl_columns": ["inference seconds per sample", "average quality"],
        },
    }
    results["figures"] = [f for f in _figures(results, out) if f]
    results["wall_seconds"] = time.perf_counter() - t0
    write_results(out, results)
    return results


def verdicts(speed: dict[str, Any], quality: dict[str, Any]) -> list[str]:
    """Sentences from the measurements: cache bytes, decode ratios at the longest context, loss."""
    kv = speed["kv_cache"]
    same = all(r["measured"] == r["calculator"] == r["formula"] for r in kv)
    shrink = ", ".join(f"h_kv={r['n_kv_heads']}: ÷{r['shrink_vs_mha']:g}" for r in kv)
    longest = max(r["context"] for r in speed["decode"])
    ratios = ", ".join(
        f"h_kv={r['n_kv_heads']}: ×{r['ratio_vs_mha']:.2f}"
        for r in speed["decode"]
        if r["context"] == longest
    )
    out = [
        f"KV cache {'equals' if same else 'DIFFERS FROM'} the calculator's bytes; {shrink}",
        f"decode tokens/s vs MHA at context {longest}: {ratios}",
    ]
    for r in quality["by_kv"]:
        out.append(
            f"h_kv={r['n_kv_heads']}: loss {r['converted']['mean']:.3f} right after pooling, "
            f"{r['uptrained']['mean']:.3f} after 5% uptraining, {r['scratch']['mean']:.3f} from "
            f"scratch (MHA {quality['mha']['mean']:.3f})"
        )
    return out


def lm_verdicts(lm: dict[str, Any] | None) -> list[str]:
    """Sentences from SmolLM2's decode run (none when it did not run)."""
    if lm is None:
        return []
    ratios = ", ".join(
        f"{r['context']}: ×{r['ratio_vs_9']:.2f}" for r in lm["decode"] if "ratio_vs_9" in r
    )
    big = max(lm["kv_cache"], key=lambda r: (r["context"], r["n_kv_heads"]))
    small = next(r for r in lm["kv_cache"] if r["context"] == big["context"] and r is not big)
    agree = all(r["measured"] == r["calculator"] == r["formula"] for r in lm["kv_cache"])
    return [
        f"SmolLM2 decode tokens/s, 3 K/V heads vs the same weights with 9, by context: {ratios}; "
        f"cache at {big['s']} positions {small['measured'] / 2**20:.0f} MiB vs "
        f"{big['measured'] / 2**20:.0f} MiB ({'equal to' if agree else 'DIFFERENT FROM'} the "
        f"calculator); same tokens decoded: {lm['same_tokens']}"
    ]


def _figures(results: dict, out: Path | None) -> list[str | None]:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    for k in sorted({r["n_kv_heads"] for r in results["decode"]}, reverse=True):
        rows = [r for r in results["decode"] if r["n_kv_heads"] == k]
        ax.plot(
            [r["context"] for r in rows],
            [r["ratio_vs_mha"] for r in rows],
            "o-",
            label=f"h_kv = {k}",
        )
    ax.set_xscale("log", base=2)
    ax.set_xlabel("context length (cached positions)")
    ax.set_ylabel("decode tokens/s ÷ MHA (same run, medians)")
    ax.set_title("Decode throughput with a KV cache")
    ax.legend()
    speed = save_figure(fig, out, "decode_throughput.png")
    fig, ax = plt.subplots(figsize=(6, 4))
    q = results["quality"]
    labels = [f"h_kv={r['n_kv_heads']}" for r in q["by_kv"]]
    for i, part in enumerate(("converted", "uptrained", "scratch")):
        xs = [j + (i - 1) * 0.25 for j in range(len(labels))]
        ax.bar(
            xs,
            [r[part]["mean"] for r in q["by_kv"]],
            0.25,
            yerr=[r[part]["std"] for r in q["by_kv"]],
            label=part,
        )
    ax.axhline(q["mha"]["mean"], color="k", linestyle="--", label="MHA")
    ax.set_xticks(range(len(labels)), labels)
    ax.set_ylabel("validation loss")
    ax.set_title("Mean-pooled conversion, 5% uptraining, and scratch")
    ax.legend()
    return [speed, save_figure(fig, out, "quality.png")]
