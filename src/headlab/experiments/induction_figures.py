"""The induction experiment's figures, drawn from a :func:`headlab.experiments.induction.run_seed`
result: the losses and the phase change, each head's induction score over training, and the
attention patterns of the induction head and its previous-token partner.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from headlab.experiments import pyplot, save_figure
from headlab.experiments.induction_ablation import parse_head
from headlab.measure import run_patterns


def figures(r: dict[str, Any], out: Path) -> list[str]:
    """The figures' file names in ``out``: loss.png, head_scores.png and, when an induction head
    formed, patterns.png."""
    names = [_loss_figure(r, out), _scores_figure(r, out), _pattern_figure(r, out)]
    return [n for n in names if n]


def _shade(ax: Any, r: dict[str, Any]) -> None:
    lo, hi = r["phase_change"]["window"]
    ax.axvspan(lo, hi, color="tab:orange", alpha=0.15, label="phase change")


def _loss_figure(r: dict[str, Any], out: Path) -> str | None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    train_recs = [x for x in r["history"] if x["kind"] == "train"]
    evals = [x for x in r["history"] if x["kind"] == "eval"]
    control = [x for x in r["control_history"] if x["kind"] == "eval"]
    ax.plot([x["step"] for x in train_recs], [x["loss"] for x in train_recs], label="train loss")
    for key, style in (("first_copy_loss", "--"), ("repeated_loss", "-")):
        ax.plot([x["step"] for x in evals], [x[key] for x in evals], style, label=f"2-layer {key}")
    ax.plot(
        [x["step"] for x in control],
        [x["repeated_loss"] for x in control],
        ":",
        label="1-layer repeated_loss",
    )
    _shade(ax, r)
    ax.set(xlabel="step", ylabel="loss (nats)", title="Repeated-token loss and the phase change")
    ax.legend(fontsize=8)
    return save_figure(fig, out, "loss.png")


def _scores_figure(r: dict[str, Any], out: Path) -> str | None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    evals = [x for x in r["history"] if x["kind"] == "eval"]
    steps = [x["step"] for x in evals]
    for layer, scores in enumerate(evals[-1]["induction"]):
        for head in range(len(scores)):
            ax.plot(steps, [x["induction"][layer][head] for x in evals], label=f"{layer}.{head}")
    feeders = [f["head"] for f in r["feeder_heads"]][:3]
    for name, style in zip(feeders, ["k--", "k:", "k-."][: len(feeders)], strict=True):
        layer, head = parse_head(name)
        ax.plot(
            steps,
            [x["prev_token"][layer][head] for x in evals],
            style,
            label=f"{name} previous-token",
        )
    ax.axhline(r["induction_ceiling"], color="grey", lw=0.8, label="ideal induction head")
    _shade(ax, r)
    ax.set(xlabel="step", ylabel="score", title="Induction score of each head over training")
    ax.legend(fontsize=7, ncol=2)
    return save_figure(fig, out, "head_scores.png")


def _pattern_figure(r: dict[str, Any], out: Path) -> str | None:
    if not r["induction_heads"]:
        return None
    plt = pyplot()
    model, data = r["_model"], r["_data"]
    patterns = run_patterns(model, data.inputs[:1])[:, 0]  # (L, h, n, n)
    partner = max(r["feeder_heads"], key=lambda f: f["prev_token_score"])["head"]
    shown = [r["induction_heads"][0], partner]
    fig, axes = plt.subplots(1, 2, figsize=(9, 4.4))
    for ax, name in zip(axes, shown, strict=True):
        layer, head = parse_head(name)
        ax.imshow(patterns[layer, head].numpy(), cmap="viridis")
        kind = "induction" if name == shown[0] else "previous-token partner"
        ax.set(title=f"head {name} ({kind})", xlabel="key position", ylabel="query position")
    return save_figure(fig, out, "patterns.png")
