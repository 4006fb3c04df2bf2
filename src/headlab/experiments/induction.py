"""Induction heads and their phase change (Olsson et al. 2022), reproduced in about a minute on CPU.

Shape legend
    B   sequences in a batch or probe
    n   context length (tokens the model sees)
    L   layers, h heads per layer

What runs
    A 2-layer attention-only transformer and a 1-layer control of the same width are trained on
    :class:`headlab.tasks.RepeatTask`: uniform random tokens in which one segment is copied later,
    with the copy's length and offset drawn afresh per sequence, so no fixed repeat period exists.
    Positions are rotary (relative): with learned absolute positions, measured here, the model
    instead learned to guess where the copy sits from absolute position and formed no induction
    head in runs of up to 5,000 steps. Rotary positions leave only the induction circuit to find.

Measured at every evaluation point (all on fixed held-out data)
    loss                held-out loss on the training distribution
    first_copy_loss     loss on tokens of a probe's first copy (they cannot be predicted)
    repeated_loss       loss on the same tokens in the second copy (the first token of a copy is
                        excluded: nothing announces it)
    icl_score           Olsson et al.'s in-context-learning score, loss of the 500th token minus
                        loss of the 50th in 512-token contexts, adapted to n: loss at token
                        round(500/512·n) minus loss at token round(50/512·n), on training data
    induction, prev_token   each head's score (TransformerLens "mul", headlab.heads), per layer

Found automatically
    phase change        the in-context gain g = repeated_loss − first_copy_loss is smoothed over
                        3 evaluation points; its steepest fall per step marks ``phase_change_step``
                        (the middle of that interval) and the window is every adjacent interval
                        falling at least half as fast. ``found`` needs the repeated tokens' loss
                        to end below half the unrepeated loss (a gain beyond what predicting
                        "some token already in the context" gives: ln 64 → about ln 20 here),
                        with at least a quarter of the gain made inside the window.
    induction heads     heads whose induction score is at least half the ceiling: the score of an
                        ideal head on the same probe (rows without an earlier copy cannot score)
    previous-token heads  heads whose previous-token score is at least 0.5
    feeder heads        layer-0 heads whose ablation (output zeroed) takes away at least 30% of
                        the in-context gain: effect = (ablated − clean) / (unrepeated − clean);
                        they are then ablated together, and so are the other layer-0 heads

Papers: Olsson et al. 2022, "In-context Learning and Induction Heads"; Elhage et al. 2021,
"A Mathematical Framework for Transformer Circuits" (K-composition; attention-only models).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from headlab.ablation import full_mask
from headlab.experiments import one_thread, pyplot, save_figure, write_results
from headlab.experiments.design_common import spread
from headlab.heads import THRESHOLDS, induction_pattern, induction_score, previous_token_score
from headlab.measure import (
    Probe,
    copy_losses,
    icl_positions,
    icl_score,
    make_probe,
    run_patterns,
    token_losses,
)
from headlab.model import ModelConfig, Transformer
from headlab.tasks import RepeatTask
from headlab.trace import Trace
from headlab.train import Reporter, TrainConfig, TrainResult, train


@dataclass(frozen=True)
class InductionConfig:
    """The task, the models and the training run of the experiment."""

    vocab_size: int = 64  # uniform random tokens
    seq_len: int = 32  # n, the context length
    min_span: int = 4  # shortest repeated segment in training data
    max_span: int = 16  # longest repeated segment in training data
    d_model: int = 64  # width of both models
    n_heads: int = 4  # heads per layer
    init_std: float = 0.125  # ≈ 1/√d_model (0.02, tied, decaying rate: none in 1,500 steps)
    steps: int = 2000  # AdamW steps for each model
    batch_size: int = 32
    lr: float = 3e-3
    warmup_steps: int = 100
    min_lr_ratio: float = 1.0  # no decay: decayed over 1,000 steps, the circuit was left unfinished
    eval_every: int = 25  # steps between evaluation points
    eval_batch: int = 64  # probe sequences (repeated segments of n/4 … n/2 tokens)
    icl_batch: int = 256  # held-out training-distribution sequences for loss and ICL score


DEFAULT = InductionConfig()
FEEDER_EFFECT = 0.3  # a layer-0 head whose ablation removes this share of the gain feeds it
QUICK = InductionConfig(
    seq_len=24, min_span=3, max_span=12, steps=1200, eval_every=20, eval_batch=48, icl_batch=128
)


def make_model(cfg: InductionConfig, n_layers: int, seed: int) -> Transformer:
    """An attention-only transformer with rotary positions and untied embeddings, seeded."""
    torch.manual_seed(seed)
    config = ModelConfig(
        vocab_size=cfg.vocab_size,
        d_model=cfg.d_model,
        n_layers=n_layers,
        n_heads=cfg.n_heads,
        max_len=cfg.seq_len,
        positional="rotary",
        attn_only=True,
        tie_embeddings=False,
        init_std=cfg.init_std,
    )
    return Transformer(config)


def train_config(cfg: InductionConfig, seed: int) -> TrainConfig:
    return TrainConfig(
        steps=cfg.steps,
        batch_size=cfg.batch_size,
        lr=cfg.lr,
        warmup_steps=cfg.warmup_steps,
        min_lr_ratio=cfg.min_lr_ratio,
        seed=seed,
        eval_every=cfg.eval_every,
        log_every=cfg.eval_every,
        checkpoint_every=max(cfg.steps // 4, 1),
    )


# ---------------------------------------------------------------------------------------------
# Held-out data and the measurements taken at every evaluation point
# ---------------------------------------------------------------------------------------------


@dataclass
class HeldOut:
    """Fixed evaluation data: a repeated-segment probe and a training-distribution batch."""

    copies: Probe  # (B, n + 1) tokens with a segment copied later; ``source`` names the copies
    icl: Tensor  # (B', n + 1) training-distribution tokens
    ceiling: float  # induction score of an ideal induction head on the probe's inputs

    @property
    def inputs(self) -> Tensor:
        """(B, n): what the model sees of the copy probe."""
        return self.copies.tokens[:, :-1]


def held_out(cfg: InductionConfig, seed: int) -> HeldOut:
    """The evaluation data, from a generator separate from training (seed + 1,000,003)."""
    g = torch.Generator().manual_seed(seed + 1_000_003)
    n = cfg.seq_len
    task = RepeatTask(cfg.vocab_size, n, max(1, n // 4), (n + 1) // 2)
    tokens, source, is_copy = task.sample(cfg.eval_batch, g)  # (B, n + 1) each
    copies = make_probe("copy", tokens, None, torch.where(is_copy, source, -1))
    icl = RepeatTask(cfg.vocab_size, n, cfg.min_span, cfg.max_span).sample(cfg.icl_batch, g)[0]
    ideal = ideal_induction_weights(tokens[:, :-1])
    return HeldOut(copies, icl, float(induction_score(ideal, tokens[:, :-1]).max()))


def ideal_induction_weights(tokens: Tensor) -> Tensor:
    """(B, 1, n, n) attention of a perfect induction head: uniform over the tokens that followed
    earlier copies of the current token; a row with no earlier copy attends to itself."""
    target = induction_pattern(tokens)  # (B, n, n)
    has = target.sum(-1, keepdim=True) > 0
    eye = torch.eye(tokens.shape[1]).expand_as(target)
    rows = torch.where(has, target / target.sum(-1, keepdim=True).clamp_min(1), eye)
    return rows.unsqueeze(1)  # (B, 1, n, n)


def metrics(model: Transformer, data: HeldOut) -> dict[str, Any]:
    """The per-evaluation metrics listed in the module docstring."""
    trace = Trace(only=("weights",))
    first, repeated = copy_losses(token_losses(model, data.copies.tokens, trace=trace),
                                  data.copies.source)  # fmt: skip
    weights = trace.layers("attn.weights")  # (B, h, n, n) each
    held = token_losses(model, data.icl)  # (B', n)
    return {
        "loss": float(held.mean()),
        "first_copy_loss": first,
        "repeated_loss": repeated,
        "icl_score": icl_score(held, *icl_positions(held.shape[1])),
        "induction": [induction_score(w, data.inputs).tolist() for w in weights],
        "prev_token": [previous_token_score(w).tolist() for w in weights],
    }


# ---------------------------------------------------------------------------------------------
# Training one model, and what is found after it
# ---------------------------------------------------------------------------------------------


def train_model(
    cfg: InductionConfig,
    n_layers: int,
    seed: int,
    data: HeldOut,
    reporter: Reporter | None = None,
    out_dir: Path | None = None,
    resume: bool = False,
) -> tuple[Transformer, TrainResult]:
    """Train one model on the repeat task, measuring it every ``eval_every`` steps."""
    model = make_model(cfg, n_layers, seed)
    task = RepeatTask(cfg.vocab_size, cfg.seq_len, cfg.min_span, cfg.max_span)
    t0 = time.perf_counter()

    def evaluate(m: Any, step: int) -> dict[str, Any]:
        return {**metrics(m, data), "wall": time.perf_counter() - t0}

    result = train(
        model,
        train_config(cfg, seed),
        lambda g: task.batch(cfg.batch_size, g),
        evaluate=evaluate,
        out_dir=out_dir,
        resume=resume,
        reporter=reporter,
    )
    model.eval()
    return model, result


def find_phase_change(evals: list[dict[str, Any]]) -> dict[str, Any]:
    """The steepest fall of the in-context gain (see the module docstring for the rule)."""
    steps = [r["step"] for r in evals]
    gain = [r["repeated_loss"] - r["first_copy_loss"] for r in evals]
    smooth = [statistics.fmean(gain[max(0, i - 1) : i + 2]) for i in range(len(gain))]
    slopes = [(smooth[i + 1] - smooth[i]) / (steps[i + 1] - steps[i]) for i in range(len(gain) - 1)]
    k = min(range(len(slopes)), key=slopes.__getitem__)
    lo, hi = k, k
    while lo > 0 and slopes[lo - 1] <= 0.5 * slopes[k]:
        lo -= 1
    while hi + 1 < len(slopes) and slopes[hi + 1] <= 0.5 * slopes[k]:
        hi += 1
    final_gain = -gain[-1]
    window_gain = smooth[lo] - smooth[hi + 1]
    return {
        "step": round((steps[k] + steps[k + 1]) / 2),
        "window": [steps[lo], steps[hi + 1]],
        "steepest_fall_per_1k_steps": -1000 * slopes[k],
        "final_gain": final_gain,
        "window_gain": window_gain,
        "found": final_gain >= 0.5 * evals[-1]["first_copy_loss"]
        and window_gain >= 0.25 * final_gain,
    }


def ablate(model: Transformer, data: HeldOut, heads: list[tuple[int, int]]) -> float:
    """Repeated-token loss with the outputs of ``heads`` zeroed (Michel et al. 2019's masks)."""
    mask = full_mask(model.config.n_layers, model.config.n_heads, heads)
    with torch.no_grad():
        losses = token_losses(model, data.copies.tokens, head_mask=mask)
    return copy_losses(losses, data.copies.source)[1]


def ablation_study(model: Transformer, data: HeldOut, final: dict[str, Any]) -> dict[str, Any]:
    """Every head ablated alone; then the layer-0 feeders together and the other layer-0 heads."""
    clean, unrepeated = final["repeated_loss"], final["first_copy_loss"]
    span = max(unrepeated - clean, 1e-9)
    L, h = model.config.n_layers, model.config.n_heads
    single = {f"{l}.{i}": ablate(model, data, [(l, i)]) for l in range(L) for i in range(h)}
    effect = {name: (loss - clean) / span for name, loss in single.items()}
    layer0 = [f"0.{i}" for i in range(h)]
    feeders = [name for name in layer0 if effect[name] >= FEEDER_EFFECT] or [
        max(layer0, key=lambda n: effect[n])
    ]
    others = [name for name in layer0 if name not in feeders]
    joint = {
        "feeders": ablate(model, data, [_parse(n) for n in feeders]),
        "others": ablate(model, data, [_parse(n) for n in others]) if others else clean,
    }
    return {
        "clean_repeated_loss": clean,
        "unrepeated_loss": unrepeated,
        "ablation": single,
        "ablation_effect": effect,
        "feeder_heads": [
            {"head": name, "effect": effect[name], "prev_token_score": _score(final, name)}
            for name in feeders
        ],
        "ablate_feeders_repeated_loss": joint["feeders"],
        "ablate_others_repeated_loss": joint["others"],
        "ablate_feeders_effect": (joint["feeders"] - clean) / span,
        "ablate_others_effect": (joint["others"] - clean) / span,
    }


def _parse(name: str) -> tuple[int, int]:
    layer, head = name.split(".")
    return int(layer), int(head)


def _score(final: dict[str, Any], name: str, kind: str = "prev_token") -> float:
    layer, head = _parse(name)
    return float(final[kind][layer][head])


def label_heads(final: dict[str, Any], ceiling: float) -> dict[str, list[str]]:
    """Induction heads (≥ half the ceiling) and previous-token heads (headlab.heads' threshold,
    0.5), as "L.H". The induction score is read against the probe's ceiling: copies of random
    length and offset leave most rows with nothing to copy."""
    found: dict[str, list[str]] = {"induction": [], "prev_token": []}
    for layer, scores in enumerate(final["induction"]):
        found["induction"] += [f"{layer}.{i}" for i, s in enumerate(scores) if s >= 0.5 * ceiling]
    for layer, scores in enumerate(final["prev_token"]):
        found["prev_token"] += [
            f"{layer}.{i}" for i, s in enumerate(scores) if s >= THRESHOLDS["previous"]
        ]
    return found


# ---------------------------------------------------------------------------------------------
# One seed, several seeds, figures
# ---------------------------------------------------------------------------------------------


def run_seed(cfg: InductionConfig, seed: int, reporter: Reporter | None = None) -> dict[str, Any]:
    """Both models for one seed: phase change, heads, ablations, the control."""
    data = held_out(cfg, seed)
    model, result = train_model(cfg, 2, seed, data, reporter)
    evals = result.records("eval")
    final = evals[-1]
    phase = find_phase_change(evals)
    heads = label_heads(final, data.ceiling)
    _, control_result = train_model(cfg, 1, seed, data, reporter)
    control_evals = control_result.records("eval")
    control_final = control_evals[-1]
    walls = {r["step"]: r["wall"] for r in evals}
    return {
        "seed": seed,
        "phase_change_step": phase["step"],
        "phase_change": phase,
        "phase_change_seconds": walls[phase["window"][1]],
        "induction_heads": heads["induction"],
        "prev_token_heads": heads["prev_token"],
        "final_induction_score": max(max(layer) for layer in final["induction"]),
        "induction_ceiling": data.ceiling,
        "final": {k: final[k] for k in ("loss", "first_copy_loss", "repeated_loss", "icl_score")},
        **ablation_study(model, data, final),
        "control_max_induction_score": max(max(r["induction"][0]) for r in control_evals),
        "control_final": {
            k: control_final[k] for k in ("loss", "first_copy_loss", "repeated_loss", "icl_score")
        },
        "control_phase_change": find_phase_change(control_evals),
        "train_seconds": result.wall_seconds,
        "control_train_seconds": control_result.wall_seconds,
        "history": result.history,
        "control_history": control_result.history,
        "_model": model,
        "_data": data,
    }


def run(*, quick: bool = False, seeds: int = 1, seed: int = 0, out: Path | None = None) -> dict:
    """Train the 2-layer model and the 1-layer control for each seed; find the phase change, the
    heads and their ablation effects; write results.json and figures into ``out``."""
    if seeds < 1:
        raise ValueError(f"seeds must be at least 1, got {seeds}")
    cfg = QUICK if quick else DEFAULT
    t0 = time.perf_counter()
    with one_thread():
        runs = [run_seed(cfg, s) for s in range(seed, seed + seeds)]
    first = runs[0]
    results = {
        "experiment": "induction",
        "quick": quick,
        "config": asdict(cfg),
        **{k: v for k, v in first.items() if not k.startswith("_")},
        "seeds": [_summary(r) for r in runs],
        "phase_change_consistency": spread([r["phase_change_step"] for r in runs]),
        "wall_seconds": 0.0,
        "figures": [],
    }
    if out is not None:
        results["figures"] = _figures(first, Path(out))
    results["wall_seconds"] = time.perf_counter() - t0
    write_results(out, results)
    return results


def _summary(r: dict[str, Any]) -> dict[str, Any]:
    keep = ("seed", "phase_change_step", "phase_change_seconds", "induction_heads",
            "prev_token_heads", "final_induction_score", "control_max_induction_score",
            "ablate_feeders_effect", "ablate_others_effect", "train_seconds")  # fmt: skip
    return {k: r[k] for k in keep} | {
        "found": r["phase_change"]["found"],
        "window": r["phase_change"]["window"],
        "feeder_heads": [f["head"] for f in r["feeder_heads"]],
        "feeder_prev_token_scores": [f["prev_token_score"] for f in r["feeder_heads"]],
    }


def _figures(r: dict[str, Any], out: Path) -> list[str]:
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
    ax.plot([x["step"] for x in control], [x["repeated_loss"] for x in control], ":",
            label="1-layer repeated_loss")  # fmt: skip
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
        layer, head = _parse(name)
        ax.plot(steps, [x["prev_token"][layer][head] for x in evals], style,
                label=f"{name} previous-token")  # fmt: skip
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
        layer, head = _parse(name)
        ax.imshow(patterns[layer, head].numpy(), cmap="viridis")
        kind = "induction" if name == shown[0] else "previous-token partner"
        ax.set(title=f"head {name} ({kind})", xlabel="key position", ylabel="query position")
    return save_figure(fig, out, "patterns.png")


# ---------------------------------------------------------------------------------------------
# `headlab train induction`: the 2-layer model alone, with checkpoints and resume
# ---------------------------------------------------------------------------------------------


def train_recipe(
    out: Path,
    *,
    quick: bool = False,
    seed: int = 0,
    resume: bool = False,
    reporter: Reporter | None = None,
) -> TrainResult:
    """Train the experiment's 2-layer model in ``out`` and save it to ``out/model``."""
    cfg = replace(QUICK if quick else DEFAULT)
    data = held_out(cfg, seed)
    with one_thread():
        model, result = train_model(cfg, 2, seed, data, reporter, Path(out), resume)
    if not result.interrupted:
        model.save(Path(out) / "model")
    return result
