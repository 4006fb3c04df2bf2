"""What raising determinism costs: torch.use_deterministic_algorithms and one thread vs two.

Trains the induction experiment's quick 2-layer model for a few hundred steps under each
setting, interleaved round by round, and prints the median wall time of each as a ratio to the
plain one-thread run, and whether the final weights are bit-identical to it.

    python benchmarks/bench_determinism.py [--steps 300] [--rounds 3]

The results go to benchmarks/results/determinism.json (``--json PATH`` elsewhere).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import time
from dataclasses import replace

import torch

from headlab.experiments import induction as ind
from headlab.training.tasks import RepeatTask
from headlab.training.train import train
from record import count, path_for, save


def run(steps: int, threads: int, deterministic: bool) -> tuple[float, str]:
    """Seconds to train, and the SHA-256 of the final weights."""
    cfg = replace(ind.QUICK, steps=steps)
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(deterministic)
    try:
        model = ind.make_model(cfg, 2, seed=0)
        task = RepeatTask(cfg.vocab_size, cfg.seq_len, cfg.min_span, cfg.max_span)
        t0 = time.perf_counter()
        train(model, ind.train_config(cfg, 0), lambda g: task.batch(cfg.batch_size, g))
        seconds = time.perf_counter() - t0
    finally:
        torch.use_deterministic_algorithms(False)
    blob = b"".join(p.detach().numpy().tobytes() for p in model.parameters())
    return seconds, hashlib.sha256(blob).hexdigest()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--rounds", type=count(), default=3)
    parser.add_argument("--json", default=path_for("determinism"), help="where the results go")
    args = parser.parse_args()
    settings = {
        "1 thread": (1, False),
        "1 thread, deterministic algorithms": (1, True),
        "2 threads": (2, False),
    }
    times: dict[str, list[float]] = {k: [] for k in settings}
    hashes: dict[str, set[str]] = {k: set() for k in settings}
    for _ in range(args.rounds):
        for name, (threads, det) in settings.items():
            seconds, digest = run(args.steps, threads, det)
            times[name].append(seconds)
            hashes[name].add(digest)
    base = statistics.median(times["1 thread"])
    ref = next(iter(hashes["1 thread"]))
    print(
        f"torch {torch.__version__}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}, "
        f"{args.steps} steps, medians of {args.rounds} interleaved rounds"
    )
    rows = []
    for name in settings:
        same = hashes[name] == {ref}
        weights = (
            f"{'bit-identical to 1 thread' if same else 'differ from 1 thread'}"
            f"{'' if len(hashes[name]) == 1 else ' (and between rounds!)'}"
        )
        median = statistics.median(times[name])
        print(f"{name:38s} {median:7.2f} s  × {median / base:.2f}  weights {weights}")
        rows.append([name, f"{median:.2f}", f"{median / base:.2f}", weights])
    columns = [
        "setting",
        f"median s ({args.steps} steps, {args.rounds} rounds)",
        "× 1 thread",
        "final weights",
    ]
    save(args.json, columns, rows, {k: sorted(v) for k, v in times.items()})


if __name__ == "__main__":
    main()
