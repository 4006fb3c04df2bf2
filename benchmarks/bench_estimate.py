"""How well the ablation estimates rank the heads, and what they cost: for each model, exact
mean ablation of every head (headlab.heads.effects.ablate_heads, the reference), the estimate
along each head's own path and along each layer's path by number of points
(``attribute_heads(steps=k, per=...)``, headlab.heads.attribution), and the two-stage estimate
by number of heads it ablates exactly (``estimate_heads(check=c)``, headlab.heads.estimate),
and the evidence's ablation stage both ways (every head exact; its default).
Per method: Spearman ρ of the loss rise on every token against exact ablation over all heads and
over the 20 heads with the largest exact effects, how many of the exact top 5 its top 5 holds,
its wall time as a ratio against one traced forward of the same probe (median of ``--rounds``)
and against exact ablation of every head, both measured in the same run (the estimates and the
exact ablation once each), its probe passes (forwards of the probe in whole-model equivalents,
each copy of the probe counted, backwards not) and how many heads it ablated exactly.

Every figure is of one probe (``--probe``, default the repeat probe: the built-in sentence with
a repeat, 128 tokens at most; ``random-repeat``: random tokens repeated), and each row names it.

Run: ``nice -n 10 python benchmarks/bench_estimate.py [--models default smollm2] [--steps 1 2 4 8]
[--layer-steps 2 3] [--check 60] [--probe repeat] [--threads 1]``; results go to
benchmarks/results/estimate.json (``--json``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Any

import torch
from scipy.stats import spearmanr

from headlab import Trace, zoo
from headlab.heads import analyse
from headlab.heads.attribution import attribute_heads
from headlab.heads.effects import ablate_heads
from headlab.heads.estimate import CHECK, LAYER_STEPS, Checked, estimate_heads
from headlab.heads.evidence import loss_rows, measure_ablations
from headlab.measure import build_probe
from record import count, path_for, save


def agreement(exact: torch.Tensor, estimate: torch.Tensor, top: int | None = None) -> float:
    """Spearman ρ over every head, or over the ``top`` heads by exact effect."""
    pick = exact.argsort(descending=True)[: top or len(exact)]
    return float(spearmanr(exact[pick].numpy(), estimate[pick].numpy()).statistic)


def overlap(exact: torch.Tensor, estimate: torch.Tensor) -> int:
    """How many of the exact top 5 heads are among the estimate's top 5."""
    top = set(exact.argsort(descending=True)[:5].tolist())
    return len(top & set(estimate.argsort(descending=True)[:5].tolist()))


def forward_seconds(model: Any, tokens: torch.Tensor, rounds: int) -> float:
    """Median seconds of one traced forward (the weights recorded, as analysis runs it)."""
    times = []
    for _ in range(rounds + 1):
        t0 = time.perf_counter()
        with torch.inference_mode():
            model.hidden_states(tokens, trace=Trace(only=("weights",)))
        times.append(time.perf_counter() - t0)
    return statistics.median(times[1:])


def row(
    name: str,
    probe: str,
    what: str,
    exact: torch.Tensor,
    est: torch.Tensor,
    seconds: float,
    forward: float,
    exact_s: float,
    at: Any,
) -> dict[str, Any]:
    """One method's agreement with exact ablation and its cost."""
    checked = getattr(at, "exact", None)
    return {
        "model": name,
        "probe": probe,
        "method": what,
        "steps": getattr(at, "steps", None),
        "rho_all": agreement(exact, est),
        "rho_top20": agreement(exact, est, 20),
        "top5": overlap(exact, est),
        "seconds": seconds,
        "forward_s": forward,
        "exact_all_s": exact_s,
        "vs_exact": seconds / exact_s,
        "probe_passes": at.probe_passes,
        "checked": 0 if checked is None else len(checked.heads),
    }


def timed(run: Any) -> tuple[Any, float]:
    t0 = time.perf_counter()
    out = run()
    return out, time.perf_counter() - t0


