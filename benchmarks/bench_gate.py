"""What gating every label by its random-weights floor costs ``headlab heads``: the head analysis
with floors (:func:`headlab.heads.baselines.label_heads`, the default) against the same
analysis by thresholds alone (``--no-floors``), on the command's default probe, for the default
model, all-MiniLM-L6-v2 and SmolLM2-135M, measured in one run.

Four contenders per model, interleaved round by round so that a busy machine slows each alike,
medians reported as ratios against the ungated analysis:

    ungated        label_heads(floors=False): analyse alone
    gated, cold    floors computed: 3 random models drawn and analysed (nothing cached)
    gated, disk    floors read from the cache folder (a second `headlab heads` process)
    gated, memory  floors kept in the process (the server's second request)

Run: ``python benchmarks/bench_gate.py [--rounds 3] [--models default,minilm,smollm2]
[--threads 1]``; the results go to benchmarks/results/gate.json (``--json PATH`` elsewhere).
Models not available here are skipped and named in the results.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable

import torch

from headlab import zoo
from headlab.heads import baselines as B
from headlab.measure import build_probe
from record import count, path_for, save

CONTENDERS = ("ungated", "gated, cold", "gated, disk", "gated, memory")


class Folders:
    """Fresh cache folders inside one temporary folder, removed at exit."""

    def __init__(self) -> None:
        self.root = tempfile.TemporaryDirectory(prefix="bench-gate-")

    def mkdtemp(self) -> str:
        return tempfile.mkdtemp(dir=self.root.name)


FOLDERS = Folders()


def contenders(name: str) -> dict[str, Callable[[], object]]:
    """The four ways to label ``name``'s heads on `headlab heads`'s default probe."""
    model, tokenizer = zoo.load(name)
    c = model.config
    probe = build_probe("repeat", tokenizer, c.max_len, c.vocab_size)

    def gated(forget_disk: bool) -> Callable[[], object]:
        def run() -> object:
            B._MEMORY.clear()
            if forget_disk:  # a fresh cache folder: nothing stored
                os.environ["HEADLAB_CACHE"] = FOLDERS.mkdtemp()
            return B.label_heads(model, probe, keep=())

        return run

    def memory() -> object:
        return B.label_heads(model, probe, keep=())

    return {
        "ungated": lambda: B.label_heads(model, probe, keep=(), floors=False),
        "gated, cold": gated(True),
        "gated, disk": gated(False),
        "gated, memory": memory,
    }


def measure(name: str, rounds: int) -> dict[str, list[float]]:
    """Seconds of each contender, ``rounds`` interleaved rounds (one warm-up first)."""
    runs = contenders(name)
    for run in runs.values():
        run()
    times: dict[str, list[float]] = {k: [] for k in runs}
    for _ in range(rounds):
        for key, run in runs.items():
            start = time.perf_counter()
            run()
            times[key].append(time.perf_counter() - start)
    return times


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=count(), default=3)
    parser.add_argument("--models", default="default,minilm,smollm2")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's own)")
    parser.add_argument("--json", default=str(path_for("gate")))
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    available = {i.name for i in zoo.list_models() if i.available}
    load_before = os.getloadavg()[0]
    results, rows, skipped = {}, [], []
    for name in args.models.split(","):
        if name not in available:
            skipped.append(name)
            continue
        times = measure(name, args.rounds)
        med = {k: statistics.median(v) for k, v in times.items()}
        results[name] = {"seconds": times, "median": med}
        rows.append(
            [
                name,
                f"{med['ungated']:.2f} s",
                *(f"{med[k] / med['ungated']:.2f}×" for k in CONTENDERS[1:]),
            ]
        )
        print(name, {k: round(v, 3) for k, v in med.items()}, file=sys.stderr)
    load_after = os.getloadavg()[0]
    columns = ["model", "ungated (median)", *(f"{k} / ungated" for k in CONTENDERS[1:])]
    extra = {
        "skipped": skipped,
        "rounds": args.rounds,
        "threads": torch.get_num_threads(),
        "load_before": round(load_before, 2),
        "load_after": round(load_after, 2),
    }
    save(args.json, columns, rows, {**results, **extra})
    return 0


if __name__ == "__main__":
    sys.exit(main())
