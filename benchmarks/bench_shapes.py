"""Speed and memory of ``trace_shapes``: milliseconds per report, for small and huge layers.

The web page asks for a report on every keystroke, so each call should take under 5 ms in-process.
For each configuration it times, interleaved round by round so a busy machine slows all alike:
``trace_shapes`` with its meta module cached (the page's case, repeated sizes), ``trace_shapes``
cold (cache cleared before each call) and, as the reference measured in the same run, one real
CPU forward pass of the small layer. It prints medians, each as a ratio to that reference, and the
process's peak resident memory at start, after one warm-up call of each and after all rounds
(meta tensors hold no storage, so an 800 TB attention pattern should not move it).

Run: ``make bench`` or ``python benchmarks/bench_shapes.py [--rounds 200]``; the results go to
benchmarks/results/shapes.json (``--json PATH`` elsewhere).
"""

from __future__ import annotations

import argparse
import resource
import statistics
import time
from collections.abc import Callable

import torch

from headlab import MultiHeadAttention
from headlab.shapes import trace_shapes
from headlab.shapes.report import _meta_module
from record import count, path_for, save

# (label, d_model, h, n, B, h_kv, bias, dtype, cache_len)
CONFIGS = [
    ("small MHA 512/8, n=10, B=2", 512, 8, 10, 2, None, True, "float32", 0),
    ("GQA 4096/32/8, n=4096, cache 4096", 4096, 32, 4096, 1, 8, False, "bfloat16", 4096),
    ("huge 12288/96, n=131072, B=64", 12288, 96, 131072, 64, None, True, "float32", 0),
]


def peak_rss_mib() -> float:
    """The process's peak resident memory so far (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def contenders() -> dict[str, Callable[[], object]]:
    small = MultiHeadAttention(512, 8).eval()
    x = torch.randn(2, 10, 512)
    out: dict[str, Callable[[], object]] = {"reference: CPU forward, small": lambda: small(x)}
    for label, *args in CONFIGS:
        out[f"{label} (cached)"] = lambda a=args: trace_shapes(*a)
    for label, *args in CONFIGS:  # last in each round: they empty the module cache
        out[f"{label} (cold)"] = lambda a=args: (_meta_module.cache_clear(), trace_shapes(*a))
    return out


def measure(rounds: int) -> tuple[dict[str, float], float]:
    """Median seconds per call for each contender, interleaved round by round, and the peak
    RSS after one warm-up call of each (PyTorch loads its meta decompositions lazily)."""
    fns = contenders()
    for fn in fns.values():
        fn()
    rss_warm = peak_rss_mib()
    times: dict[str, list[float]] = {name: [] for name in fns}
    with torch.no_grad():
        for _ in range(rounds):
            for _label, *args in CONFIGS:  # refill the module cache, untimed
                trace_shapes(*args)
            for name, fn in fns.items():
                start = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - start)
    return {name: statistics.median(ts) for name, ts in times.items()}, rss_warm


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=count(), default=200)
    parser.add_argument("--json", default=path_for("shapes"), help="where the results go")
    args = parser.parse_args()
    torch.set_num_threads(1)
    rss_start = peak_rss_mib()
    medians, rss_before = measure(args.rounds)
    rss_after = peak_rss_mib()
    ref = medians["reference: CPU forward, small"]
    print(f"trace_shapes, median of {args.rounds} interleaved rounds (target: < 5 ms each)")
    print(f"{'call':<52} {'median ms':>10} {'× reference':>12}")
    for name, sec in medians.items():
        print(f"{name:<52} {sec * 1e3:>10.3f} {sec / ref:>12.2f}")
    print(
        f"peak RSS: {rss_start:.0f} MiB at start, {rss_before:.0f} MiB after one warm-up call "
        f"each, {rss_after:.0f} MiB after all {args.rounds} rounds"
    )
    report = trace_shapes(12288, 96, 131072, 64)
    print(f"the huge config's attention pattern alone would be {report.memory['n2_bytes']:,} bytes")
    rss = {"start": rss_start, "after warm-up": rss_before, "after all rounds": rss_after}
    rows = [[name, f"{sec * 1e3:.3f}", f"{sec / ref:.2f}"] for name, sec in medians.items()]
    rows += [[f"peak RSS {when} (MiB)", f"{mib:.0f}", ""] for when, mib in rss.items()]
    columns = ["call", f"median ms ({args.rounds} rounds)", "× reference"]
    save(args.json, columns, rows, {"median_s": medians, "peak_rss_mib": rss}, threads=1)


if __name__ == "__main__":
    main()
