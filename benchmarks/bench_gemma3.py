"""Gemma 3 270M in headlab against transformers, one run: load and forward times, medians.

1. Loading: headlab's cached load (``zoo.load("gemma3")``: the converted model mapped from its
   file, and the 262,144-token tokenizer) in fresh processes, median wall and CPU seconds, its
   two parts (the model, the tokenizer) measured the same way, and ``import torch`` beside them
   (not part of the load: every command pays it); the load average at the start and the end,
   since a shared machine's wall seconds mean little without it. Then transformers' own load of
   the same GGUF (dequantising it), once, in this run.
2. A 64-token forward pass with all 72 heads' weights recorded, against transformers' eager
   forward with ``output_attentions=True`` on the same tokens; contenders interleaved round by
   round, medians and their ratio. The largest relative differences of the logits and of the
   weights are printed beside them.

Run: ``python benchmarks/bench_gemma3.py [--rounds 10] [--loads 5] [--threads 1] [--load-only]``
(needs ``headlab models --fetch gemma3`` once, and ``headlab[gemma3]`` for transformers, which
``--load-only`` leaves out).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

import torch

from headlab import Trace, gemma3, zoo
from record import count

TEXT = (
    "The river was high after the rain, and the ferry waited at the bank until the water fell. "
    "She opened the letter, read it twice, and put it back in the drawer without a word. "
    "When the bell rang, the children ran out of the school and across the field to the road."
)

# one fresh process: import torch, then the whole cached load, then its two parts again (the
# parts' files are in the page cache by then, as they are for any later load)
LOAD_SCRIPT = """
import json, time
def clock():
    return time.perf_counter(), time.process_time()
def since(t):
    return [time.perf_counter() - t[0], time.process_time() - t[1]]
t = clock()
import torch
out = {{'import torch': since(t)}}
torch.set_num_threads({threads})
from headlab import gemma3, zoo
from headlab.model import Transformer
t = clock()
model, tokenizer = zoo.load('gemma3')
out['zoo.load("gemma3")'] = since(t)
t = clock()
Transformer.load(gemma3.model_dir())
out['  of which the model (mapped)'] = since(t)
t = clock()
zoo.Tokenizer.from_dir(gemma3.model_dir(), 'gemma3')
out['  of which the tokenizer'] = since(t)
print(json.dumps(out))
"""


def cached_loads(repeats: int, threads: int) -> dict[str, dict[str, float]]:
    """Per step, medians over fresh processes of its wall and CPU seconds (after one untimed
    process that fills the page cache)."""
    runs = []
    for k in range(repeats + 1):
        done = subprocess.run(
            [sys.executable, "-c", LOAD_SCRIPT.format(threads=threads)],
            capture_output=True,
            text=True,
            check=True,
        )
        if k:
            runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    return {
        step: {
            "wall_s": statistics.median(r[step][0] for r in runs),
            "cpu_s": statistics.median(r[step][1] for r in runs),
        }
        for step in runs[0]
    }


def print_loads(loads: dict[str, dict[str, float]], repeats: int, load: list[tuple]) -> None:
    print(
        f"cached load, medians of {repeats} fresh processes; load average (1, 5, 15 min) "
        f"{load[0]} at the start, {load[1]} at the end"
    )
    for step, f in loads.items():
        print(f"  {step:36s} {f['wall_s']:6.2f} s wall {f['cpu_s']:6.2f} s CPU")


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
    parser.add_argument("--rounds", type=count(), default=10)
    parser.add_argument("--loads", type=count(), default=5, help="fresh processes for the load")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--load-only", action="store_true", help="the cached load alone")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if not gemma3.is_fetched():
        print("skipped: gemma3 is not fetched; run `headlab models --fetch gemma3` first")
        return 0
    before = tuple(round(x, 2) for x in os.getloadavg())
    all_loads = cached_loads(args.loads, args.threads)
    print_loads(all_loads, args.loads, [before, tuple(round(x, 2) for x in os.getloadavg())])
    if args.load_only:
        return 0
    loads = all_loads['zoo.load("gemma3")']
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
    weights = max(
        relative_error(trace[f"blocks.{l}.attn.weights"], a) for l, a in enumerate(ref.attentions)
    )  # type: ignore[attr-defined]
    print(f"Gemma 3 270M, {x.shape[1]} tokens, {args.rounds} rounds, {args.threads} thread(s)")
    for name, t in medians.items():
        print(f"  {name:48s} {t * 1e3:8.1f} ms (median)")
    print(f"  headlab / transformers forward = {medians[names[1]] / medians[names[0]]:.2f}")
    print(
        f"  largest relative difference: logits {relative_error(logits, ref.logits):.1e}, "  # type: ignore[attr-defined]
        f"attention weights {weights:.1e}"
    )
    print(
        f"cached load (zoo.load), median of {args.loads} fresh processes: "
        f"{loads['wall_s']:.2f} s wall, {loads['cpu_s']:.2f} s CPU"
    )
    print(
        f"transformers' GGUF load in this run: {hf_load:.1f} s "
        f"({hf_load / loads['wall_s']:.0f}× headlab's cached load)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
