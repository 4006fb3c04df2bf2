"""How many heads: at fixed d_model, sweep h from 1 to d_model (d_k from d_model down to 1).

Parameters and FLOPs stay the same for every h (W_Q, W_K, W_V, W_O are d_model × d_model
whatever the split); only how the width is cut into heads changes. The task is language
modelling of the sentences of :class:`headlab.training.tasks.AgreementTask` (next-token loss over
whole
sentences, measured on held-out ones): most of its loss is the grammar's own randomness, and the
part that attention resolves is the verb, which needs the subject's number past an attractor and
the stem from the previous token; so the verb's loss and accuracy are reported too.
(Random-token copying was tried first: with learned positions and 1,000–3,000 steps the
copy loss stayed far above zero for every h, so it could not tell head counts apart.)
Reference: Vaswani et al. 2017, Table 3 rows (A) — single-head and 32-head models both worse
than 8 or 16 heads at d_model = 512.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from headlab.attention import valid_head_counts
from headlab.experiments import pyplot, save_figure, write_results
from headlab.experiments.design_common import fit, spread
from headlab.files import one_thread
from headlab.model import ModelConfig, Transformer
from headlab.training.tasks import AgreementTask, sentence_pair
from headlab.training.train import TrainConfig

VASWANI_TABLE3_A = [  # (h, d_k, dev PPL, dev BLEU), d_model = 512, newstest2013
    (1, 512, 5.29, 24.9),
    (4, 128, 5.00, 25.5),
    (8, 64, 4.92, 25.8),
    (16, 32, 4.91, 25.8),
    (32, 16, 5.01, 25.4),
]


@dataclass(frozen=True)
class HeadCountConfig:
    """Model, data and training budget of the sweep."""

    d_model: int = 32  # fixed width; h runs over its power-of-two divisors, 1 … d_model
    n_layers: int = 2  # attention-only layers
    steps: int = 800  # training steps per model
    batch: int = 64  # sentences per step
    lr: float = 3e-3  # peak learning rate
    eval_batches: int = 8  # batches of held-out sentences (test split, own generator)
    head_counts: tuple[int, ...] = ()  # empty = every power of two up to d_model


FULL = HeadCountConfig()
QUICK = HeadCountConfig(d_model=16, steps=300, eval_batches=4, head_counts=(1, 4, 16))


def head_counts(cfg: HeadCountConfig) -> list[int]:
    """The h values of the sweep: powers of two dividing d_model, down to d_k = 1."""
    if cfg.head_counts:
        return list(cfg.head_counts)
    return [h for h in valid_head_counts(cfg.d_model) if h & (h - 1) == 0]


@torch.no_grad()
def held_out_loss(model: nn.Module, samples: list[dict[str, Tensor]]) -> dict[str, float]:
    """Next-token loss over whole sentences; the verb's loss; verb accuracy, all and attractor."""
    model.eval()
    total, count, verb_loss, right, attr_right, verbs, attrs = 0.0, 0, 0.0, 0, 0, 0, 0
    for sample in samples:
        inputs, targets = sentence_pair(sample)
        logits = model(inputs)  # (B, n, V)
        loss = F.cross_entropy(
            logits.flatten(0, 1), targets.flatten(), ignore_index=-100, reduction="sum"
        )
        total, count = total + float(loss), count + int((targets != -100).sum())
        at_slot = logits[torch.arange(len(inputs)), sample["slot"]]  # (B, V)
        verb_loss += float(F.cross_entropy(at_slot, sample["target"], reduction="sum"))
        hit = at_slot.argmax(-1) == sample["target"]
        right, verbs = right + int(hit.sum()), verbs + len(hit)
        attr_right += int(hit[sample["attractor"]].sum())
        attrs += int(sample["attractor"].sum())
    return {
        "val_loss": total / count,
        "verb_loss": verb_loss / verbs,
        "verb_accuracy": right / verbs,
        "attractor_accuracy": attr_right / max(attrs, 1),
    }


