"""Which heads can go: Michel et al. 2019 head importance, then pruning curves.

For a trained multi-layer model: the importance of every head, I_h = E_x |∂L(x)/∂ξ_h| for a head
mask ξ (normalised per layer), is computed on one set of batches; then heads are removed one at a
time, least important first, and in several random orders, re-measuring the loss on a second set
of batches after each removal. Reported: the fraction of heads that can go before the loss rises
by more than 1% and 5% (to the first crossing), the loss with half the heads gone, and the
classifier's labels (:mod:`headlab.heads`) of the heads that survive longest.

Models and losses:

    default        the shipped model, when built: next-token loss on English text written here
    minilm         all-MiniLM-L6-v2, when installed: its package ships the sentence encoder
                   without the masked-language-model head (a masked-token loss through the tied
                   embeddings alone is at chance), so the loss is the one it was trained with,
                   in-batch paraphrase ranking: cross-entropy of 20 · cos(a_i, b_j) over j for
                   each pair (a_i, b_i) of :data:`PARAPHRASES`, mean-pooled embeddings
    smollm2        SmolLM2-135M-Instruct (30 layers × 9 heads), when fetched (``headlab models
                   --fetch smollm2``): next-token loss on Twelfth Night, the Shakespeare play the
                   default model never trains on; short windows, and the curves measured after
                   every 5th head, so that it runs on a laptop CPU
    trained-here   a 2–3 layer language model of :class:`headlab.training.tasks.AgreementTask`
                   sentences, trained here per seed (next-token loss on held-out sentences);
                   the only model in ``--quick``

References: Michel, Levy and Neubig 2019 (20% of a WMT model's and 40% of BERT's heads pruned at
test time without noticeable loss); Voita et al. 2019 (38 of 48 encoder heads pruned for 0.15 BLEU).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from headlab.ablation import (
    HeadLoss,
    PruningCurve,
    head_importance,
    head_loss,
    importance_order,
    pruning_curve,
    random_order,
)
from headlab.experiments import pyplot, save_figure, write_results
from headlab.experiments.design_common import fit
from headlab.files import one_thread
from headlab.model import ModelConfig, Transformer
from headlab.training.tasks import AgreementTask, sentence_pair
from headlab.training.train import TrainConfig

# English text for the default model's loss (written for headlab; never part of its training).
EVAL_TEXT = (
    "The river was high after the rain, and the ferry waited at the bank until the water fell. "
    "She opened the letter, read it twice, and put it back in the drawer without a word. "
    "When the bell rang, the children ran out of the school and across the field to the road. "
    "He said that the bridge would be finished by spring, but nobody in the village believed it. "
    "The cat sat by the window and watched the birds that came to the garden every morning. "
    "After the storm the fishermen mended their nets and counted the boats in the harbour. "
    "The cat sat by the window and watched the birds that came to the garden every morning. "
    "A traveller asked the way to the castle, and the old woman pointed up the hill. "
    "They walked along the shore, talking about the ships, the weather and the price of bread. "
    "He said that the bridge would be finished by spring, but nobody in the village believed it."
)


@dataclass(frozen=True)
class PruneConfig:
    """The fallback model trained here (on the agreement grammar), and the evaluation sizes."""

    d_model: int = 32  # fallback model width
    n_layers: int = 3  # fallback model layers (with MLPs)
    n_heads: int = 4  # fallback model heads per layer
    steps: int = 800  # fallback model training steps
    lr: float = 3e-3  # fallback model peak learning rate
    batch: int = 64  # sentences per batch (training and evaluation)
    importance_batches: int = 8  # batches the importance is averaged over
    eval_batches: int = 8  # other batches (held-out sentences) the curves are measured on
    random_orders: int = 5  # random pruning orders (their curves are averaged)


@dataclass(frozen=True)
class LmPruneConfig:
    """The pruning run on SmolLM2 (270 heads): sized so that a CPU finishes it in minutes."""

    seq_len: int = 64  # tokens per window of held-out text
    batch: int = 2  # windows per batch
    importance_batches: int = 2  # batches the importance is averaged over
    eval_batches: int = 1  # other windows the curves are measured on
    random_orders: int = 2  # random pruning orders (their curves are averaged)
    every: int = 5  # the curves are measured after every 5th removed head, and the last
    skip: int = 2000  # tokens of the play skipped first (licence header, list of characters)


SMOLLM2 = LmPruneConfig()
FULL = PruneConfig()
QUICK = PruneConfig(n_layers=2, steps=400, importance_batches=4, eval_batches=4, random_orders=3)
MINILM_NOTE = (
    "all-MiniLM-L6-v2 ships without its masked-language-model head, so it is pruned against the "
    "paraphrase-ranking loss it was trained with (in-batch negatives, scale 20), not a "
    "masked-token loss; its unpruned loss on these pairs is near zero, which makes the relative "
    "1% and 5% thresholds very strict."
)
# Paraphrase pairs written for headlab: importance on the first half, curves on the second.
PARAPHRASES = [
    ("The train to the coast leaves at nine.", "At nine o'clock the coastal train departs."),
    ("My sister is learning to play the violin.", "The violin is what my sister is studying."),
    ("The museum is closed on Mondays.", "On Mondays you cannot visit the museum."),
    ("He forgot his umbrella and got soaked.", "Without his umbrella he was drenched by rain."),
    ("The soup needs more salt.", "This soup is not salty enough."),
    ("We planted tomatoes in the garden last spring.", "Last spring our garden got tomatoes."),
    ("The meeting was moved to Thursday afternoon.", "They put the meeting on Thursday at two."),
    ("Her laptop battery died during the flight.", "On the plane her computer ran out of power."),
    (
        "The corner bakery sells fresh bread each morning.",
        "Each morning that bakery has new loaves.",
    ),
    ("The dog barked at the postman.", "The mail carrier was barked at by the dog."),
    ("Prices at the market went up this week.", "This week the market became more expensive."),
    ("The children built a snowman in the yard.", "In the yard the kids made a snowman."),
    ("The bridge was closed for repairs.", "Repair work shut the bridge."),
    ("I could not sleep because of the noise outside.", "The racket outside kept me awake."),
    ("The library extended its opening hours.", "The library now stays open for longer."),
    ("She won the chess tournament in the final round.", "In the last round she took the title."),
    ("The printer on the second floor is out of paper.", "Upstairs the printer has no paper left."),
    ("Our flight was delayed by fog.", "Fog held up our plane."),
    ("He repainted the kitchen a pale green.", "The kitchen is now light green; he painted it."),
    ("The river froze during the cold night.", "Overnight the cold turned the river to ice."),
    ("They sold their old car to a neighbour.", "A neighbour bought their old car."),
    ("The lecture ran twenty minutes over time.", "The talk went on twenty minutes too long."),
    ("A storm knocked out power across the town.", "The whole town lost electricity in the storm."),
    ("The cat is sleeping on the warm windowsill.", "On the sunny ledge the cat is asleep."),
]


def trained_here(cfg: PruneConfig, seed: int) -> tuple[Transformer, list[Any], list[Any]]:
    """The fallback model, a language model of :class:`AgreementTask` sentences.

    It is trained to predict every next token (padding aside), so its loss, like a real language
    model's, is mostly the grammar's own uncertainty plus what attention resolves (agreement,
    clause verbs, sentence ends). Importance is measured on training sentences, the curves on
    held-out ones.
    """
    task = AgreementTask()
    torch.manual_seed(seed)
    config = ModelConfig(
        vocab_size=task.vocab_size,
        d_model=cfg.d_model,
        n_layers=cfg.n_layers,
        n_heads=cfg.n_heads,
        max_len=task.seq_len,
    )
    model = Transformer(config)
    fit(
        model,
        TrainConfig(
            steps=cfg.steps,
            lr=cfg.lr,
            seed=seed,
            eval_every=0,
            warmup_steps=max(1, cfg.steps // 20),
        ),
        lambda g: sentence_pair(task.sample(cfg.batch, g, "train")),
    )
    gen = torch.Generator().manual_seed(30_000 + seed)
    imp = [
        sentence_pair(task.sample(cfg.batch, gen, "train")) for _ in range(cfg.importance_batches)
    ]
    ev = [sentence_pair(task.sample(cfg.batch, gen, "test")) for _ in range(cfg.eval_batches)]
    return model.eval(), imp, ev


def grammar_probe(seed: int) -> Any:
    """Full-length held-out sentences (no padding) as a head-classifier probe."""
    from headlab.measure import make_probe

    task = AgreementTask()
    sample = task.sample(256, torch.Generator().manual_seed(40_000 + seed), "test")
    full = sample["tokens"][sample["tokens"][:, -1] != task.PAD][:8, :-1]  # (8, n)
    return make_probe("agreement", full, None)


def text_batches(
    tokenizer: Any, text: str, seq_len: int, batch: int
) -> list[tuple[Tensor, Tensor]]:
    """Cut tokenised text into (inputs, targets) windows of seq_len, grouped into batches."""
    ids = torch.tensor(tokenizer.encode(text))
    windows = [ids[i : i + seq_len + 1] for i in range(0, len(ids) - seq_len, seq_len // 2)]
    if not windows:
        raise ValueError(f"the evaluation text is shorter than {seq_len + 1} tokens")
    out = []
    for i in range(0, len(windows), batch):
        chunk = torch.stack(windows[i : i + batch])  # (b, seq_len + 1)
        out.append((chunk[:, :-1], chunk[:, 1:]))
    return out


def default_model() -> tuple[Transformer, Any, list[Any], list[Any]] | None:
    """The shipped model, its tokenizer, importance/eval batches of :data:`EVAL_TEXT`; or None."""
    from headlab import zoo

    info = next(i for i in zoo.list_models() if i.name == "default")
    if not info.available:
        return None
    model, tokenizer = zoo.load("default")
    seq_len = min(64, model.config.max_len)
    batches = text_batches(tokenizer, EVAL_TEXT, seq_len, 4)
    half = max(1, len(batches) // 2)
    return model.eval(), tokenizer, batches[:half], batches[half:] or batches[:half]


def minilm_model() -> tuple[Transformer, Any, list[Any], list[Any], Any] | None:
    """MiniLM, its tokenizer, importance/eval pair batches and its ranking loss; or None."""
    from headlab import zoo

    info = next((i for i in zoo.list_models() if i.name == "minilm"), None)
    if info is None or not info.available:
        return None
    model, tokenizer = zoo.load("minilm")
    half = len(PARAPHRASES) // 2
    return (
        model.eval(),
        tokenizer,
        [PARAPHRASES[:half]],
        [PARAPHRASES[half:]],
        ranking_loss(model, tokenizer),
    )


def smollm2_model(
    cfg: LmPruneConfig = SMOLLM2,
) -> tuple[Transformer, Any, list[Any], list[Any]] | None:
    """SmolLM2, its tokenizer, importance/eval batches of held-out Shakespeare; or None when it
    is not fetched (the experiment never downloads it)."""
    from headlab import smollm2, zoo
    from headlab.corpus import fetch_corpus, read_corpus
    from headlab.default_model import VALIDATION_WORK

    if not smollm2.is_fetched():
        return None
    model, tokenizer = zoo.load("smollm2")
    text = dict(read_corpus(fetch_corpus()))[VALIDATION_WORK]
    ids = torch.tensor(tokenizer.encode(text))[cfg.skip :]
    count = (cfg.importance_batches + cfg.eval_batches) * cfg.batch
    windows = ids[: count * (cfg.seq_len + 1)].view(count, cfg.seq_len + 1)  # disjoint
    batches = [(w[:, :-1], w[:, 1:]) for w in windows.split(cfg.batch)]
    return (
        model.eval(),
        tokenizer,
        batches[: cfg.importance_batches],
        batches[cfg.importance_batches :],
    )


def ranking_loss(model: Transformer, tokenizer: Any) -> Any:
    """Head loss for a sentence encoder: in-batch paraphrase ranking (scale 20, mean pooling)."""

    def embed(texts: list[str], head_mask: Tensor) -> Tensor:
        ids = [tokenizer.encode(t) for t in texts]
        n = max(map(len, ids))
        tokens = torch.zeros(len(ids), n, dtype=torch.long)
        allowed = torch.zeros(len(ids), n, dtype=torch.bool)  # False at padding
        for i, row in enumerate(ids):
            tokens[i, : len(row)], allowed[i, : len(row)] = torch.tensor(row), True
        hidden = model.hidden_states(tokens, allowed=allowed, head_mask=head_mask)  # (B, n, d)
        pooled = (hidden * allowed[..., None]).sum(1) / allowed.sum(1, keepdim=True)  # (B, d)
        return F.normalize(pooled, dim=-1)

    def loss_fn(pairs: list[tuple[str, str]], head_mask: Tensor) -> Tensor:
        a = embed([p[0] for p in pairs], head_mask)
        b = embed([p[1] for p in pairs], head_mask)
        return F.cross_entropy(20.0 * a @ b.T, torch.arange(len(pairs)))

    return loss_fn


def prune_model(
    model: Transformer,
    imp: list[Any],
    ev: list[Any],
    random_orders: int,
    seed: int,
    loss_fn: HeadLoss | None = None,
    every: int = 1,
) -> dict[str, Any]:
    """Importance, pruning curves (importance order and random orders) and surviving labels.

    ``loss_fn`` defaults to cross-entropy against the batches' targets
    (:func:`headlab.ablation.head_loss`); the curves are measured after every ``every``-th head.
    """
    L, h = model.config.n_layers, model.config.n_heads
    loss_fn = loss_fn or head_loss(model)
    importance = head_importance(loss_fn, imp, L, h)  # (L, h)
    by_importance = pruning_curve(loss_fn, ev, importance_order(importance), L, h, every)
    randoms = [
        # torch seeds are 64-bit: wrap, so a seed near 2**63 still gives a valid one
        pruning_curve(loss_fn, ev, random_order(L, h, (seed * 1000 + r) % 2**64), L, h, every)
        for r in range(random_orders)
    ]
    points = len(by_importance.losses)
    random_mean = [sum(c.losses[i] for c in randoms) / len(randoms) for i in range(points)]
    half = PruningCurve(by_importance.order, random_mean, by_importance.removed)
    tolerances = {"1%": 0.01, "5%": 0.05}
    return {
        "n_layers": L,
        "n_heads": h,
        "importance": importance.tolist(),
        "base_loss": by_importance.losses[0],
        "importance_curve": _curve(by_importance),
        "random_curves": [_curve(c) for c in randoms],
        "random_mean_losses": random_mean,
        "prunable_fraction": {
            name: {
                "importance": by_importance.prunable_fraction(tol),
                "random_mean": sum(c.prunable_fraction(tol) for c in randoms) / len(randoms),
            }
            for name, tol in tolerances.items()
        },
        "half_pruned_loss": {
            "importance": by_importance.loss_after(0.5),
            "random_mean": half.loss_after(0.5),
        },
    }


def _curve(curve: PruningCurve) -> dict[str, Any]:
    order = [f"{layer}.{head}" for layer, head in curve.order]
    return {"order": order, "losses": curve.losses, "removed": curve.counts}


def head_labels(
    model: Transformer, tokenizer: Any | None, seed: int, probe_name: str = "repeat"
) -> dict[str, str]:
    """The classifier's label of every head ("L.H" → label): for a text model on a built-in probe
    (the sentence with a repeat by default), for the grammar model on held-out sentences."""
    from headlab.heads import analyse
    from headlab.measure import build_probe

    if tokenizer is not None:
        cfg = model.config
        probe = build_probe(probe_name, tokenizer, cfg.max_len, cfg.vocab_size, seed=seed)
    else:
        probe = grammar_probe(seed)
    report = analyse(model, probe)
    return {f"{s.layer}.{s.head}": s.label for s in report.heads}


def label_positions(result: dict[str, Any], labels: dict[str, str]) -> dict[str, dict]:
    """Per label: how many heads carry it and where they fall in the importance order on
    average (0 = pruned first, 1 = pruned last), most-kept label first."""
    order = result["importance_curve"]["order"]
    where: dict[str, list[float]] = {}
    for i, name in enumerate(order):
        where.setdefault(labels.get(name, "?"), []).append(i / max(1, len(order) - 1))
    rows = {k: {"count": len(v), "mean_position": sum(v) / len(v)} for k, v in where.items()}
    return dict(sorted(rows.items(), key=lambda kv: -kv[1]["mean_position"]))


def survivors(result: dict[str, Any], labels: dict[str, str], share: float = 0.25) -> list[dict]:
    """The heads pruned last in importance order (the top ``share``), most important first."""
    order = result["importance_curve"]["order"]
    keep = max(1, round(share * len(order)))
    return [{"head": name, "label": labels.get(name, "?")} for name in reversed(order[-keep:])]


def run(*, quick: bool = False, seeds: int = 1, seed: int = 0, out: Path | None = None) -> dict:
    """Prune the shipped model (if built; not in quick mode) and a model trained here per seed."""
    from headlab import zoo

    cfg = QUICK if quick else FULL
    t0 = time.perf_counter()
    models: list[dict[str, Any]] = []
    default_info = next(i for i in zoo.list_models() if i.name == "default")
    with one_thread():
        loaded = None if quick else default_model()
        if loaded is not None:
            model, tokenizer, imp, ev = loaded
            models.append(_pruned("default", model, tokenizer, imp, ev, cfg.random_orders, seed))
        minilm = None if quick else minilm_model()
        if minilm is not None:
            model, tokenizer, imp, ev, loss_fn = minilm
            models.append(
                _pruned("minilm", model, tokenizer, imp, ev, cfg.random_orders, seed, loss_fn)
            )
        lm = None if quick else smollm2_model()
        pruned_lm = lm is not None
        if lm is not None:
            model, tokenizer, imp, ev = lm
            models.append(
                _pruned(
                    "smollm2",
                    model,
                    tokenizer,
                    imp,
                    ev,
                    SMOLLM2.random_orders,
                    seed,
                    every=SMOLLM2.every,
                )
            )
            del model, lm  # 0.5 GB: free it before the models trained here
        for s in range(seed, seed + seeds):
            model, imp, ev = trained_here(cfg, s)
            models.append(_pruned("trained-here", model, None, imp, ev, cfg.random_orders, s))
    results = {
        "experiment": "prune",
        "quick": quick,
        "seeds": list(range(seed, seed + seeds)),
        "config": asdict(cfg),
        "default_model": "pruned"
        if loaded is not None
        else ("skipped in --quick" if quick else f"not pruned: {default_info.reason}"),
        "minilm": MINILM_NOTE
        if minilm is not None
        else ("skipped in --quick" if quick else "not installed (pip install -e '.[minilm]')"),
        "smollm2": {"config": asdict(SMOLLM2), "loss": "next-token, held-out Twelfth Night"}
        if pruned_lm
        else ("skipped in --quick" if quick else "not fetched (headlab models --fetch smollm2)"),
        "summary": _summary(models),
        "verdict": verdicts(_summary(models)),
        "models": models,
        "reference": {
            "voita_2019": "38 of 48 encoder heads pruned (79%) for 0.15 BLEU (WMT EN-RU)",
            "michel_2019": "20% (WMT) to 40% (BERT) of heads pruned at test time, no notable loss",
        },
    }
    results["figures"] = [f for f in [_figure(results, out)] if f]
    results["wall_seconds"] = time.perf_counter() - t0
    write_results(out, results)
    return results


def _pruned(
    name: str,
    model: Transformer,
    tokenizer: Any,
    imp: list,
    ev: list,
    random_orders: int,
    seed: int,
    loss_fn: HeadLoss | None = None,
    every: int = 1,
) -> dict[str, Any]:
    result = prune_model(model, imp, ev, random_orders, seed, loss_fn, every)
    labels = head_labels(model, tokenizer, seed)
    out = {
        "model": name,
        "seed": seed,
        **result,
        "labels": labels,
        "survivors": survivors(result, labels),
        "label_positions": label_positions(result, labels),
    }
    if name == "smollm2":  # where its induction heads are labelled: repeated random tokens
        rr = head_labels(model, tokenizer, seed, "random-repeat")
        out["labels_random_repeat"] = rr
        out["label_positions_random_repeat"] = label_positions(result, rr)
        for row in out["survivors"]:
            row["label_random_repeat"] = rr[row["head"]]
    return out


def _summary(models: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per model name: prunable fractions and half-pruned loss, mean and spread over seeds."""
    from headlab.experiments.design_common import spread

    rows = []
    for name in dict.fromkeys(m["model"] for m in models):
        mine = [m for m in models if m["model"] == name]
        row: dict[str, Any] = {"model": name, "heads": mine[0]["n_layers"] * mine[0]["n_heads"]}
        for tol in ("1%", "5%"):
            for how in ("importance", "random_mean"):
                row[f"prunable_{tol}_{how}"] = spread(
                    [m["prunable_fraction"][tol][how] for m in mine]
                )
        for how in ("importance", "random_mean"):
            row[f"half_pruned_rel_{how}"] = spread(
                [m["half_pruned_loss"][how] / m["base_loss"] for m in mine]
            )
        rows.append(row)
    return rows


