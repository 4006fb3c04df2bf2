"""One softmax gives one average: h heads against one head, and one head wider than the model.

The claim under test: a verb needs agreement with a distant subject *and* its previous token at
once, and one head cannot attend to both while ignoring an attractor noun; widening the one head
does not help, because its weights are still one distribution. The data is
:class:`headlab.training.tasks.AgreementTask`: the verb form at ``<v>`` is (stem set by the
previous token,
number set by the subject), with an attractor noun of the other number after the subject, inside
a relative clause, or before the subject.

Models, all attention-only transformers of the same d_model and depth (Elhage et al. 2021):

    heads  h heads of d_k = d_model / h                     (the multi-head layer)
    one    1 head of d_k = d_model                           (same parameters and FLOPs)
    wide   1 head of d_k = 2 · d_model                       (more parameters)

Accuracy is measured on held-out sentences (``split="test"``: subject/number/stem triples never
drawn in training), separately with and without attractors, for every depth and seed.
Papers: Vaswani et al. 2017 (multi-head attention); Linzen et al. 2016 (agreement attractors).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from headlab.attention import MultiHeadAttention
from headlab.experiments import pyplot, save_figure, write_results
from headlab.experiments.design_common import fit, spread
from headlab.files import one_thread
from headlab.measure import run_patterns
from headlab.model import ModelConfig, Transformer
from headlab.training.tasks import AgreementTask
from headlab.training.train import TrainConfig

MODELS = ("heads", "one", "wide")


@dataclass(frozen=True)
class OneVsManyConfig:
    """Sizes, training budget and evaluation of the comparison."""

    d_model: int = 32  # width of every model
    n_heads: int = 4  # h for the multi-head model
    wide_factor: int = 2  # the wide single head has d_k = wide_factor · d_model
    depths: tuple[int, ...] = (1, 2)  # layers; every model kind is trained at each depth
    steps: int = 600  # training steps per model
    batch: int = 64  # sentences per step
    lr: float = 3e-3  # peak learning rate
    test_sentences: int = 2000  # held-out sentences for the accuracies


FULL = OneVsManyConfig()
QUICK = OneVsManyConfig(depths=(1,), steps=400, test_sentences=1000)


def wide_head(d_model: int, width: int) -> MultiHeadAttention:
    """One attention head of width ``width`` (may exceed d_model) in a model of width d_model.

    W_Q, W_K, W_V map d_model → width and W_O maps width → d_model; the forward pass is
    MultiHeadAttention's own, with h = h_kv = 1 and d_k = width.
    """
    layer = MultiHeadAttention(width, 1)
    layer.W_Q, layer.W_K, layer.W_V = (nn.Linear(d_model, width) for _ in range(3))
    layer.W_O = nn.Linear(width, d_model)
    layer.d_model = d_model
    for linear in (layer.W_Q, layer.W_K, layer.W_V, layer.W_O):
        nn.init.normal_(linear.weight, std=0.02)
        nn.init.zeros_(linear.bias)
    return layer


def build(kind: str, depth: int, cfg: OneVsManyConfig, task: AgreementTask) -> Transformer:
    """A model of the given kind ("heads", "one" or "wide") and depth, freshly initialised."""
    heads = cfg.n_heads if kind == "heads" else 1
    config = ModelConfig(
        vocab_size=task.vocab_size,
        d_model=cfg.d_model,
        n_layers=depth,
        n_heads=heads,
        max_len=task.seq_len,
        attn_only=True,
    )
    model = Transformer(config)
    if kind == "wide":
        for block in model.blocks:
            block.attn = wide_head(cfg.d_model, cfg.wide_factor * cfg.d_model)
    return model


@torch.no_grad()
def accuracy(model: nn.Module, task: AgreementTask, sample: dict[str, Tensor]) -> dict[str, Any]:
    """Verb accuracy at ``<v>`` on a sample: whole form, number only, stem only; by group."""
    model.eval()
    logits = model(sample["tokens"][:, :-1])  # (B, n, V)
    rows = torch.arange(len(logits))
    pred = logits[rows, sample["slot"]].argmax(-1)  # (B,)
    base = int(task.verb(torch.tensor(0), torch.tensor(False)))
    right = pred == sample["target"]
    is_verb = (pred >= base) & (pred < base + 2 * task.n_stems)
    number = is_verb & ((pred - base) % 2 == sample["plural"].long())
    stem = is_verb & ((pred - base) // 2 == sample["stem"])
    groups = {"plain": ~sample["attractor"], "attractor": sample["attractor"]}
    groups |= {kind: sample["kind"] == i for i, kind in enumerate(task.KINDS) if i > 0}
    out: dict[str, Any] = {}
    for name, sel in groups.items():
        out[name] = {
            "accuracy": right[sel].float().mean().item(),
            "number": number[sel].float().mean().item(),
            "stem": stem[sel].float().mean().item(),
            "count": int(sel.sum()),
        }
    return out


def train_one(kind: str, depth: int, seed: int, cfg: OneVsManyConfig) -> tuple[Transformer, dict]:
    """Train one model on training sentences; return it and its held-out accuracies."""
    task = AgreementTask()
    torch.manual_seed(seed)
    model = build(kind, depth, cfg, task)
    config = TrainConfig(
        steps=cfg.steps, lr=cfg.lr, seed=seed, eval_every=0, warmup_steps=max(1, cfg.steps // 20)
    )
    result = fit(model, config, lambda g: task.batch(cfg.batch, g))
    test = task.sample(cfg.test_sentences, torch.Generator().manual_seed(50_000 + seed), "test")
    metrics = accuracy(model, task, test)
    metrics["train_loss"] = result.records("train")[-1]["loss"]
    metrics["params"] = sum(p.numel() for p in model.parameters())
    return model, metrics


@torch.no_grad()
def attention_rows(model: Transformer, tokens: Tensor, slot: int) -> list[list[list[float]]]:
    """Every layer's attention from ``<v>`` on one sentence: ``[layer][head][key position]``."""
    model.eval()
    weights = run_patterns(model, tokens[None])  # (L, 1, h, n, n)
    return [w[0, :, slot, : slot + 1].tolist() for w in weights]  # each (h, slot + 1)