def train_one(h: int, seed: int, cfg: HeadCountConfig) -> dict[str, Any]:
    """Train a model with h heads per layer; return its held-out losses and accuracies."""
    task = AgreementTask()
    gen = torch.Generator().manual_seed(20_000 + seed)
    val = [task.sample(cfg.batch, gen, "test") for _ in range(cfg.eval_batches)]
    torch.manual_seed(seed)
    config = ModelConfig(
        vocab_size=task.vocab_size,
        d_model=cfg.d_model,
        n_layers=cfg.n_layers,
        n_heads=h,
        max_len=task.seq_len,
        attn_only=True,
    )
    model = Transformer(config)
    train_cfg = TrainConfig(
        steps=cfg.steps, lr=cfg.lr, seed=seed, eval_every=0, warmup_steps=max(1, cfg.steps // 20)
    )
    result = fit(model, train_cfg, lambda g: sentence_pair(task.sample(cfg.batch, g, "train")))
    return {
        "h": h,
        "d_k": cfg.d_model // h,
        "seed": seed,
        "params": sum(p.numel() for p in model.parameters()),
        "train_loss": result.records("train")[-1]["loss"],
        **held_out_loss(model, val),
    }


METRICS = ("val_loss", "verb_loss", "verb_accuracy", "attractor_accuracy")


def run(*, quick: bool = False, seeds: int = 1, seed: int = 0, out: Path | None = None) -> dict:
    """Sweep h for every seed; write results.json and a figure; return the results."""
    cfg = QUICK if quick else FULL
    t0 = time.perf_counter()
    with one_thread():
        runs = [train_one(h, s, cfg) for h in head_counts(cfg) for s in range(seed, seed + seeds)]
    summary = []
    for h in head_counts(cfg):
        mine = [r for r in runs if r["h"] == h]
        row: dict[str, Any] = {"h": h, "d_k": cfg.d_model // h, "params": mine[0]["params"]}
        for key in METRICS:
            row[key] = spread([r[key] for r in mine])
        summary.append(row)
    best = min(summary, key=lambda r: r["val_loss"]["mean"])
    results = {
        "experiment": "head_count",
        "quick": quick,
        "seeds": list(range(seed, seed + seeds)),
        "config": asdict(cfg),
        "uniform_loss": math.log(AgreementTask().vocab_size),
        "summary": summary,
        "best_h": best["h"],
        "verdict": verdicts(summary),
        "runs": runs,
        "reference": {
            "paper": "Vaswani et al. 2017, Table 3 rows (A), d_model 512, newstest2013 dev",
            "columns": ["h", "d_k", "PPL", "BLEU"],
            "rows": VASWANI_TABLE3_A,
        },
    }
    results["figures"] = [f for f in [_figure(results, out)] if f]
    results["wall_seconds"] = time.perf_counter() - t0
    write_results(out, results)
    return results


def verdicts(summary: list[dict[str, Any]]) -> list[str]:
    """Sentences from the measured means: h = 1, the best h, and the most heads (smallest d_k)."""
    first, last = summary[0], summary[-1]
    best = min(summary, key=lambda r: r["val_loss"]["mean"])
    out = []
    for label, r in (("one head", first), ("best", best), ("most heads", last)):
        out.append(
            f"{label}: h={r['h']} (d_k={r['d_k']}) held-out loss {r['val_loss']['mean']:.3f} "
            f"± {r['val_loss']['std']:.3f}, verb accuracy {r['verb_accuracy']['mean']:.2f}"
        )
    return out


def _figure(results: dict, out: Path | None) -> str | None:
    plt = pyplot()
    fig, (ax, ref) = plt.subplots(1, 2, figsize=(10, 4))
    summary = results["summary"]
    hs = [r["h"] for r in summary]
    for key, label in (("val_loss", "all tokens"), ("verb_loss", "the verb")):
        means = [r[key]["mean"] for r in summary]
        ax.errorbar(hs, means, yerr=[r[key]["std"] for r in summary], marker="o", label=label)
        for h, r in zip(hs, summary, strict=True):
            ax.plot([h] * len(r[key]["values"]), r[key]["values"], "k.", markersize=3)
    ax.set_xscale("log", base=2)
    ax.set_xticks(hs, [f"{h}\nd_k={r['d_k']}" for h, r in zip(hs, summary, strict=True)])
    ax.set_ylabel("held-out loss (nats)")
    ax.set_title(f"headlab: d_model={results['config']['d_model']}, mean ± sd over seeds")
    ax.legend()
    rows = results["reference"]["rows"]
    ref.plot([r[0] for r in rows], [r[3] for r in rows], "s-", color="C3")
    ref.set_xscale("log", base=2)
    ref.set_xticks([r[0] for r in rows], [f"{r[0]}\nd_k={r[1]}" for r in rows])
    ref.set_ylabel("BLEU (higher is better)")
    ref.set_title("Vaswani et al. 2017, Table 3 (A)")
    fig.tight_layout()
    return save_figure(fig, out, "head_count.png")