def verdicts(summary: list[dict[str, Any]]) -> list[str]:
    """One sentence per model from the measured means over seeds."""
    out = []
    for r in summary:
        frac = {
            k: r[f"prunable_{k}"]["mean"]
            for k in ("1%_importance", "1%_random_mean", "5%_importance", "5%_random_mean")
        }
        out.append(
            f"{r['model']} ({r['heads']} heads): heads prunable within 1% loss: "
            f"{frac['1%_importance']:.0%} by importance, {frac['1%_random_mean']:.0%} at random; "
            f"within 5%: {frac['5%_importance']:.0%} / {frac['5%_random_mean']:.0%}; half the "
            f"heads removed: loss ×{r['half_pruned_rel_importance']['mean']:.2f} by importance, "
            f"×{r['half_pruned_rel_random_mean']['mean']:.2f} at random"
        )
    return out


def _figure(results: dict, out: Path | None) -> str | None:
    plt = pyplot()
    shown = list({m["model"]: m for m in reversed(results["models"])}.values())
    fig, axes = plt.subplots(1, len(shown), figsize=(5.5 * len(shown), 4), squeeze=False)
    for ax, m in zip(axes[0], shown, strict=True):
        total = m["n_layers"] * m["n_heads"]
        xs = [k / total for k in m["importance_curve"].get("removed", range(total + 1))]
        base = m["base_loss"]
        for c in m["random_curves"]:
            ax.plot(xs, [v / base for v in c["losses"]], color="0.75", linewidth=0.8)
        ax.plot(xs, [v / base for v in m["random_mean_losses"]], color="0.3", label="random (mean)")
        ax.plot(
            xs,
            [v / base for v in m["importance_curve"]["losses"]],
            "o-",
            color="C0",
            markersize=3,
            label="importance order",
        )
        for tol, style in ((0.01, ":"), (0.05, "--")):
            ax.axhline(1 + tol, color="C3", linestyle=style, linewidth=0.8)
        ax.set_xlabel("fraction of heads removed")
        ax.set_ylabel("loss ÷ unpruned loss")
        ax.set_title(f"{m['model']} (seed {m['seed']}), {total} heads")
        ax.legend()
    fig.tight_layout()
    return save_figure(fig, out, "pruning.png")
