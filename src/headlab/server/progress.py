"""How far a long request has got: its steps, the one under way, and the time it should take.

A request that may take a while (``POST /api/heads``, above all with ``evidence``) carries a
``progress_id`` the page made up; while it runs, ``GET /api/progress/{id}`` answers its
:class:`Job`: the steps planned, each with the seconds it is expected to take, the step under
way with its count ("random-weights floors 1/3", "ablating heads 40/66") and the seconds so far.

Expected times come from this machine: each step's wall time on the last request that ran it
is kept per model on disk (:class:`Timings`, written through :mod:`headlab.files` with a record
of the model, the machine and the torch threads it was measured on, checked when read) and
scaled to the request's tokens. A step never measured here is estimated from the model's size
(:func:`size_estimate`), and the answer says which is which. A step whose result is cached (the
random-weights floors of a probe, the composition scores: :mod:`headlab.server.warm` computes
them when the server starts) is expected to take no time.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from headlab.files import json_text, read_text, write_json
from headlab.heads.evidence import STEPS

# every step a request may report and what each is in words: the server's own around the
# evidence's (headlab.heads.evidence.STEPS, which label_heads' floors and scores share)
LABELS = {
    "model": "loading the model",
    "needles": "running the needle probes",
    "syntax": "scoring syntactic heads on the evaluation text",
    **STEPS,
}
JOBS_KEPT = 64  # finished or running jobs kept for their pollers (the most recent)
TIMINGS_FORMAT = 1

# Seconds per step before any run of a model on this machine: a rough rule from the model's
# size, fitted to SmolLM2-135M and MiniLM's cold runs on one torch thread of a shared 2-core
# machine (benchmarks/bench_evidence_steps.py, benchmarks/results/evidence_steps.json; the
# same steps took up to three times as long there under a load of 5). P is the model's
# parameters in millions, n the probe's tokens, H = layers × heads, d = d_model.
SIZE_RULE = {
    "shuffled": lambda P, n, H, d: 1e-4 * P * n,
    "floors": lambda P, n, H, d: 0.05 * P,
    "scores": lambda P, n, H, d: 3e-5 * P * n,
    "composition": lambda P, n, H, d: 2.5e-7 * H * H * d,
    "ablation": lambda P, n, H, d: 1.3e-5 * P * n * H,  # the estimate and exact ablations
}


def size_estimate(step: str, params: int, tokens: int, heads: int, d_model: int) -> float | None:
    """Seconds ``step`` may take on a model of ``params`` parameters and ``heads`` heads (all
    layers) on ``tokens`` tokens, by :data:`SIZE_RULE`; None for a step it has no rule for."""
    rule = SIZE_RULE.get(step)
    return None if rule is None else float(rule(params / 1e6, tokens, heads, d_model))


def timings_dir() -> Path:
    """Where step times are kept: ``$HEADLAB_CACHE/timings`` (``~/.cache/headlab``)."""
    from headlab.pypi import cache_root

    return cache_root() / "timings"


def machine_record() -> dict[str, Any]:
    """What a step's time depends on besides the model: the CPU, its cores, torch's version
    and threads (the server runs requests on one)."""
    import platform

    import torch

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
    }


class Timings:
    """Each step's wall time on the last request that ran it, per model, kept on disk.

    One file per model and key (``<name>-<key>.json``) holds ``{"format", "key", "sha256",
    "steps"}``: the key hashes the model's name and config and :func:`machine_record`, so
    times measured on another machine, another model of the name or another thread count are
    not used; the SHA-256 covers the key and the steps. An entry that is unreadable, not this
    key's or not finite is ignored and written over."""

    def __init__(self, folder: Path | None = None) -> None:
        self.folder = folder
        self._lock = threading.Lock()

    def _path(self, name: str, key: str) -> Path:
        return (self.folder or timings_dir()) / f"{name}-{key[:16]}.json"

    @staticmethod
    def key(name: str, config: Any) -> str:
        """What the times depend on, hashed: the model's name and config, the machine."""
        text = json.dumps([name, repr(config), machine_record()], sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()

    @staticmethod
    def _digest(key: str, steps: dict[str, Any]) -> str:
        text = json.dumps({"key": key, "steps": steps}, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()

    def read(self, name: str, config: Any) -> dict[str, dict[str, float]]:
        """step → {"seconds", "tokens"} kept for model ``name``; {} when none can be trusted."""
        key = self.key(name, config)
        path = self._path(name, key)
        if not path.is_file():
            return {}
        try:
            stored = json.loads(read_text(path, 100_000, "timings"))
        except (ValueError, OSError, RecursionError):
            return {}
        if (
            not isinstance(stored, dict)
            or stored.get("format") != TIMINGS_FORMAT
            or stored.get("key") != key
            or not isinstance(stored.get("steps"), dict)
            or stored.get("sha256") != self._digest(key, stored["steps"])
        ):
            return {}
        return {k: v for k, v in stored["steps"].items() if k in LABELS and _is_time(v)}

    def record(self, name: str, config: Any, measured: dict[str, dict[str, float]]) -> None:
        """Keep ``measured`` (step → {"seconds", "tokens"}) for model ``name`` over what was
        kept for those steps; a cache that cannot be written is only skipped."""
        if not measured:
            return
        with self._lock:
            steps = {**self.read(name, config), **measured}
            steps = json.loads(json_text(steps))
            key = self.key(name, config)
            record = {
                "format": TIMINGS_FORMAT,
                "key": key,
                "sha256": self._digest(key, steps),
                "steps": steps,
            }
            with contextlib.suppress(OSError, ValueError):  # then not kept: measured again
                write_json(self._path(name, key), record)


def _is_time(entry: Any) -> bool:
    """Whether a kept entry is {"seconds": finite ≥ 0, "tokens": a whole number ≥ 1}."""
    if not isinstance(entry, dict):
        return False
    seconds, tokens = entry.get("seconds"), entry.get("tokens")
    return (
        isinstance(seconds, (int, float))
        and not isinstance(seconds, bool)
        and math.isfinite(seconds)
        and seconds >= 0
        and isinstance(tokens, int)
        and not isinstance(tokens, bool)
        and tokens >= 1
    )


@dataclass
class Step:
    """One step of a job's plan: what it is expected to take, and what it took."""

    name: str
    expected: float | None = None  # seconds; None when nothing can be said
    basis: str = "estimate"  # "measured" here before, "estimate" from the size, or "cached"
    state: str = "waiting"  # "waiting", "running", "done"
    seconds: float | None = None  # wall time once done
    started: float | None = None  # time.monotonic() when it started

    def to_dict(self) -> dict[str, Any]:
        return {
            "step": self.name,
            "label": LABELS[self.name],
            "expected_s": None if self.expected is None else round(self.expected, 1),
            "basis": self.basis,
            "state": self.state,
            "seconds": None if self.seconds is None else round(self.seconds, 2),
        }


@dataclass
class Job:
    """One request's progress (module docstring): created when the request starts, planned once
    its model and probe are known, advanced by the library's ``progress(step, done, total)``."""

    id: str
    model: str
    started: float = field(default_factory=time.monotonic)
    steps: list[Step] = field(default_factory=list)
    current: str | None = None
    done: int = 0
    total: int = 0
    tokens: int = 0
    finished: bool = False
    failed: str | None = None
    note: str = ""  # where the expected time comes from, in words
    expected: float | None = None  # seconds the request should take in all, once planned
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def plan(self, steps: list[Step], tokens: int, note: str) -> None:
        """Set the steps this request is expected to run, before it runs them."""
        with self._lock:
            ran = [s for s in self.steps if s.state != "waiting"]  # e.g. the model's load
            self.steps = ran + [s for s in steps if s.name not in {r.name for r in ran}]
            self.tokens, self.note = tokens, note
            # the time the steps before the plan took (the model's load), and the plan's
            ahead = [s.expected for s in steps]
            if all(e is not None for e in ahead):
                self.expected = time.monotonic() - self.started + sum(e or 0.0 for e in ahead)

    def step(self, name: str, done: int, total: int) -> None:
        """The library's progress report: ``name`` is under way, ``done`` of ``total``."""
        now = time.monotonic()
        with self._lock:
            if name != self.current:
                self._close(now)
                found = next((s for s in self.steps if s.name == name), None)
                if found is None:  # a step the plan did not foresee (the estimate, say)
                    found = Step(name, None, "estimate")
                    self.steps.append(found)
                found.state, found.started = "running", now
                self.current = name
            self.done, self.total = done, total

    def _close(self, now: float) -> None:
        running = next((s for s in self.steps if s.name == self.current), None)
        if running is not None and running.started is not None:
            running.state, running.seconds = "done", now - running.started

    def finish(self, failed: str | None = None) -> None:
        """The request answered (or failed, saying why)."""
        with self._lock:
            self._close(time.monotonic())
            self.finished, self.failed, self.current = True, failed, None

    def measured(self) -> dict[str, dict[str, float]]:
        """step → {"seconds", "tokens"} of the steps that did their work (not cached); the
        estimate before the exact ablations is counted in "ablation", as the plan expects it."""
        out: dict[str, dict[str, float]] = {}
        with self._lock:
            for s in self.steps:
                if s.state != "done" or s.seconds is None or s.basis == "cached":
                    continue
                name = "ablation" if s.name == "estimate" else s.name
                before = out.get(name, {}).get("seconds", 0.0)
                out[name] = {"seconds": before + s.seconds, "tokens": self.tokens}
        return out

    def to_dict(self) -> dict[str, Any]:
        """The answer of ``GET /api/progress/{id}``."""
        with self._lock:
            total = self.expected
            return {
                "id": self.id,
                "model": self.model,
                "step": self.current,
                "label": LABELS.get(self.current or ""),
                "done": self.done,
                "total": self.total,
                "elapsed_s": round(time.monotonic() - self.started, 1),
                "expected_s": None if total is None else round(total, 1),
                "expected": self.note,
                "tokens": self.tokens,
                "steps": [s.to_dict() for s in self.steps],
                "state": self.state(),
                "failed": self.failed,
            }

    def state(self) -> str:
        """ "waiting" (not started here: see :meth:`Jobs.answer`), "running", "finished" or
        "failed"."""
        if not self.finished:
            return "running"
        return "failed" if self.failed else "finished"


class Jobs:
    """The jobs of the requests that asked for progress, the :data:`JOBS_KEPT` most recent."""

    def __init__(self, kept: int = JOBS_KEPT) -> None:
        self.kept = kept
        self._jobs: OrderedDict[str, Job] = OrderedDict()
        self._lock = threading.Lock()

    def start(self, job_id: str | None, model: str) -> Job:
        """A new job for a request; one with an id is kept for ``GET /api/progress/{id}``."""
        job = Job(job_id or "", model)
        if job_id:
            with self._lock:
                self._jobs.pop(job_id, None)
                self._jobs[job_id] = job
                while len(self._jobs) > self.kept:
                    self._jobs.popitem(last=False)
        return job

    def get(self, job_id: str) -> Job | None:
        with self._lock:
            return self._jobs.get(job_id)

    def answer(self, job_id: str) -> dict[str, Any]:
        """``GET /api/progress/{id}``'s answer: the job's, or for an id no request has sent
        (yet: the page asks as it sends the request) one whose state is "waiting"."""
        job = self.get(job_id)
        if job is not None:
            return job.to_dict()
        return {**Job(job_id, "").to_dict(), "elapsed_s": 0.0, "state": "waiting"}


def plan_steps(
    names: list[str],
    cached: set[str],
    kept: dict[str, dict[str, float]],
    model: Any,
    tokens: int,
) -> tuple[list[Step], str]:
    """The :class:`Step` of each of ``names`` with its expected seconds: 0 for a step in
    ``cached``; the time ``kept`` (:meth:`Timings.read`) measured, scaled to ``tokens`` (the
    composition scores and the model's load do not depend on them); else
    :func:`size_estimate`. With a sentence saying where the figures come from."""
    c = model.config
    params = sum(p.numel() for p in model.parameters())
    heads = c.n_layers * c.n_heads
    steps, measured, estimated = [], [], []
    for name in names:
        if name in cached:
            steps.append(Step(name, 0.0, "cached"))
            continue
        found = kept.get(name)
        if found is not None:
            scale = 1.0 if name in ("composition", "model") else tokens / found["tokens"]
            steps.append(Step(name, found["seconds"] * scale, "measured"))
            measured.append(name)
        else:
            steps.append(Step(name, size_estimate(name, params, tokens, heads, c.d_model)))
            estimated.append(name)
    return steps, _note(measured, estimated, cached & set(names), tokens)


def _note(measured: list[str], estimated: list[str], cached: set[str], tokens: int) -> str:
    """Where a plan's expected time comes from, in a few words."""
    if measured and estimated:
        said = (
            f"measured here by the last run of {_words(measured)}, scaled to {tokens} tokens; "
            "the rest a rough estimate from the model's size"
        )
    elif measured:
        said = f"measured here by the last run, scaled to {tokens} tokens"
    else:
        said = "a rough estimate from the model's size: not yet run on this machine"
    if cached:
        said += f"; {_words(sorted(cached))} kept from before"
    return said


def _words(steps: list[str]) -> str:
    labels = [LABELS[s] for s in steps]
    return labels[0] if len(labels) == 1 else ", ".join(labels[:-1]) + " and " + labels[-1]
