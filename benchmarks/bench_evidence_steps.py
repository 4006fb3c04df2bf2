"""What the page's evidence request costs, step by step, and what warming a model saves: for each
model, on the page's first evidence request (POST /api/heads, "evidence": true, no text: the
repeat probe within the server's token limit), the seconds of each step headlab.heads.evidence
reports (shuffled tokens, random-weights floors, scores, composition scores, the ablation's
estimate and exact ablations), measured on one torch thread as ``headlab serve`` runs them:

    cold        an empty cache: the first request of a model on a machine
    warm-up     headlab.server.warm.warm_model, what ``headlab serve`` (in the background) or
                ``headlab models --fetch`` pays once: the composition scores and the floors of
                the page's three text-free probes
    warmed      the same request after it, nothing in memory (another process): read from disk
    new text    a typed text after warming: its floors are its own, so computed

and the circuit (POST /api/circuit) cold and warmed. The caches go to a temporary folder (the
models load from the real one first), so nothing of the user's cache is read or changed.

Run: ``nice -n 10 python benchmarks/bench_evidence_steps.py [--models default minilm smollm2]``;
results go to benchmarks/results/evidence_steps.json (``--json``).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections import OrderedDict
from typing import Any

import torch

from headlab import zoo
from headlab.heads import baselines, composition
from headlab.heads.circuit import induction_circuit
from headlab.heads.evidence import STEPS, evidence
from headlab.measure import build_probe
from record import path_for, save

TEXT = "The quick brown fox jumps over the lazy dog while the farmer sleeps in the barn."


class StepClock:
    """Each step's wall time from evidence's progress reports: a step lasts from its first
    report to the next step's first report (or the end)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._step: str | None = None
        self._since = 0.0

    def __call__(self, step: str, done: int, total: int) -> None:
        if step != self._step:
            self.stop()
            self._step, self._since = step, time.perf_counter()

    def stop(self) -> None:
        if self._step is not None:
            self.seconds[self._step] = time.perf_counter() - self._since
            self._step = None


def forget() -> None:
    """What a new process holds: nothing in memory (the disk cache stays)."""
    baselines._MEMORY.clear()
    composition._KEPT.clear()


def timed_evidence(model: Any, probe: Any) -> dict[str, float]:
    clock = StepClock()
    start = time.perf_counter()
    evidence(model, probe, keep=None, progress=clock)
    clock.stop()
    return {**clock.seconds, "total": time.perf_counter() - start}


def timed_circuit(model: Any, tokenizer: Any) -> float:
    from headlab.server.routes.attention import CIRCUIT_PROBE

    c = model.config
    probe = build_probe(CIRCUIT_PROBE, tokenizer, c.max_len, c.vocab_size, seed=0)
    start = time.perf_counter()
    induction_circuit(model, probe)
    return time.perf_counter() - start


def measure(name: str) -> dict[str, Any]:
    from headlab.server.routes.attention import token_limit
    from headlab.server.warm import warm_model

    real_cache = os.environ.get("HEADLAB_CACHE")
    start = time.perf_counter()
    model, tokenizer = zoo.load(name)
    load_s = time.perf_counter() - start
    c = model.config
    limit = token_limit(model)
    probe = build_probe("repeat", tokenizer, limit, c.vocab_size)
    typed = build_probe("text", tokenizer, limit, c.vocab_size, TEXT)
    out: dict[str, Any] = {
        "model": name,
        "params": sum(p.numel() for p in model.parameters()),
        "heads": c.n_layers * c.n_heads,
        "tokens": probe.n,
        "text_tokens": typed.n,
        "load_s": load_s,
    }
    try:
        with tempfile.TemporaryDirectory() as cold, tempfile.TemporaryDirectory() as warmed:
            os.environ["HEADLAB_CACHE"] = cold
            forget()
            out["cold"] = timed_evidence(model, probe)
            out["circuit_cold_s"] = timed_circuit(model, tokenizer) if c.causal else None
            os.environ["HEADLAB_CACHE"] = warmed
            forget()
            start = time.perf_counter()
            out["warm_up"] = warm_model(model, tokenizer)
            out["warm_up_s"] = time.perf_counter() - start
            forget()
            out["warmed"] = timed_evidence(model, probe)
            forget()
            out["circuit_warmed_s"] = timed_circuit(model, tokenizer) if c.causal else None
            forget()
            out["new_text"] = timed_evidence(model, typed)
    finally:
        if real_cache is None:
            os.environ.pop("HEADLAB_CACHE", None)
        else:
            os.environ["HEADLAB_CACHE"] = real_cache
    return out


def _cell(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["default", "minilm", "smollm2"])
    parser.add_argument("--threads", type=int, default=1, help="torch threads (the server: 1)")
    parser.add_argument("--json", default=path_for("evidence_steps"), help="where results go")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    composition._KEPT = OrderedDict()
    # the server loads the scores' compiled loops at startup (server/app.py): so here, first
    # and the first analysis of a process loads them (a second or more): paid here, untimed
    from headlab.heads import analyse, fast

    fast.available()
    model, tokenizer = zoo.load("default")
    analyse(model, build_probe("repeat", tokenizer, 64, model.config.vocab_size), keep=())
    start_load = [round(v, 2) for v in os.getloadavg()]
    results = []
    for name in args.models:
        try:
            results.append(measure(name))
        except (ImportError, zoo.ModelNotAvailable) as exc:
            print(f"skipped {name}: not available here ({exc})")
            continue
        r = results[-1]
        print(name, {k: v for k, v in r.items() if k not in ("cold", "warmed", "new_text")})
        for run in ("cold", "warmed", "new_text"):
            print(f"  {run}: " + ", ".join(f"{k} {v:.2f}" for k, v in r[run].items()), flush=True)
    end_load = [round(v, 2) for v in os.getloadavg()]
    steps = [*STEPS, "total"]
    columns = ["model", "tokens", "run", *(STEPS.get(s, s) for s in steps), "the circuit"]
    rows = []
    for r in results:
        runs = (("cold", r["tokens"]), ("warmed", r["tokens"]), ("new_text", r["text_tokens"]))
        circuit = {"cold": r["circuit_cold_s"], "warmed": r["circuit_warmed_s"]}
        for run, tokens in runs:
            cells = [r[run].get(s) for s in steps] + [circuit.get(run)]
            rows.append([r["model"], tokens, run, *(_cell(v) for v in cells)])
        # the warm-up: the composition scores once, the floors of the page's three probes
        once = r["warm_up"].get("composition", {}).get("seconds")
        floors = r["warm_up_s"] - (once or 0.0)
        cells = [None, floors, None, once, None, None, r["warm_up_s"], None]
        rows.append([r["model"], "3 probes", "warm-up (once)", *(_cell(v) for v in cells)])
    save(
        args.json,
        columns,
        rows,
        {"models": results, "load_average": {"start": start_load, "end": end_load}},
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
