"""The live run's threads, measured: the page's training run (seed 0 of the live recipe, the
``--quick`` induction study) on 1 thread, 2 threads and "auto", on the machine as it is ("idle")
and beside one CPU-bound process (a Python busy loop in a subprocess, "busy").

Each run is :func:`headlab.server.live.run_study`, the call the route makes, with the threads
:func:`headlab.server.live.choose_threads` gives (auto reads the load average as the server
does). A round runs the three settings one after another, so a change in the machine's load
falls on all three; the figures are medians over the rounds: seconds to the end of the
phase-change window and to the end of the study (training and ablations), each also as a ratio
to 1 thread idle. A run is stopped after ``--cap`` seconds: its figures are then lower bounds
(``capped``). The load average over the last minute is recorded before every run, since "idle"
means only that this script added nothing.

Runtime: 3 settings × ``--rounds`` live runs per condition, each at most ``--cap`` seconds: on
an idle 2-core machine about 10 s a run, so about 2 minutes for ``idle``; ``busy`` takes up to
3 × ``--cap`` more, where two threads collapse. Measured on a 2-core machine that other work
kept at a load average of about 8: ``idle`` with ``--cap 60``, 472 s; ``busy`` with ``--cap
45``, 409 s. Conditions given in separate calls are merged into the one results file (each
keeps its date, cap, rounds and loads); ``runtime_seconds`` is the last call's.

Run: ``python benchmarks/bench_live.py [--conditions idle busy] [--rounds 3] [--cap 120]
[--out benchmarks/results/live.json]``
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

# the optimizer's first import, before any clock (the server does it at startup)
import torch._dynamo  # noqa: F401

from headlab.files import write_json
from headlab.provenance import versions
from headlab.server.live import AUTO, Knobs, choose_threads, machine_load, run_study
from headlab.training.train import StopToken
from headlab.training.watch import Evaluation, Event, Step
from record import command, count, machine

SETTINGS: tuple[int | str, ...] = (1, 2, AUTO)
BUSY_LOOP = "while True: pass"  # one CPU-bound process: load +1, one core held


def one_run(asked: int | str, seed: int, cap: float) -> dict[str, Any]:
    """One live run with ``asked`` threads: its seconds to the phase change's end and in all."""
    load = machine_load()
    threads = choose_threads(asked, os.cpu_count() or 1, load)
    seen: dict[str, Any] = {"step": 0, "walls": {}}

    def listen(event: Event) -> None:
        if isinstance(event, Step):
            seen["step"] = event.step
        elif isinstance(event, Evaluation):
            seen["walls"][event.step] = event.record["wall"]
            seen["phase"] = event.phase_change

    t0 = time.perf_counter()
    result = run_study(Knobs(seed=seed), threads.count, listen, StopToken(cap))
    total = time.perf_counter() - t0
    phase, walls = seen.get("phase") or {}, seen["walls"]
    end = phase["window"][1] if phase.get("found") else None
    # training steps per second, to the last evaluation (a run capped before its first: the
    # steps over the whole time, setup included)
    last = max(walls, default=0)
    rate = last / walls[last] if last else seen["step"] / total
    return {
        "threads": threads.count,
        "load": load,
        "capped": result is None,
        "steps": seen["step"],
        "total_seconds": round(total, 2),
        "steps_per_second": round(rate, 2),
        "phase_seconds": None if end is None else round(walls[end], 2),
        "window": phase.get("window") if phase.get("found") else None,
    }


def condition(name: str, rounds: int, seed: int, cap: float) -> dict[str, Any]:
    """Every setting, ``rounds`` times, interleaved; beside a busy loop when ``name`` is busy."""
    loop = subprocess.Popen([sys.executable, "-c", BUSY_LOOP]) if name == "busy" else None
    try:
        if loop is not None:
            time.sleep(1.0)  # the loop holds its core before the first clock starts
        runs: dict[str, list[dict[str, Any]]] = {str(s): [] for s in SETTINGS}
        for r in range(rounds):
            for asked in SETTINGS:
                run = one_run(asked, seed, cap)
                runs[str(asked)].append(run)
                print(f"  {name} round {r + 1}/{rounds} threads={asked}: {run}", flush=True)
    finally:
        if loop is not None:
            loop.kill()
            loop.wait()
    medians = {s: _medians(rs) for s, rs in runs.items()}
    return {
        "when": datetime.datetime.now().isoformat(timespec="seconds"),
        "seed": seed,
        "rounds": rounds,
        "cap_seconds": cap,
        "busy_process": BUSY_LOOP if loop is not None else None,
        "loads_seen": [run["load"] for rs in runs.values() for run in rs],
        "runs": runs,
        "median": medians,
    }


