"""Induction heads and their phase change (Olsson et al. 2022), reproduced in seconds on CPU.

Shape legend
    B   sequences in a batch or probe
    n   context length (tokens the model sees)
    L   layers, h heads per layer

What runs
    A 2-layer attention-only transformer and a 1-layer control of the same width are trained on
    :class:`headlab.training.tasks.RepeatTask`: uniform random tokens in which one segment is
    copied later,
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
                        falling at least half as fast. ``found`` needs three things: the repeated
                        tokens' loss ends below half the unrepeated loss (a gain beyond what
                        predicting "some token already in the context" gives: ln 64 → about
                        ln 20 here), at least a quarter of that gain is made inside the window,
                        and an induction head forms with it: the best head's induction score
                        rises by at least a quarter of the ceiling inside the window and ends at
                        half the ceiling or more. A fall of the loss without an induction head
                        (a small model finding another trick) is not reported as a phase change.
    induction heads     heads whose induction score is at least half the ceiling: the score of an
                        ideal head on the same probe (rows without an earlier copy cannot score)
    previous-token heads  heads whose previous-token score is at least 0.5
    feeder heads        (2-layer models) the layer-0 heads whose joint ablation removes most of
                        the in-context gain, and each layer-0 head's Shapley value
                        (:mod:`headlab.experiments.induction_ablation`, which states the rule)

Live runs
    :func:`study` trains one model and finds all of the above. Given a ``listener``, it trains
    under a :class:`headlab.training.watch.Watch`, which sends typed events as it runs (the start,
    the training loss every ``STEP_EVENTS`` steps, every evaluation with the phase change as
    detected so far and now and then the patterns of the best induction and previous-token
    heads, the phase change when first detected); the study sends the verdict. ``headlab
    experiment induction`` prints them; the web page's "train it yourself" panel streams them
    from the server. A :class:`headlab.training.train.StopToken` ends the run between two steps
    (the study then returns None).

Papers: Olsson et al. 2022, "In-context Learning and Induction Heads"; Elhage et al. 2021,
"A Mathematical Framework for Transformer Circuits" (K-composition; attention-only models).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from headlab.experiments import write_results
from headlab.experiments.design_common import spread

# the ablation study's public names stay importable from the experiment (tests, benchmarks)
from headlab.experiments.induction_ablation import ablation_study, parse_head
from headlab.experiments.induction_figures import figures
from headlab.files import one_thread, torch_threads
from headlab.heads import THRESHOLDS, induction_score, previous_mul_score, token_rule_targets
from headlab.measure import (
    Probe,
    copy_losses,
    icl_positions,
    icl_score,
    make_probe,
    token_losses,
)
from headlab.model import ModelConfig, Transformer
from headlab.trace import Trace
from headlab.training.tasks import RepeatTask
from headlab.training.train import Reporter, StopToken, TrainConfig, TrainResult, train
from headlab.training.watch import Listener, PhaseDetector, Verdict, Watch, best_induction


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
# The live recipe: the page's "train it yourself" panel and `--quick` (so the tests assert on it)
# (benchmarks/bench_phase_change.py; measured against other recipes in docs/induction.md). A
# vocabulary of 48 and a higher rate after a shorter warm-up end the window at steps 275-300, not
# 400-450; an evaluation every 25 steps places its end to within 25 steps.
LIVE = InductionConfig(
    vocab_size=48,
    seq_len=24,
    min_span=6,
    max_span=12,
    batch_size=64,
    lr=6e-3,
    warmup_steps=50,
    steps=700,
    eval_every=25,
    eval_batch=32,
    icl_batch=64,
)
QUICK = LIVE


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
    earlier copies of the current token (keys that are themselves copies of it left out, as the
    score leaves them out); a row with nothing to copy attends to itself."""
    target = token_rule_targets(tokens, causal=True)[0]  # (B, n, n)
    has = target.sum(-1, keepdim=True) > 0
    eye = torch.eye(tokens.shape[1]).expand_as(target)
    rows = torch.where(has, target / target.sum(-1, keepdim=True).clamp_min(1), eye)
    return rows.unsqueeze(1)  # (B, 1, n, n)


