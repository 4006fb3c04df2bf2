"""What head analysis costs on a CUDA GPU against transformers' forward there, in one run.

Two models transformers builds with random weights (no download), each converted to headlab:
MiniLM's shape (a 6-layer BERT, 384 wide, 12 heads) and SmolLM2-135M's (a 30-layer Llama,
576 wide, 9 query heads on 3 K/V heads). On repeated random tokens (4 copies, ``--lengths``
tokens in all, ``--batch`` sequences), medians of ``--rounds`` interleaved rounds, each after
``torch.cuda.synchronize``: transformers' eager forward with ``output_attentions=True``,
headlab's ``analyse`` (every score, the content score included, scored on the GPU by the
scores' PyTorch definition), and ``analyse`` without the content score. Ratios against
transformers' forward on the same tokens.

Run where torch sees a GPU: ``python benchmarks/bench_gpu.py [--rounds 9] [--lengths 128 512]``;
results go to benchmarks/results/gpu.json (``--json``).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import torch

from headlab.convert import from_hf
from headlab.heads import analyse
from headlab.measure import random_repeat_probe
from record import count, path_for, save


def models() -> dict[str, tuple[Any, Any]]:
    """name → (transformers' model, headlab's), both on the GPU, random weights."""
    import transformers

    torch.manual_seed(0)
    bert = transformers.BertConfig(
        vocab_size=30522,
        hidden_size=384,
        num_hidden_layers=6,
        num_attention_heads=12,
        intermediate_size=1536,
    )
    llama = transformers.LlamaConfig(
        vocab_size=49152,
        hidden_size=576,
        num_hidden_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
        intermediate_size=1536,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
    )
    out = {}
    for name, config, cls in (
        ("minilm-shaped", bert, transformers.BertModel),
        ("smollm2-shaped", llama, transformers.LlamaForCausalLM),
    ):
        config._attn_implementation = "eager"
        hf = cls(config).eval()
        ours = from_hf(hf).eval()
        out[name] = (hf.cuda(), ours.cuda())
    return out


def contenders(hf: Any, ours: Any, probe: Any) -> dict[str, Callable[[], object]]:
    """The three calls timed on one model and probe."""
    x = probe.tokens.cuda()
    return {
        "transformers forward, output_attentions": lambda: hf(x, output_attentions=True),
        "analyse, all scores": lambda: analyse(ours, probe, keep=()),
        "analyse, no content score": lambda: analyse(ours, probe, content=False, keep=()),
    }


def timed(fn: Callable[[], object]) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=count(), default=9)
    parser.add_argument("--lengths", nargs="+", type=int, default=[128, 512])
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--json", default=path_for("gpu"), help="where the results go")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("bench_gpu: torch sees no CUDA GPU here", file=sys.stderr)
        return 2
    rows, raw = [], {}
    for name, (hf, ours) in models().items():
        vocab = ours.config.vocab_size
        for length in args.lengths:
            probe = random_repeat_probe(
                None, vocab, length, length=length // 4, batch=args.batch, seed=1
            )
            fns = contenders(hf, ours, probe)
            with torch.no_grad():
                for fn in fns.values():  # warm up: kernels load, caches fill
                    fn()
                times: dict[str, list[float]] = {k: [] for k in fns}
                for _ in range(args.rounds):
                    for k, fn in fns.items():
                        times[k].append(timed(fn))
            base = statistics.median(times["transformers forward, output_attentions"])
            for k, t in times.items():
                m = statistics.median(t)
                rows.append([name, probe.tokens.shape[1], k, f"{m * 1e3:.2f}", f"{m / base:.2f}"])
                print(" | ".join(str(c) for c in rows[-1]))
            raw[f"{name}/{length}"] = times
    device = torch.cuda.get_device_name()
    save(args.json, ["model", "tokens", "what", "median ms", "× forward"], rows, raw, gpu=device)
    return 0


if __name__ == "__main__":
    sys.exit(main())