def _medians(runs: list[dict[str, Any]]) -> dict[str, Any]:
    phase = [r["phase_seconds"] for r in runs if r["phase_seconds"] is not None]
    rate = [r["steps_per_second"] for r in runs if r["steps_per_second"]]
    return {
        "total_seconds": round(statistics.median(r["total_seconds"] for r in runs), 2),
        "phase_seconds": round(statistics.median(phase), 2) if phase else None,
        "steps_per_second": round(statistics.median(rate), 2) if rate else None,
        "threads": sorted({r["threads"] for r in runs}),
        "capped": sum(r["capped"] for r in runs),
        "rounds": len(runs),
    }


def ratios(results: dict[str, Any]) -> None:
    """Each condition's medians over 1 thread idle's (when idle was measured), in place:
    seconds as a ratio (2.0: twice as long), and the slowdown in training steps per second
    (1-thread-idle rate / this rate), which holds for a capped run too."""
    idle = results["conditions"].get("idle", {}).get("median", {}).get("1") or {}
    for cond in results["conditions"].values():
        for med in cond["median"].values():
            for key in ("total_seconds", "phase_seconds"):
                ref, value = idle.get(key), med[key]
                med[f"{key}_ratio"] = round(value / ref, 2) if ref and value else None
            ref, rate = idle.get("steps_per_second"), med["steps_per_second"]
            med["slowdown"] = round(ref / rate, 2) if ref and rate else None


COLUMNS = [
    "condition",
    "threads asked",
    "threads used",
    "load average",
    "to phase change (s)",
    "× 1 thread idle",
    "total (s)",
    "× 1 thread idle",
    "steps/s",
    "slowdown",
    "capped",
]


def rows(results: dict[str, Any]) -> list[list[str]]:
    """The medians, one row per condition and setting (×: over 1 thread idle)."""
    out = []
    for name, cond in results["conditions"].items():
        load = statistics.median(v for v in cond["loads_seen"] if v is not None)
        for setting, m in cond["median"].items():
            phase = "—" if m["phase_seconds"] is None else f"{m['phase_seconds']:.1f}"
            out.append(
                [
                    name,
                    setting,
                    ",".join(map(str, m["threads"])),
                    f"{load:.2f}",
                    phase,
                    _x(m["phase_seconds_ratio"]),
                    f"{m['total_seconds']:.1f}",
                    _x(m["total_seconds_ratio"]),
                    _x(m["steps_per_second"]),
                    _x(m["slowdown"]),
                    f"{m['capped']}/{m['rounds']}",
                ]
            )
    return out


def table(results: dict[str, Any]) -> str:
    """The rows of :func:`rows` as aligned text."""
    every = [COLUMNS, *rows(results)]
    widths = [max(len(r[i]) for r in every) for i in range(len(COLUMNS))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in every)


def _x(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--conditions", nargs="+", choices=("idle", "busy"), default=["idle", "busy"])
    ap.add_argument("--rounds", type=count(), default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--cap", type=float, default=120.0, help="seconds before a run is stopped")
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results/live.json")
    args = ap.parse_args()
    old = json.loads(args.out.read_text()) if args.out.exists() else {}
    results: dict[str, Any] = {
        "command": command(),
        "date": datetime.date.today().isoformat(),
        "benchmark": "live run threads (benchmarks/bench_live.py)",
        "machine": machine(platform=platform.platform()),
        "versions": versions(),
        "conditions": {
            k: v for k, v in old.get("conditions", {}).items() if k not in args.conditions
        },
    }
    t0 = time.perf_counter()
    for name in args.conditions:
        results["conditions"][name] = condition(name, args.rounds, args.seed, args.cap)
    results["conditions"] = dict(
        sorted(results["conditions"].items(), key=lambda kv: kv[0] != "idle")
    )
    ratios(results)
    results["runtime_seconds"] = round(time.perf_counter() - t0, 1)
    results["table"] = {"columns": COLUMNS, "rows": rows(results)}
    write_json(args.out, results)
    print(table(results))
    print(f"{results['runtime_seconds']:.0f} s; figures in {args.out}")


if __name__ == "__main__":
    main()