def measure(
    name: str,
    steps: list[int],
    layer_steps: list[int],
    checks: list[int],
    plain_checks: list[int],
    rounds: int,
    probe_name: str = "repeat",
) -> list[dict[str, Any]]:
    """One row for exact ablation of every head, one per k on each head's own path
    (``steps``), per k on each layer's path (``layer_steps``) and per number of heads the
    two-stage estimate checks exactly (``checks``; ``plain_checks`` with plain attribution
    patching ranking every head by the size of its estimated effect on the loss over every
    token and over a later copy's tokens), on ``name``'s probe ``probe_name``."""
    model, tok = zoo.load(name)
    limit = min(model.config.max_len, 128)
    probe = build_probe(probe_name, tok, limit, model.config.vocab_size)
    rows = loss_rows(probe, True)["any"]
    forward = forward_seconds(model, probe.tokens, rounds)
    exact_run, exact_s = timed(lambda: ablate_heads(model, probe))
    exact = exact_run.loss_effect(rows)
    out = [row(name, probe_name, "exact", exact, exact, exact_s, forward, exact_s, exact_run)]
    runs = [
        (
            f"estimate, {k} step(s) per head",
            lambda k=k: attribute_heads(model, probe, [rows], steps=k),
        )
        for k in steps
    ]
    runs += [
        (
            f"estimate, {k} step(s) per layer",
            lambda k=k: attribute_heads(model, probe, [rows], steps=k, per="layer"),
        )
        for k in layer_steps
    ]
    runs += [
        (
            f"estimate per layer ({LAYER_STEPS} steps) + exact check of {c}",
            lambda c=c: estimate_heads(model, probe, [rows], check=c),
        )
        for c in checks
    ]
    both = [rows, loss_rows(probe, True)["copy"]]  # every token, and a later copy's tokens
    runs += [
        (
            f"plain estimate + exact check of {c} by size, every token and later copy",
            lambda c=c: estimate_heads(model, probe, both, check=c, steps=1, rank=both, by="size"),
        )
        for c in plain_checks
    ]
    for what, run in runs:
        at, seconds = timed(run)
        effect = at.loss_effect(rows)
        out.append(row(name, probe_name, what, exact, effect, seconds, forward, exact_s, at))
    return out + in_evidence(name, probe_name, model, probe, exact, forward)


def in_evidence(
    name: str, probe_name: str, model: Any, probe: Any, exact: torch.Tensor, forward: float
) -> list[dict[str, Any]]:
    """The evidence's ablation stage (headlab.heads.evidence.measure_ablations) both ways, with
    every quantity the evidence asks about (the loss over each row set of ``loss_rows``, the
    scores of the heads ``analyse`` labels induction): exact ablation of every head, then the
    two-stage estimate, its time as a ratio against the first."""
    rows = loss_rows(probe, True)
    report = analyse(model, probe, content=False)
    induction = [(s.layer, s.head) for s in report.heads if s.label == "induction"]
    (every, _), every_s = timed(
        lambda: measure_ablations(model, probe, rows, induction, exact=True)
    )
    (est, checked), two_s = timed(
        lambda: measure_ablations(model, probe, rows, induction, exact=None)
    )
    two = Checked(est, checked) if est.method == "attribution" else every
    return [
        row(
            name,
            probe_name,
            "evidence's ablations, every head exact",
            exact,
            every.loss_effect(rows["any"]),
            every_s,
            forward,
            every_s,
            every,
        ),
        row(
            name,
            probe_name,
            "evidence's ablations, as its default chooses",
            exact,
            two.loss_effect(rows["any"]),
            two_s,
            forward,
            every_s,
            two,
        ),
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["default", "smollm2"])
    parser.add_argument(
        "--steps", nargs="*", type=int, default=[1, 2, 4, 8], help="points on each head's own path"
    )
    parser.add_argument(
        "--layer-steps", nargs="*", type=int, default=[2], help="points on each layer's path"
    )
    parser.add_argument(
        "--check",
        nargs="*",
        type=int,
        default=[CHECK],
        help="heads the two-stage estimate ablates exactly",
    )
    parser.add_argument(
        "--plain-check",
        nargs="*",
        type=int,
        default=[],
        help=(
            "heads the two-stage estimate ablates exactly, ranked by plain attribution patching "
            "by size on every token and a later copy"
        ),
    )
    parser.add_argument(
        "--probe",
        choices=["repeat", "random-repeat"],
        default="repeat",
        help="the probe every figure is measured on",
    )
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=count(), default=7, help="rounds of the forward")
    parser.add_argument("--json", default=path_for("estimate"), help="where the results go")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    start = [round(v, 2) for v in os.getloadavg()]
    results: list[dict[str, Any]] = []
    for name in args.models:
        try:
            results += measure(
                name,
                args.steps,
                args.layer_steps,
                args.check,
                args.plain_check,
                args.rounds,
                args.probe,
            )
        except (ImportError, zoo.ModelNotAvailable) as exc:
            print(f"skipped {name}: not available here ({exc})")
    rows = []
    for r in results:
        rows.append(
            [
                r["model"],
                r["probe"],
                r["method"],
                f"{r['rho_all']:.2f}",
                f"{r['rho_top20']:.2f}",
                r["top5"],
                f"{r['seconds']:.2f}",
                f"{r['seconds'] / r['forward_s']:.1f}",
                f"{r['seconds'] / r['exact_all_s']:.2f}",
                f"{r['probe_passes']:.1f}",
                r["checked"],
            ]
        )
        print("  ".join(str(v) for v in rows[-1]), flush=True)
    end = [round(v, 2) for v in os.getloadavg()]
    print(f"load average (1, 5, 15 min): {start} at the start, {end} at the end")
    columns = [
        "model",
        "probe",
        "what",
        "ρ all heads",
        "ρ top 20",
        "top-5 shared",
        "seconds",
        "× one forward",
        "× exact, every head",
        "probe passes",
        "heads exact",
    ]
    save(args.json, columns, rows, {"rows": results, "load_average": {"start": start, "end": end}})
    return 0


if __name__ == "__main__":
    sys.exit(main())