def metrics(model: Transformer, data: HeldOut) -> tuple[dict[str, Any], list[Tensor]]:
    """The per-evaluation metrics listed in the module docstring, and the attention weights of
    the probe's forward they were scored on, (B, h, n, n) per layer (a watched run draws its
    patterns from them: no second forward)."""
    trace = Trace(only=("weights",))
    first, repeated = copy_losses(
        token_losses(model, data.copies.tokens, trace=trace), data.copies.source
    )
    weights = trace.layers("attn.weights")  # (B, h, n, n) each
    held = token_losses(model, data.icl)  # (B', n)
    return {
        "loss": float(held.mean()),
        "first_copy_loss": first,
        "repeated_loss": repeated,
        "icl_score": icl_score(held, *icl_positions(held.shape[1])),
        "induction": [induction_score(w, data.inputs).tolist() for w in weights],
        "prev_token": [previous_mul_score(w).tolist() for w in weights],
    }, weights


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
    listener: Listener | None = None,
    stop: StopToken | None = None,
    weights_view: Callable[[Any], dict[str, Any]] | None = None,
) -> tuple[Transformer, TrainResult]:
    """Train one model on the repeat task, measuring it every ``eval_every`` steps; with a
    ``listener``, watched (:class:`headlab.training.watch.Watch`, given ``weights_view`` to send
    what it reads from the weights at each evaluation); ``stop`` can end it early."""
    model = make_model(cfg, n_layers, seed)
    task = RepeatTask(cfg.vocab_size, cfg.seq_len, cfg.min_span, cfg.max_span)
    # AdamW imports torch._dynamo when first built (about 2 s here): imported before the clock
    # starts, a run's seconds measure training, as on the page (the server imports it at startup)
    import torch._dynamo  # noqa: F401

    t0 = time.perf_counter()

    def measure(m: Any) -> tuple[dict[str, Any], list[Tensor]]:
        record, weights = metrics(m, data)
        return {**record, "wall": time.perf_counter() - t0}, weights

    watch = None
    if listener is not None:
        watch = Watch(
            measure, listener, data.inputs[0].tolist(), data.ceiling, reporter, weights_view
        )
    result = train(
        model,
        train_config(cfg, seed),
        lambda g: task.batch(cfg.batch_size, g),
        evaluate=watch.evaluate if watch is not None else lambda m, step: measure(m)[0],
        out_dir=out_dir,
        resume=resume,
        reporter=watch or reporter,
        stop=stop,
    )
    model.eval()
    return model, result


def find_phase_change(evals: list[dict[str, Any]], ceiling: float) -> dict[str, Any]:
    """The steepest fall of the in-context gain, and whether an induction head formed with it
    (the rule is in the module docstring), for the evaluation records ``evals`` in step order.
    ``ceiling``: an ideal induction head's score. A live run asks the same detector after each
    evaluation (:class:`headlab.training.watch.PhaseDetector`)."""
    detector = PhaseDetector(ceiling)
    for record in evals:
        detector.add(record)
    return detector.phase


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


def verdict(r: dict[str, Any]) -> dict[str, Any]:
    """Did the circuit form? A sentence and the facts behind it, from a :func:`study` result."""
    share = r["final_induction_score"] / r["induction_ceiling"]
    if not r["phase_change"]["found"]:
        why = (
            (
                " A one-layer model cannot: no earlier layer tells a head which token came"
                " before (Elhage et al. 2021)."
            )
            if r["n_layers"] == 1
            else ""
        )
        text = f"No induction head formed: the best head reached {share:.0%} of an ideal one."
        return {"circuit": False, "induction_share": share, "text": text + why}
    heads = sorted(r["induction_heads"], key=lambda n: -_score(r["final"], n, "induction"))
    head = heads[0]
    feeders = r.get("feeder_heads") or [{"head": "none", "prev_token_score": 0.0}]
    named = ", ".join(
        f"{f['head']} (previous-token score {f['prev_token_score']:.2f})" for f in feeders
    )
    formed = (
        f"Induction head {head} formed"
        if len(heads) == 1
        else f"{_count(len(heads))} induction heads, {_listed(sorted(heads))}, formed"
    )
    best = "" if len(heads) == 1 else f"the strongest, {head}, "
    text = (
        f"{formed} at steps {r['phase_change']['window'][0]}–"
        f"{r['phase_change']['window'][1]} and {best}reaches {share:.0%} of an ideal head's score. "
        f"Masking layer-0 head(s) {named} removes {r['ablate_feeders_effect']:.0%} of the "
        f"in-context gain; masking the other layer-0 heads removes "
        f"{r['ablate_others_effect']:.0%}."
    )
    prev = max(f["prev_token_score"] for f in feeders)
    return {
        "circuit": True,
        "induction_head": head,
        "induction_share": share,
        "feeder_prev_token": prev,
        "text": text,
    }


def _count(n: int) -> str:
    """A count in words where it is short ("Three"), in digits past ten."""
    words = ("No", "One", "Two", "Three", "Four", "Five", "Six", "Seven", "Eight", "Nine", "Ten")
    return words[n] if n < len(words) else str(n)


def _listed(names: list[str]) -> str:
    """ "1.0, 1.2 and 1.3"."""
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def _score(final: dict[str, Any], name: str, kind: str = "prev_token") -> float:
    layer, head = parse_head(name)
    return float(final[kind][layer][head])


# ---------------------------------------------------------------------------------------------
# One model studied, with live progress; one seed, several seeds
# ---------------------------------------------------------------------------------------------