def example_sentence(task: AgreementTask) -> dict[str, Tensor]:
    """One held-out sentence whose attractor comes before the subject (the hardest kind)."""
    gen = torch.Generator().manual_seed(7)
    while True:
        s = task.sample(16, gen, "test")
        hits = (s["kind"] == task.KINDS.index("preposed")).nonzero()
        if len(hits):
            i = int(hits[0])
            return {k: v[i] for k, v in s.items()}


def run(*, quick: bool = False, seeds: int = 1, seed: int = 0, out: Path | None = None) -> dict:
    """Train every model kind at every depth for each seed; write results.json and figures."""
    cfg = QUICK if quick else FULL
    task = AgreementTask()
    example = example_sentence(task)
    slot = int(example["slot"])
    t0 = time.perf_counter()
    runs: list[dict[str, Any]] = []
    attention: list[dict[str, Any]] = []
    with one_thread():
        for depth in cfg.depths:
            for kind in MODELS:
                for s in range(seed, seed + seeds):
                    model, metrics = train_one(kind, depth, s, cfg)
                    runs.append({"model": kind, "depth": depth, "seed": s, **metrics})
                    if s == seed:
                        rows = attention_rows(model, example["tokens"][:-1], slot)
                        attention.append({"model": kind, "depth": depth, "layers": rows})
    summary = summarize(runs, cfg)
    results = {
        "experiment": "one_vs_many",
        "quick": quick,
        "seeds": list(range(seed, seed + seeds)),
        "config": asdict(cfg),
        "task": asdict(task),
        "summary": summary,
        "verdict": verdicts(summary),
        "runs": runs,
        "example": {
            "tokens": [task.token_names()[i] for i in example["tokens"][: slot + 1].tolist()],
            "target": task.token_names()[int(example["target"])],
            "subject_position": int(example["subject"]),
            "attention": attention,
        },
    }
    results["figures"] = [f for f in _figures(results, out) if f]
    results["wall_seconds"] = time.perf_counter() - t0
    write_results(out, results)
    return results


