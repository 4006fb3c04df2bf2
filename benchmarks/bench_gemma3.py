"""Gemma 3 270M in headlab against transformers, one run: load and forward times, medians.

1. Loading: headlab's cached load (``zoo.load("gemma3")``: the converted model mapped from its
   file, and the 262,144-token tokenizer) in fresh processes, median wall and CPU seconds;
   transformers' own load of the same GGUF (dequantising it), once, in this run.
2. A 64-token forward pass with all 72 heads' weights recorded, against transformers' eager
   forward with ``output_attentions=True`` on the same tokens; contenders interleaved round by
   round, medians and their ratio. The largest relative differences of the logits and of the
   weights are printed beside them.

Run: ``python benchmarks/bench_gemma3.py [--rounds 10] [--loads 5] [--threads 1]`` (needs
``headlab models --fetch gemma3`` once, and ``headlab[gemma3]`` for transformers).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

import torch

from headlab import Trace, gemma3, zoo

TEXT = (
    "The river was high after the rain, and the ferry waited at the bank until the water fell. "
    "She opened the letter, read it twice, and put it back in the drawer without a word. "
    "When the bell rang, the children ran out of the school and across the field to the road."
)

LOAD_SCRIPT = """
import json, time, torch
torch.set_num_threads({threads})
from headlab import zoo
wall, cpu = time.perf_counter(), time.process_time()
model, tokenizer = zoo.load('gemma3')
print(json.dumps({{'wall_s': time.perf_counter() - wall, 'cpu_s': time.process_time() - cpu}}))
"""


def cached_loads(repeats: int, threads: int) -> dict[str, float]:
    """Medians over fresh processes (imports excluded): wall and CPU seconds of zoo.load."""
    runs = []
    for _ in range(repeats):
        done = subprocess.run([sys.executable, "-c", LOAD_SCRIPT.format(threads=threads)],
                              capture_output=True, text=True, check=True)  # fmt: skip
        runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    return {key: statistics.median(r[key] for r in runs) for key in runs[0]}


def measure(fns: dict[str, Callable[[], object]], rounds: int) -> dict[str, float]:
    for fn in fns.values():  # warm-up
        fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(ts) for name, ts in times.items()}


def relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--loads", type=int, default=5, help="fresh processes for the load")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if not gemma3.is_fetched():
        print("skipped: gemma3 is not fetched; run `headlab models --fetch gemma3` first")
        return 0
    loads = cached_loads(args.loads, args.threads)
    t0 = time.perf_counter()
    hf, _ = gemma3.load_transformers(gemma3.model_dir())
    hf_load = time.perf_counter() - t0
    model, tokenizer = zoo.load("gemma3")
    x = torch.tensor([tokenizer.encode(TEXT)[:64]])  # (1, 64)

    def theirs() -> object:
        with torch.inference_mode():
            return hf(x, output_attentions=True)

    def ours() -> tuple[torch.Tensor, Trace]:
        trace = Trace(only=("weights",))
        with torch.inference_mode():
            return model(x, trace=trace), trace

    names = ("transformers eager forward, output_attentions", "headlab forward, 72 heads traced")
    medians = measure(dict(zip(names, (theirs, ours), strict=True)), args.rounds)
    ref, (logits, trace) = theirs(), ours()
    weights = max(relative_error(trace[f"blocks.{l}.attn.weights"], a)
                  for l, a in enumerate(ref.attentions))  # type: ignore[attr-defined]  # fmt: skip
    print(f"Gemma 3 270M, {x.shape[1]} tokens, {args.rounds} rounds, {args.threads} thread(s)")
    for name, t in medians.items():
        print(f"  {name:48s} {t * 1e3:8.1f} ms (median)")
    print(f"  headlab / transformers forward = {medians[names[1]] / medians[names[0]]:.2f}")
    print(f"  largest relative difference: logits {relative_error(logits, ref.logits):.1e}, "  # type: ignore[attr-defined]
          f"attention weights {weights:.1e}")  # fmt: skip
    print(f"cached load (zoo.load), median of {args.loads} fresh processes: "
          f"{loads['wall_s']:.2f} s wall, {loads['cpu_s']:.2f} s CPU")  # fmt: skip
    print(f"transformers' GGUF load in this run: {hf_load:.1f} s "
          f"({hf_load / loads['wall_s']:.0f}× headlab's cached load)")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