def study(
    cfg: InductionConfig,
    n_layers: int,
    seed: int,
    data: HeldOut | None = None,
    reporter: Reporter | None = None,
    listener: Listener | None = None,
    stop: StopToken | None = None,
    weights_view: Callable[[Any], dict[str, Any]] | None = None,
) -> dict[str, Any] | None:
    """Train one model and find its phase change, heads and ablation effects (``_model``: the
    trained model). ``listener`` receives the run's events (module docstring), then the
    :class:`~headlab.training.watch.Verdict`; a ``stop`` that ends the run early gives None."""
    data = held_out(cfg, seed) if data is None else data
    model, result = train_model(
        cfg, n_layers, seed, data, reporter, listener=listener, stop=stop, weights_view=weights_view
    )
    if stop is not None and stop.reason is not None:
        return None
    evals = result.records("eval")
    final, phase = evals[-1], find_phase_change(evals, data.ceiling)
    heads = label_heads(final, data.ceiling)
    walls = {r["step"]: r["wall"] for r in evals}
    r = {
        "n_layers": n_layers,
        "phase_change_step": phase["step"],
        "phase_change": phase,
        "phase_change_seconds": walls[phase["window"][1]] if phase["found"] else None,
        "induction_heads": heads["induction"],
        "prev_token_heads": heads["prev_token"],
        "final_induction_score": best_induction(final),
        "max_induction_score": max(best_induction(e) for e in evals),
        "induction_ceiling": data.ceiling,
        "final": {k: final[k] for k in FINAL_KEYS},
        **ablation_study(model, data, final),
        "train_seconds": result.wall_seconds,
        "history": result.history,
        "_model": model,
    }
    r["verdict"] = verdict(r)
    if listener is not None:
        listener(Verdict({k: v for k, v in r.items() if k not in _BULKY}))
    return r


FINAL_KEYS = ("loss", "first_copy_loss", "repeated_loss", "icl_score", "induction", "prev_token")
_BULKY = ("history", "_model")


def run_seed(
    cfg: InductionConfig,
    seed: int,
    reporter: Reporter | None = None,
    listener: Listener | None = None,
) -> dict[str, Any]:
    """Both models for one seed: phase change, heads, ablations, the 1-layer control."""
    data = held_out(cfg, seed)
    two = study(cfg, 2, seed, data, reporter, listener)
    control = study(cfg, 1, seed, data, reporter, listener)
    assert two is not None and control is not None  # only a stop token ends a study early
    return {
        "seed": seed,
        **{k: v for k, v in two.items() if k != "n_layers"},
        "control_max_induction_score": control["max_induction_score"],
        "control_final": control["final"],
        "control_phase_change": control["phase_change"],
        "control_verdict": control["verdict"],
        "control_train_seconds": control["train_seconds"],
        "control_history": control["history"],
        "_data": data,
    }


def run(
    *,
    quick: bool = False,
    seeds: int = 1,
    seed: int = 0,
    out: Path | None = None,
    reporter: Reporter | None = None,
    listener: Listener | None = None,
    threads: int = 1,
) -> dict:
    """Train the 2-layer model and the 1-layer control for each seed; find the phase change, the
    heads and their ablation effects; write results.json and figures into ``out``.
    ``reporter`` and ``listener`` receive the progress (see :func:`study`). ``threads``: torch
    CPU threads (a run repeats bit for bit only on the same count; the page's live runs use
    ``headlab serve --live-threads``, 2 on two cores; the shipped run used 1)."""
    if seeds < 1:
        raise ValueError(f"seeds must be at least 1, got {seeds}")
    if threads < 1:
        raise ValueError(f"threads must be at least 1, got {threads}")
    cfg = QUICK if quick else DEFAULT
    t0 = time.perf_counter()
    with torch_threads(threads):
        runs = [run_seed(cfg, s, reporter, listener) for s in range(seed, seed + seeds)]
    first = runs[0]
    results = {
        "experiment": "induction",
        "quick": quick,
        "threads": threads,
        "config": asdict(cfg),
        **{k: v for k, v in first.items() if not k.startswith("_")},
        "seeds": [_summary(r) for r in runs],
        "phase_change_consistency": spread([r["phase_change_step"] for r in runs]),
        "wall_seconds": 0.0,
        "figures": [],
    }
    if out is not None:
        results["figures"] = figures(first, Path(out))
    results["wall_seconds"] = time.perf_counter() - t0
    write_results(out, results)
    return results


def _summary(r: dict[str, Any]) -> dict[str, Any]:
    keep = (
        "seed",
        "phase_change_step",
        "phase_change_seconds",
        "induction_heads",
        "prev_token_heads",
        "final_induction_score",
        "control_max_induction_score",
        "ablate_feeders_effect",
        "ablate_others_effect",
        "train_seconds",
    )
    return {k: r[k] for k in keep} | {
        "found": r["phase_change"]["found"],
        "window": r["phase_change"]["window"],
        "feeder_heads": [f["head"] for f in r["feeder_heads"]],
        "feeder_prev_token_scores": [f["prev_token_score"] for f in r["feeder_heads"]],
        "induction_share": r["verdict"]["induction_share"],
        "circuit": r["verdict"]["circuit"],
        "control_circuit": r["control_verdict"]["circuit"],
    }


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
