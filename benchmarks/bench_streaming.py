"""Peak memory and time of head analysis on long inputs: streaming (each layer's weights scored as
the layer runs, then dropped) against keeping every layer's weights and scoring them after the
pass, on a model of SmolLM2-135M's shape with random weights, measured in one run.

The model: 30 layers, 9 query heads sharing 3 key/value heads, d_model 576, d_ff 1536, RMSNorm,
rotary positions, SwiGLU (headlab.model.ModelConfig). The probe: n random tokens repeated 4
times (Olsson et al. 2022's evaluator); all scores, content included (each layer's weights are
(1, 9, n, n): the probe alone); no pattern kept (``keep=()``) on either
path, so the paths differ only in when each layer's weights are scored.

Memory: each (path, n) runs in its own process. After the model is built and one short
analysis has warmed it up, the kernel's peak-resident-set counter is reset
(``/proc/self/clear_refs``); the figure is the process's peak resident set size (VmHWM) during
the analysis minus its resident size just before: the extra memory the analysis needed
(Linux only; glibc's mmap threshold is fixed at 64 KiB so that freed tensors leave the
resident set at once); the largest of the ``--repeats`` runs is shown. Time: the median of
``--repeats`` runs, the two paths alternating run by run; the ratio is keep-everything /
streaming. A keep-everything run that would need more than ``--max-fraction`` (default half) of
the memory available is skipped and says so.

Run: ``python benchmarks/bench_streaming.py [--n 512 1024 2048] [--repeats 3] [--threads 1]
[--max-fraction 0.5]``; the results go to benchmarks/results/streaming.json (``--json PATH``
elsewhere).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from headlab.heads import analyse, build_targets, layer_scorer
from headlab.heads.report import _report
from headlab.measure import Probe, random_repeat_probe, run_patterns
from headlab.model import ModelConfig, Transformer
from record import count, path_for, save

SMOLLM2_SHAPE = ModelConfig(
    vocab_size=49152,
    d_model=576,
    n_layers=30,
    n_heads=9,
    n_kv_heads=3,
    d_ff=1536,
    max_len=8192,
    positional="rotary",
    rope_theta=100000.0,
    norm="pre",
    norm_kind="rmsnorm",
    activation="silu",
    mlp="gated",
    bias=False,
    mlp_bias=False,
)
PATHS = ("streaming", "keep-everything")
MIB = 1 << 20


def _status(field: str) -> int:
    """A /proc/self/status field in bytes (VmRSS, VmHWM)."""
    text = Path("/proc/self/status").read_text()
    match = re.search(rf"^{field}:\s+(\d+) kB", text, re.M)
    assert match, f"no {field} in /proc/self/status"
    return int(match.group(1)) * 1024


def keep_everything(model: Transformer, probe: Probe) -> None:
    """The path streaming replaced: every layer's weights held (run_patterns), then each layer
    scored by the same per-layer reduction analyse() uses, with no pattern kept."""
    score = layer_scorer(build_targets(probe, causal=model.config.causal), keep=())
    patterns = run_patterns(model, probe.tokens)
    _report(probe, [score(l, w) for l, w in enumerate(patterns)], keep=())


def child(path: str, n: int) -> dict:
    """One analysis on one path in this process: seconds and peak extra bytes."""
    torch.manual_seed(0)
    model = Transformer(SMOLLM2_SHAPE).eval()

    def analysis(probe: Probe) -> None:
        analyse(model, probe, keep=()) if path == "streaming" else keep_everything(model, probe)

    analysis(random_repeat_probe(None, 49152, 16, batch=1))
    probe = random_repeat_probe(None, 49152, n, length=n // 4, batch=1)
    Path("/proc/self/clear_refs").write_text("5")  # reset the peak resident set size
    before = _status("VmRSS")
    t0 = time.perf_counter()
    analysis(probe)
    seconds = time.perf_counter() - t0
    return {
        "path": path,
        "n": probe.n,
        "seconds": seconds,
        "peak_extra_bytes": _status("VmHWM") - before,
    }


def available_bytes() -> int:
    text = Path("/proc/meminfo").read_text()
    match = re.search(r"^MemAvailable:\s+(\d+) kB", text, re.M)
    return int(match.group(1)) * 1024 if match else 0


def run_child(path: str, n: int, threads: int) -> dict:
    cmd = [sys.executable, __file__, "--child", path, "--n", str(n), "--threads", str(threads)]
    # every allocation of 64 KiB or more gets its own mapping, returned when freed, so the
    # resident size follows the live tensors (glibc otherwise raises this threshold as it goes
    # and keeps freed blocks in its heap, and the peak depends on fragmentation)
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"}
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, env=env).stdout
    return json.loads(out.strip().splitlines()[-1])


def measure(n: int, paths: list[str], repeats: int, threads: int) -> dict[str, dict]:
    """Median seconds and peak of each path at n, the paths interleaved round by round so
    that a busy machine slows each alike."""
    runs: dict[str, list[dict]] = {p: [] for p in paths}
    for _ in range(repeats):
        for p in paths:
            runs[p].append(run_child(p, n, threads))
    return {
        p: {
            "path": p,
            "n": rs[0]["n"],
            "seconds": statistics.median(r["seconds"] for r in rs),
            "peak_extra_bytes": max(r["peak_extra_bytes"] for r in rs),
        }
        for p, rs in runs.items()
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, nargs="+", default=[512, 1024, 2048])
    parser.add_argument("--repeats", type=count(), default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch threads per process")
    parser.add_argument("--json", default=path_for("streaming"), help="where the results go")
    parser.add_argument(
        "--max-fraction",
        type=float,
        default=0.5,
        help="skip keep-everything when its estimate exceeds this share of the available memory",
    )
    parser.add_argument("--child", choices=PATHS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.child:
        print(json.dumps(child(args.child, args.n[0])))
        return 0
    c = SMOLLM2_SHAPE
    print(
        f"SmolLM2-135M's shape, random weights: {c.n_layers} layers × {c.n_heads} heads "
        f"({c.n_kv_heads} K/V), d_model {c.d_model}; {args.threads} thread(s), median of "
        f"{args.repeats}; memory = peak RSS (VmHWM) − RSS before, per process"
    )
    header = f"{'n':>6} {'path':>16} {'time s':>8} {'peak extra MiB':>15} {'one layer MiB':>14}"
    print(header)
    rows = []
    for n in args.n:
        layer = 2 * c.n_heads * n * n * 4  # one layer's (2, h, n, n) float32
        paths = list(PATHS)
        if 1.5 * c.n_layers * layer > available_bytes() * args.max_fraction:
            paths.remove("keep-everything")
            print(
                f"{n:>6} {'keep-everything':>16}  skipped: needs about "
                f"{1.5 * c.n_layers * layer / (1 << 30):.1f} GiB"
            )
        result = measure(n, paths, args.repeats, args.threads)
        for r in result.values():
            rows.append(r)
            print(
                f"{r['n']:>6} {r['path']:>16} {r['seconds']:>8.2f} "
                f"{r['peak_extra_bytes'] / MIB:>15.0f} {layer / MIB:>14.0f}"
            )
        if len(result) == 2:
            s, k = result["streaming"], result["keep-everything"]
            print(
                f"{'':>6} keep-everything / streaming: memory "
                f"{k['peak_extra_bytes'] / s['peak_extra_bytes']:.1f}×, "
                f"time {k['seconds'] / s['seconds']:.2f}×"
            )
    cells = [
        [
            r["n"],
            r["path"],
            f"{r['seconds']:.1f}",
            f"{r['peak_extra_bytes'] / MIB:,.0f}",
            f"{2 * c.n_heads * r['n'] ** 2 * 4 / MIB:,.0f}",
        ]
        for r in rows
    ]
    columns = [
        "n",
        "path",
        f"time s (median of {args.repeats})",
        "peak extra MiB",
        "one layer's (2, h, n, n) float32, MiB",
    ]
    save(args.json, columns, cells, rows, threads=args.threads)
    return 0


if __name__ == "__main__":
    sys.exit(main())