def verdicts(summary: list[dict[str, Any]], margin: float = 0.1) -> list[str]:
    """One sentence per depth, from the measured attractor accuracies (means over seeds).

    The claim counts as supported at a depth when the multi-head model beats both single-head
    models on attractor sentences by more than ``margin``.
    """
    out = []
    for depth in sorted({r["depth"] for r in summary}):
        acc = {r["model"]: r["attractor"]["mean"] for r in summary if r["depth"] == depth}
        gap = acc["heads"] - max(acc["one"], acc["wide"])
        word = "supports" if gap > margin else "does not support"
        out.append(
            f"{depth} layer{'s' * (depth > 1)}: attractor accuracy {acc['heads']:.2f} with h "
            f"heads, {acc['one']:.2f} with one head, {acc['wide']:.2f} with one wider head: "
            f"{word} the claim (gap {gap:+.2f}, threshold {margin})"
        )
    return out


def summarize(runs: list[dict[str, Any]], cfg: OneVsManyConfig) -> list[dict[str, Any]]:
    """Mean and spread over seeds, per (depth, model), of every accuracy group."""
    table = []
    for depth in cfg.depths:
        for kind in MODELS:
            mine = [r for r in runs if r["model"] == kind and r["depth"] == depth]
            row: dict[str, Any] = {"model": kind, "depth": depth, "params": mine[0]["params"]}
            for group in ("plain", "attractor", "phrase", "clause", "preposed"):
                row[group] = spread([r[group]["accuracy"] for r in mine])
                row[f"{group}_number"] = spread([r[group]["number"] for r in mine])
            table.append(row)
    return table


def _figures(results: dict, out: Path | None) -> list[str | None]:
    plt = pyplot()
    summary = results["summary"]
    fig, ax = plt.subplots(figsize=(7, 4))
    labels = [f"{r['model']}\n{r['depth']} layer{'s' * (r['depth'] > 1)}" for r in summary]
    for i, group in enumerate(("plain", "attractor")):
        xs = [j + (i - 0.5) * 0.38 for j in range(len(summary))]
        ax.bar(
            xs,
            [r[group]["mean"] for r in summary],
            0.38,
            yerr=[r[group]["std"] for r in summary],
            label=group,
        )
        for x, r in zip(xs, summary, strict=True):
            ax.plot([x] * len(r[group]["values"]), r[group]["values"], "k.", markersize=3)
    ax.set_xticks(range(len(summary)), labels)
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("held-out verb accuracy")
    ax.set_title("h heads vs one head vs one wide head (mean ± sd over seeds)")
    ax.legend(loc="lower right")
    bars = save_figure(fig, out, "accuracy.png")
    return [bars, _attention_figure(results, out)]


def _attention_figure(results: dict, out: Path | None) -> str | None:
    plt = pyplot()
    ex = results["example"]
    panels = [(a, layer) for a in ex["attention"] for layer in range(len(a["layers"]))]
    fig, axes = plt.subplots(len(panels), 1, figsize=(8, 1.0 + 0.9 * len(panels)), squeeze=False)
    for ax, (a, layer) in zip(axes[:, 0], panels, strict=True):
        weights = a["layers"][layer]  # (h, n)
        ax.imshow(weights, aspect="auto", cmap="Blues", vmin=0, vmax=1)
        ax.set_yticks(range(len(weights)), [f"head {i}" for i in range(len(weights))], fontsize=6)
        ax.set_ylabel(f"{a['model']}\nL{layer}/{a['depth']}", fontsize=7)
        ax.set_xticks(range(len(ex["tokens"])), ex["tokens"], fontsize=7)
    axes[0, 0].set_title(f"attention from <v> (target {ex['target']})", fontsize=9)
    fig.tight_layout()
    return save_figure(fig, out, "attention.png")
