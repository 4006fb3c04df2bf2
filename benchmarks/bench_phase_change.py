"""Wall time from the start of training to the end of the induction phase-change window, with the
live recipe (the page's "train it yourself" panel and ``headlab experiment induction --quick``),
for seeds 0-2, with the torch thread count and the machine's load average.

Each seed runs :func:`headlab.experiments.induction.study` exactly as the page's run does (the
same evaluations, the same detector) and reports: the window, the seconds to its end (wall clock,
and the training thread's own CPU time), the best induction head's score as a share of an ideal
head's, the previous-token score of the best layer-0 feeder head, and whether the circuit formed.

On a shared machine wall times move with the load. ``--reference`` also runs, seed by seed in
between, the recipe measured on an idle machine for planning (REFERENCES.md: context 24, spans
3-12, evaluation every 50 steps on 32 + 64 sequences: 9.7 / 9.9 / 8.9 s), so the ratio of the two
medians, measured under the same load, carries over to an idle machine. ``--control`` adds the
1-layer model of each seed (it must form no induction head).

``--set name=value`` changes a field of the live recipe for this run (``--set vocab_size=64
lr=4.5e-3``), to time the recipes the README compares it with.

Run: ``python benchmarks/bench_phase_change.py [--threads 1] [--seeds 0 1 2] [--reference]
[--control] [--set name=value ...] [--json out.json]``
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from dataclasses import asdict, fields, replace
from typing import Any

import torch
import torch._dynamo  # the optimizer's first import, before any clock (the server: at startup)

from headlab.experiments import induction as ind
from headlab.files import write_json
from headlab.provenance import versions
from headlab.training.watch import Evaluation, Event

# REFERENCES.md, "Measured here for planning the live phase change": idle machine, one thread
PLANNING = ind.InductionConfig(
    seq_len=24, min_span=3, max_span=12, steps=1000, eval_every=50, eval_batch=32, icl_batch=64
)
PLANNING_IDLE_SECONDS = (9.7, 9.9, 8.9)


def recipe(changes: list[str]) -> ind.InductionConfig:
    """The live recipe with ``name=value`` changes (each value of the field's own type)."""
    kinds = {f.name: type(getattr(ind.LIVE, f.name)) for f in fields(ind.LIVE)}
    updates: dict[str, Any] = {}
    for change in changes:
        name, sep, value = change.partition("=")
        if not sep or name not in kinds:
            raise SystemExit(
                f"--set takes name=value with a field of the live recipe "
                f"({', '.join(kinds)}), got {change!r}"
            )
        try:
            updates[name] = kinds[name](value)
        except ValueError:
            kind = kinds[name].__name__
            raise SystemExit(f"--set {name} needs a {kind}, got {value!r}") from None
    return replace(ind.LIVE, **updates)


def one(cfg: ind.InductionConfig, n_layers: int, seed: int) -> dict[str, Any]:
    """Train and study one model; seconds to the end of its phase-change window."""
    cpu: dict[int, float] = {}

    def listen(event: Event) -> None:
        if isinstance(event, Evaluation):
            cpu[event.step] = time.thread_time()

    load = os.getloadavg()[0]
    c0 = time.thread_time()
    r = ind.study(cfg, n_layers, seed, listener=listen)
    assert r is not None  # no stop token: the study runs to its end
    phase, v = r["phase_change"], r["verdict"]
    end = phase["window"][1] if phase["window"] else None
    feeders = r.get("feeder_heads", [])
    return {
        "seed": seed,
        "layers": n_layers,
        "window": phase["window"],
        "found": phase["found"],
        "seconds": r["phase_change_seconds"],
        "cpu_seconds": cpu[end] - c0 if end in cpu else None,
        "induction_share": v["induction_share"],
        "feeder_prev_token": max((f["prev_token_score"] for f in feeders), default=None),
        "feeders": [f["head"] for f in feeders],
        "circuit": v["circuit"],
        "train_seconds": r["train_seconds"],
        "load": [load, os.getloadavg()[0]],
    }


def row(name: str, r: dict[str, Any]) -> str:
    fmt = lambda v, spec: "—" if v is None else format(v, spec)  # noqa: E731
    window = "—" if r["window"] is None else f"{r['window'][0]}–{r['window'][1]}"
    return (
        f"{name:<9} {r['seed']:>4} {r['layers']:>2}  {window:>9}  {fmt(r['seconds'], '6.1f')} s"
        f"  {fmt(r['cpu_seconds'], '6.1f')} s  {r['induction_share']:6.2f}  "
        f"{fmt(r['feeder_prev_token'], '5.2f'):>5} {','.join(r['feeders']) or '—':<12}"
        f"{'yes' if r['circuit'] else 'no':<4} {r['load'][0]:5.2f}→{r['load'][1]:5.2f}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--reference", action="store_true", help="also run the planning recipe")
    parser.add_argument("--control", action="store_true", help="also run the 1-layer model")
    parser.add_argument(
        "--set",
        nargs="+",
        default=[],
        metavar="NAME=VALUE",
        help="change fields of the live recipe for this run",
    )
    parser.add_argument("--json", help="write the measurements to this file")
    args = parser.parse_args(argv)
    live = recipe(args.set)
    torch.set_num_threads(args.threads)
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), {os.cpu_count()} CPUs,"
        f" load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}"
    )
    print(
        f"live recipe{' (changed: ' + ' '.join(args.set) + ')' if args.set else ''}: {asdict(live)}"
    )
    print(
        "recipe     seed  L     window  to window end   (CPU)  ind/ideal  prev feeders    "
        "circuit load"
    )
    rows: dict[str, list[dict[str, Any]]] = {"live": [], "control": [], "planning": []}
    for seed in args.seeds:
        rows["live"].append(one(live, 2, seed))
        print(row("live", rows["live"][-1]), flush=True)
        if args.control:
            rows["control"].append(one(live, 1, seed))
            print(row("control", rows["control"][-1]), flush=True)
        if args.reference:
            rows["planning"].append(one(PLANNING, 2, seed))
            print(row("planning", rows["planning"][-1]), flush=True)
    summarise(rows)
    if args.json:
        ran_on = {"threads": args.threads, "versions": versions(), "recipe": asdict(live)}
        write_json(args.json, {**ran_on, **rows})
    return 0


def summarise(rows: dict[str, list[dict[str, Any]]]) -> None:
    live = [r["seconds"] for r in rows["live"] if r["seconds"] is not None]
    formed = sum(r["circuit"] for r in rows["live"])
    median = f"median {statistics.median(live):.1f} s" if live else "no window"
    print(
        f"live: circuit formed in {formed} of {len(rows['live'])} seeds; {median} to the end "
        "of the phase-change window"
    )
    if rows["control"]:
        print(
            f"1-layer control: induction head in {sum(r['circuit'] for r in rows['control'])}"
            f" of {len(rows['control'])} seeds"
        )
    ref = [r["seconds"] for r in rows["planning"] if r["seconds"] is not None]
    if live and ref:
        ratio = statistics.median(live) / statistics.median(ref)
        idle = ratio * statistics.median(PLANNING_IDLE_SECONDS)
        print(
            f"live / planning recipe, same run: {ratio:.2f} (medians); the planning recipe took"
            f" {statistics.median(PLANNING_IDLE_SECONDS):.1f} s on an idle machine, so the live"
            f" one ≈ {idle:.1f} s there"
        )


if __name__ == "__main__":
    sys.exit(main())
