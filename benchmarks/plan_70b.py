"""The plan for scoring a 70B model's heads over 10,000 prompts, from figures measured here.

Measured on this machine (CPU, ``--threads`` threads, in CPU seconds of the process so that
other jobs on a shared machine do not count), on a model of SmolLM2-135M's shape with
random weights (bench_streaming's) at n tokens, the probe alone (batch 1: every score,
the content score included, comes from its one forward):
  1. the forward pass with every layer's weights materialised and dropped (a reducing trace
     that keeps nothing): FLOP/s of the forward, counted as 2·(block parameters)·tokens plus
     the attention's 4·n²·d_model per layer and sequence;
  2. the streaming analysis (``analyse(keep=())``): the scoring time is (2) − (1), and the
     scoring rate is pattern weights scored per second (L · (h + 1) · n², the averaged
     heads included);
  3. one attention layer's peak memory in bfloat16 at 1,024 tokens, per (B, h, n, n) weight
     (peak RSS − RSS before, in its own process, as bench_streaming measures).
Then the work of Llama-3-70B's shape (80 layers, d_model 8192, 64 heads, 8 K/V heads,
d_ff 28672, vocabulary 128256; counted on the meta device) at 4,096 tokens is divided by those
rates. GPU figures need two assumptions, printed with them: the GPU's sustained bf16 rate on
these matmuls (``--gpu-tflops``) and the host↔GPU copy rate (``--link-gbs``).

Run: ``python benchmarks/plan_70b.py [--threads 1] [--n 512] [--repeats 3]``; the results go to
benchmarks/results/plan_70b.json (``--json PATH`` elsewhere).
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from headlab.heads import analyse
from headlab.measure import random_repeat_probe, reduce_patterns
from headlab.model import ModelConfig, Transformer

sys.path.insert(0, str(Path(__file__).parent))
from bench_streaming import SMOLLM2_SHAPE
from record import count, path_for, save

LLAMA_70B = ModelConfig(
    vocab_size=128256,
    d_model=8192,
    n_layers=80,
    n_heads=64,
    n_kv_heads=8,
    d_ff=28672,
    max_len=8192,
    positional="rotary",
    rope_theta=500000.0,
    norm_kind="rmsnorm",
    activation="silu",
    mlp="gated",
    bias=False,
    mlp_bias=False,
    tie_embeddings=False,
)
N_PROMPTS, N_TOKENS = 10_000, 4096


def block_params(config: ModelConfig) -> int:
    with torch.device("meta"):
        model = Transformer(config)
    return sum(p.numel() for p in model.blocks.parameters())


def total_params(config: ModelConfig) -> int:
    with torch.device("meta"):
        return Transformer(config).num_params()


def forward_flops(config: ModelConfig, n: int, batch: int) -> float:
    """Multiply-adds × 2 of the blocks' matmuls and the attention's q·kᵀ and weights·v."""
    return (
        2.0 * block_params(config) * batch * n
        + 4.0 * config.n_layers * batch * n * n * config.d_model
    )


def scored_weights(config: ModelConfig, n: int, batch: int) -> float:
    return float(config.n_layers * batch * (config.n_heads + 1) * n * n)


def rates(n: int, repeats: int) -> dict[str, float]:
    """CPU seconds (this process's, so other jobs on the machine do not count) of a forward
    that drops every layer's weights and of the streaming analysis, medians over ``repeats``
    alternating runs; the rates they imply."""
    torch.manual_seed(0)
    model = Transformer(SMOLLM2_SHAPE).eval()
    probe = random_repeat_probe(None, SMOLLM2_SHAPE.vocab_size, n, length=n // 4, batch=1)
    runs: dict[str, list[float]] = {"forward": [], "analyse": []}
    analyse(model, random_repeat_probe(None, 49152, 16, batch=1), keep=())  # warm-up
    for _ in range(repeats):
        t0 = time.process_time()
        reduce_patterns(model, probe.tokens, lambda layer, w: None)
        runs["forward"].append(time.process_time() - t0)
        t0 = time.process_time()
        analyse(model, probe, keep=())
        runs["analyse"].append(time.process_time() - t0)
    fwd, total = statistics.median(runs["forward"]), statistics.median(runs["analyse"])
    return {
        "n": n,
        "forward_s": fwd,
        "analyse_s": total,
        "forward_flops_per_s": forward_flops(SMOLLM2_SHAPE, n, 1) / fwd,
        "scored_weights_per_s": scored_weights(SMOLLM2_SHAPE, n, 1) / (total - fwd),
        "tokens_per_s": n / total,
    }


def attention_peak_child(n: int) -> float:
    """Peak bytes per (B, h, n, n) weight of one bf16 attention layer, scored as analyse does."""
    from headlab import Trace
    from headlab.attention import MultiHeadAttention

    def status(field: str) -> int:
        text = Path("/proc/self/status").read_text()
        match = re.search(rf"^{field}:\s+(\d+) kB", text, re.M)
        assert match
        return int(match.group(1)) * 1024

    c = SMOLLM2_SHAPE
    layer = MultiHeadAttention(c.d_model, c.n_heads, c.n_kv_heads, bias=False).bfloat16().eval()
    x = torch.randn(1, n, c.d_model, dtype=torch.bfloat16)
    trace = Trace(only=("weights",), reduce=lambda name, w: w.float().cpu().sum() and None)
    with torch.inference_mode():
        layer(x[:, :8], causal=True, trace=trace)
        Path("/proc/self/clear_refs").write_text("5")
        before = status("VmRSS")
        layer(x, causal=True, trace=trace)
    return (status("VmHWM") - before) / (c.n_heads * n * n)


def attention_peak(n: int, threads: int) -> float:
    cmd = [sys.executable, __file__, "--peak-child", str(n), "--threads", str(threads)]
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"}
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, env=env).stdout
    return float(out.strip().splitlines()[-1])


def plan(measured: dict[str, float], peak_bytes: float, gpu_tflops: float, link_gbs: float) -> dict:
    c, n = LLAMA_70B, N_TOKENS
    params = total_params(c)
    per_block = block_params(c) // c.n_layers
    one_layer = c.n_heads * n * n  # weights of one layer, the probe alone
    flops = forward_flops(c, n, 1)
    scored = scored_weights(c, n, 1)
    copied = c.n_layers * one_layer * 4  # float32 to the host, every layer
    cpu_s = flops / measured["forward_flops_per_s"] + scored / measured["scored_weights_per_s"]
    score_s = scored / measured["scored_weights_per_s"]
    gpu_fwd_s = flops / (gpu_tflops * 1e12)
    return {
        "params": params,
        "weights_bf16_GB": params * 2 / 1e9,
        "block_bf16_GB": per_block * 2 / 1e9,
        "layer_patterns_bf16_GB": one_layer * 2 / 1e9,
        "layer_patterns_fp32_GB": one_layer * 4 / 1e9,
        "attention_peak_GB": one_layer * peak_bytes / 1e9,
        "forward_PFLOP_per_prompt": flops / 1e15,
        "scored_G_per_prompt": scored / 1e9,
        "host_copy_GB_per_prompt": copied / 1e9,
        "cpu_one_thread_s_per_prompt": cpu_s,
        "cpu_scoring_s_per_prompt": score_s,
        "gpu_forward_s_per_prompt": gpu_fwd_s,
        "copy_s_per_prompt": copied / (link_gbs * 1e9),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--n", type=int, default=512)
    parser.add_argument("--repeats", type=count(), default=3)
    parser.add_argument(
        "--gpu-tflops",
        type=float,
        default=400.0,
        help="assumed sustained bf16 TFLOP/s of a GPU on these matmuls",
    )
    parser.add_argument(
        "--link-gbs",
        type=float,
        default=25.0,
        help="assumed GB/s of the copy from a GPU to the host",
    )
    parser.add_argument("--json", default=path_for("plan_70b"), help="where the results go")
    parser.add_argument("--peak-child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.peak_child:
        print(attention_peak_child(args.peak_child))
        return 0
    measured = rates(args.n, args.repeats)
    peak = attention_peak(1024, args.threads)
    p = plan(measured, peak, args.gpu_tflops, args.link_gbs)
    print(f"measured here ({args.threads} thread(s), SmolLM2's shape, n = {args.n}, batch 1):")
    m = measured
    print(f"  forward {m['forward_s']:.1f} CPU s = {m['forward_flops_per_s'] / 1e9:.1f} GFLOP/s")
    print(f"  analysis {m['analyse_s']:.1f} CPU s, {m['tokens_per_s']:.0f} tokens/s in all")
    print(f"  scoring (analysis − forward) {m['scored_weights_per_s'] / 1e6:.0f} M weights/s")
    print(f"  one bf16 attention layer at its peak: {peak:.1f} bytes per (B, h, n, n) weight")
    print(f"Llama-3-70B's shape at {N_TOKENS} tokens, every score (batch 1):")
    for key, value in p.items():
        print(f"  {key:28s} {value:,.2f}")
    rows = [[key.replace("_", " "), f"{value:,.2f}"] for key, value in p.items()]
    columns = [f"Llama-3-70B's shape, {N_TOKENS} tokens, per prompt", "figure"]
    results = {
        "measured": measured,
        "peak_bytes_per_weight": peak,
        "plan": p,
        "assumed": {"gpu_tflops": args.gpu_tflops, "link_gbs": args.link_gbs},
    }
    save(args.json, columns, rows, results, threads=args.threads)
    return 0


if __name__ == "__main__":
    sys.exit(main())
