"""Speed of headlab's attention layer as ratios against PyTorch's own, measured in one run.

For each (B, n, d_model, h) it times, interleaved round by round so that a busy machine slows every
contender alike: headlab's fused path, headlab's explicit path, ``torch.nn.MultiheadAttention`` and
a plain 10-line SDPA module, for inference and for forward + backward. It prints median times,
ratios (below 1.0 means headlab is faster) and GFLOP/s beside a same-size matmul (the roofline).

Run: ``make bench`` or ``python benchmarks/bench_attention.py [--rounds 15] [--threads N]``; the
results go to benchmarks/results/attention.json (``--json PATH`` elsewhere).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from headlab import MultiHeadAttention
from record import count, path_for, save

CONFIGS = [(8, 128, 512, 8), (4, 512, 512, 8), (1, 1024, 768, 12)]


class PlainSDPA(nn.Module):
    """The shortest honest multi-head attention: packed projection, SDPA, output projection."""

    def __init__(self, d_model: int, h: int) -> None:
        super().__init__()
        self.h = h
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.out = nn.Linear(d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, n, d = x.shape
        q, k, v = self.qkv(x).view(B, n, 3, self.h, d // self.h).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v)  # (B, h, n, d_k)
        return self.out(y.transpose(1, 2).reshape(B, n, d))


def layer_flops(B: int, n: int, d: int) -> float:
    """Multiply-adds ×2: four d×d projections (8·B·n·d²) plus QKᵀ and A·V (4·B·n²·d)."""
    return 8 * B * n * d * d + 4 * B * n * n * d


def contenders(B: int, n: int, d: int, h: int) -> dict[str, Callable[[torch.Tensor], torch.Tensor]]:
    mine = MultiHeadAttention(d, h)
    torch_mha = mine.to_torch(batch_first=True)
    plain = PlainSDPA(d, h)
    w = nn.Parameter(torch.randn(d, 4 * d))  # a parameter, so backward also costs 2 matmuls
    return {
        "headlab fused": lambda x: mine(x, impl="fused"),
        "headlab explicit": lambda x: mine(x, impl="explicit"),
        "nn.MultiheadAttention": lambda x: torch_mha(x, x, x, need_weights=False)[0],
        "plain SDPA module": plain,
        # the roofline: one matmul as big as the four projections together
        "matmul": lambda x: x.view(-1, d) @ w,
    }


def time_once(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, backward: bool) -> float:
    start = time.perf_counter()
    if backward:
        fn(x).sum().backward()
    else:
        with torch.inference_mode():
            fn(x)
    return time.perf_counter() - start


def bench(B: int, n: int, d: int, h: int, backward: bool, rounds: int) -> dict[str, float]:
    """Median seconds per call for each contender, rounds interleaved."""
    torch.manual_seed(0)
    fns = contenders(B, n, d, h)
    x = torch.randn(B, n, d, requires_grad=backward)
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(2):  # warm-up
        for fn in fns.values():
            time_once(fn, x, backward)
    for _ in range(rounds):
        for name, fn in fns.items():
            times[name].append(time_once(fn, x, backward))
    return {name: statistics.median(t) for name, t in times.items()}


def report(rounds: int) -> list[dict[str, object]]:
    rows = []
    for B, n, d, h in CONFIGS:
        for backward in (False, True):
            med = bench(B, n, d, h, backward, rounds)
            passes = 3 if backward else 1  # backward costs two more products per product
            flops = layer_flops(B, n, d) * passes
            roof = 2 * B * n * d * 4 * d * passes / med["matmul"]
            fused = med["headlab fused"]
            rows.append(
                {
                    "B": B,
                    "n": n,
                    "d_model": d,
                    "h": h,
                    "mode": "fwd+bwd" if backward else "inference",
                    "ms": {k: round(v * 1e3, 3) for k, v in med.items()},
                    "fused / nn.MultiheadAttention": fused / med["nn.MultiheadAttention"],
                    "fused / plain SDPA": fused / med["plain SDPA module"],
                    "explicit / fused": med["headlab explicit"] / fused,
                    "fused GFLOP/s": flops / fused / 1e9,
                    "matmul GFLOP/s": roof / 1e9,
                    "fused share of matmul rate": (flops / fused) / roof,
                }
            )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=count(), default=15)
    parser.add_argument("--json", default=path_for("attention"), help="where the results go")
    parser.add_argument("--threads", type=int, help="torch threads (default: torch's own choice)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, medians of {args.rounds}")
    header = (
        f"{'(B, n, d, h)':<20}{'mode':<11}{'fused ms':>9}{'/torch':>8}{'/plain':>8}"
        f"{'expl/fused':>11}{'GFLOP/s':>9}{'matmul':>8}{'share':>7}"
    )
    print(header)
    rows = report(args.rounds)
    for r in rows:
        shape = f"({r['B']}, {r['n']}, {r['d_model']}, {r['h']})"
        print(
            f"{shape:<20}{r['mode']:<11}{r['ms']['headlab fused']:>9.2f}"  # type: ignore[index]
            f"{r['fused / nn.MultiheadAttention']:>8.2f}{r['fused / plain SDPA']:>8.2f}"
            f"{r['explicit / fused']:>11.2f}{r['fused GFLOP/s']:>9.0f}{r['matmul GFLOP/s']:>8.0f}"
            f"{r['fused share of matmul rate']:>7.0%}"
        )
    save(args.json, COLUMNS, [_cells(r) for r in rows], rows, threads=torch.get_num_threads())


COLUMNS = [
    "(B, n, d_model, h)",
    "mode",
    "fused ms",
    "/ nn.MultiheadAttention",
    "/ plain SDPA module",
    "explicit / fused",
    "GFLOP/s",
    "matmul GFLOP/s",
    "share",
]


def _cells(r: dict) -> list[str]:
    """A row of the documentation's table (a ratio below 1.0: headlab's fused path is faster)."""
    return [
        f"({r['B']}, {r['n']}, {r['d_model']}, {r['h']})",
        r["mode"],
        f"{r['ms']['headlab fused']:.1f}",
        f"{r['fused / nn.MultiheadAttention']:.2f}",
        f"{r['fused / plain SDPA']:.2f}",
        f"{r['explicit / fused']:.2f}",
        f"{r['fused GFLOP/s']:.0f}",
        f"{r['matmul GFLOP/s']:.0f}",
        f"{r['fused share of matmul rate']:.0%}",
    ]


if __name__ == "__main__":
    main()
