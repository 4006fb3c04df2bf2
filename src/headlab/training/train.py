"""One training loop for every headlab model: seeded, logged, checkpointed, exactly resumable.

``train(model, config, batches, ...)`` runs AdamW with a linear warm-up and a cosine decay. The
caller brings the data (``batches(generator) -> batch``), optionally the loss
(``loss_fn(model, batch) -> scalar``, next-token cross-entropy by default) and an evaluation hook
(``evaluate(model, step) -> dict``, run every ``eval_every`` steps and at the end); experiments and
the shipped model all call this one function.

Run directory (``out_dir``), when given::

    metrics.jsonl                  one JSON record per line: {"step", "kind": "train"|"eval", ...}
    checkpoints/                   atomic, verified on load (see :mod:`headlab.checkpoint`)

Exact resume: a checkpoint at step k is the complete state after k optimizer steps. Resuming
restores the weights, the optimizer moments, the data generator and the global RNG, and the
learning rate is a pure function of the step, so a resumed run takes the same steps as an
uninterrupted one and ends with bit-identical weights on CPU.

Progress goes to a :class:`Reporter` the caller passes (the CLI picks a progress bar or log
lines); the library itself never prints.

Ctrl-C (SIGINT) during a ``train`` with a run directory finishes the current step, saves a
checkpoint and returns with ``interrupted=True``; without one, KeyboardInterrupt is raised.

A :class:`StopToken` ends a run from elsewhere (the page's Cancel button, a dropped connection, a
time limit): the loop reads it after every step and returns with ``stopped`` set to the reason,
saving a checkpoint as Ctrl-C does. Nothing is raised through the caller's callbacks.
"""

from __future__ import annotations

import json
import math
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol, TextIO

import torch
from torch import Tensor, nn

from headlab.checkpoint import (
    Checkpoint,
    CheckpointError,
    check_compatible,
    jsonable,
    latest_checkpoint,
    load_checkpoint,
    model_config_of,
    rng_to_json,
    save_checkpoint,
)
from headlab.files import write_atomic
from headlab.measure import next_token_loss

Batch = Any
BatchFn = Callable[[torch.Generator], Batch]
LossFn = Callable[[nn.Module, Batch], Tensor]
EvalFn = Callable[[nn.Module, int], dict[str, Any]]


@dataclass(frozen=True)
class TrainConfig:
    """Everything that decides a run's result (the model and the data aside)."""

    steps: int = 1000  # optimizer steps in the whole run
    batch_size: int = 32  # sequences per step (passed on to the data function by recipes)
    lr: float = 1e-3  # peak learning rate, reached at the end of warm-up
    warmup_steps: int = 100  # linear warm-up from lr / warmup_steps to lr
    min_lr_ratio: float = 0.1  # the cosine decay ends at lr * min_lr_ratio
    weight_decay: float = 0.01  # AdamW decoupled decay, on matrices only (not biases, norms)
    beta1: float = 0.9  # AdamW first-moment decay
    beta2: float = 0.98  # AdamW second-moment decay
    grad_clip: float = 1.0  # clip the global gradient norm to this; 0 turns clipping off
    seed: int = 0  # seeds the data generator and torch's global RNG
    eval_every: int = 100  # run the evaluation hook every this many steps; 0 = only at the end
    log_every: int = 50  # write a training-loss record every this many steps
    checkpoint_every: int = 500  # save a checkpoint every this many steps; 0 = only at the end
    keep_checkpoints: int = 2  # older checkpoints are deleted after a newer one is complete

    def __post_init__(self) -> None:
        problems = []
        for name in ("steps", "batch_size", "log_every", "keep_checkpoints"):
            if getattr(self, name) < 1:
                problems.append(f"{name} must be at least 1, got {getattr(self, name)}")
        for name in ("warmup_steps", "eval_every", "checkpoint_every", "grad_clip"):
            if getattr(self, name) < 0:
                problems.append(f"{name} must be 0 or more, got {getattr(self, name)}")
        if not 0 <= self.seed < 2**64:
            problems.append(f"seed must be in 0..2**64-1 (torch's seeds), got {self.seed}")
        if not self.lr > 0:
            problems.append(f"lr must be positive, got {self.lr}")
        if not 0 <= self.min_lr_ratio <= 1:
            problems.append(f"min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}")
        if problems:
            raise ValueError("; ".join(problems))


def lr_at(config: TrainConfig, step: int) -> float:
    """Learning rate for optimizer step ``step`` (0-based): linear warm-up, then cosine decay."""
    if step < config.warmup_steps:
        return config.lr * (step + 1) / config.warmup_steps
    span = max(1, config.steps - config.warmup_steps)
    progress = min(1.0, (step - config.warmup_steps) / span)
    cosine = 0.5 * (1.0 + math.cos(math.pi * progress))
    return config.lr * (config.min_lr_ratio + (1.0 - config.min_lr_ratio) * cosine)


def make_optimizer(model: nn.Module, config: TrainConfig) -> torch.optim.AdamW:
    """AdamW with weight decay on matrices (dim >= 2) and none on biases and norm gains."""
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    groups = [
        {"params": decay, "weight_decay": config.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=config.lr, betas=(config.beta1, config.beta2))


# ---------------------------------------------------------------------------------------------
# Progress: the loop reports to a Reporter (the CLI brings a progress bar or plain log lines)
# ---------------------------------------------------------------------------------------------


class Reporter(Protocol):
    """Receives progress from :func:`train`; the library itself never prints."""

    def start(self, total: int, step: int) -> None: ...

    def update(self, step: int, loss: float, lr: float) -> None: ...

    def record(self, record: dict[str, Any]) -> None: ...

    def message(self, text: str) -> None: ...

    def finish(self) -> None: ...


class StopToken:
    """Asks a run to stop between two steps; set from any thread, or by itself after ``seconds``.

    The first reason given wins: a cancel that arrives after the time limit hit stays a time limit.
    """

    def __init__(self, seconds: float | None = None) -> None:
        self.seconds = seconds  # the time limit, counted from the token's creation; None: none
        self._deadline = None if seconds is None else time.monotonic() + seconds
        self._reason: str | None = None
        self._lock = threading.Lock()

    def stop(self, reason: str = "stopped") -> None:
        """Ask the run to stop before its next step, for ``reason`` (unless one was given)."""
        with self._lock:
            if self._reason is None:
                self._reason = reason

    @property
    def reason(self) -> str | None:
        """Why the run should stop now, or None to go on."""
        late = self._deadline is not None and time.monotonic() > self._deadline
        if self._reason is None and late:
            self.stop(f"time limit: stopped after {self.seconds:.0f} s")
        return self._reason


# ---------------------------------------------------------------------------------------------
# The loop
# ---------------------------------------------------------------------------------------------


@dataclass
class TrainResult:
    """What a call to :func:`train` did."""

    step: int  # optimizer steps completed (equals config.steps unless interrupted)
    interrupted: bool  # stopped early by Ctrl-C (a checkpoint was saved when out_dir was given)
    history: list[dict[str, Any]] = field(default_factory=list)  # every train and eval record
    wall_seconds: float = 0.0  # time spent in this call
    elapsed: float = 0.0  # training time over the whole run, across resumes
    checkpoint: Path | None = None  # the last checkpoint written or resumed from
    stopped: str | None = None  # why a StopToken ended the run early; None: it was not stopped

    def records(self, kind: str) -> list[dict[str, Any]]:
        """The records of one kind, "train" or "eval", in step order."""
        return [r for r in self.history if r.get("kind") == kind]


@dataclass
class _Loop:
    """The mutable state of one run; checkpoints store exactly this (plus weights, moments)."""

    model: nn.Module
    config: TrainConfig
    optimizer: torch.optim.Optimizer
    generator: torch.Generator
    step: int = 0
    elapsed: float = 0.0
    loss_sum: float = 0.0
    loss_count: int = 0
    history: list[dict[str, Any]] = field(default_factory=list)

    def state(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "elapsed": self.elapsed,
            "loss_sum": self.loss_sum,
            "loss_count": self.loss_count,
            "config": jsonable(asdict(self.config)),
            "model_config": model_config_of(self.model),
            "rng": {
                "data": rng_to_json(self.generator.get_state()),
                "torch": rng_to_json(torch.get_rng_state()),
            },
        }

    def restore(self, ck: Checkpoint) -> None:
        # the group lr a checkpoint at step k holds: the schedule's, set before step k's update
        lr = lr_at(self.config, ck.step - 1) if ck.step > 0 else self.config.lr
        check_compatible(ck, self.model, self.optimizer, asdict(self.config), lr=lr)
        self.model.load_state_dict(ck.model)
        self.optimizer.load_state_dict(ck.optimizer)
        self.generator.set_state(ck.rng["data"])
        torch.set_rng_state(ck.rng["torch"])
        self.step, self.elapsed = ck.step, float(ck.state["elapsed"])
        self.loss_sum, self.loss_count = float(ck.state["loss_sum"]), int(ck.state["loss_count"])


def train(
    model: nn.Module,
    config: TrainConfig,
    batches: BatchFn,
    *,
    loss_fn: LossFn = next_token_loss,
    evaluate: EvalFn | None = None,
    out_dir: Path | str | None = None,
    resume: bool = False,
    reporter: Reporter | None = None,
    stop: StopToken | None = None,
) -> TrainResult:
    """Train ``model`` for ``config.steps`` AdamW steps; see the module docstring for the files.

    batches: ``batches(generator) -> batch``, drawing all randomness from the generator given.
    loss_fn: ``loss_fn(model, batch) -> scalar``; default next-token cross-entropy on
    ``(inputs (B, n), targets (B, n))``.
    evaluate: ``evaluate(model, step) -> dict`` of JSON-able metrics, run under ``no_grad`` in
    eval mode at step 0, every ``eval_every`` steps and at the end; it must not draw from the data
    generator (the global RNG is restored around it).
    out_dir: the run directory (metrics.jsonl, checkpoints); None keeps everything in memory.
    resume: continue the run in ``out_dir`` from its newest checkpoint, exactly.
    stop: read after every step; a reason ends the run as Ctrl-C does, in ``result.stopped``.
    """
    if resume and out_dir is None:
        raise ValueError("resume needs out_dir, the directory of the run to continue")
    t0 = time.perf_counter()
    torch.manual_seed(config.seed)
    loop = _Loop(
        model, config, make_optimizer(model, config), torch.Generator().manual_seed(config.seed)
    )
    metrics = _open_run(loop, Path(out_dir), resume) if out_dir is not None else None
    last_ck = latest_checkpoint(Path(out_dir)) if out_dir is not None and resume else None
    log = _Log(loop, metrics, reporter)
    if reporter is not None:
        reporter.start(config.steps, loop.step)
    if loop.step == 0 and evaluate is not None and config.eval_every:
        log.write(_run_eval(model, evaluate, 0))
    interrupted, stopped = False, None
    try:
        with _sigint_flag(enabled=out_dir is not None) as stop_requested:
            while loop.step < config.steps and not interrupted and stopped is None:
                step_t0 = time.perf_counter()
                _one_step(loop, batches, loss_fn, log)
                loop.elapsed += time.perf_counter() - step_t0
                interrupted = stop_requested()
                stopped = stop.reason if stop is not None else None
                if evaluate is not None and _due(loop.step, config.eval_every, config.steps):
                    log.write(_run_eval(model, evaluate, loop.step))
                end = loop.step == config.steps or interrupted or stopped is not None
                if out_dir is not None and (_due(loop.step, config.checkpoint_every, 0) or end):
                    log.sync()
                    last_ck = save_checkpoint(Path(out_dir), model, loop.optimizer, loop.state())
    finally:
        log.close()
        if reporter is not None:
            reporter.finish()
    wall = time.perf_counter() - t0
    return TrainResult(loop.step, interrupted, loop.history, wall, loop.elapsed, last_ck, stopped)


def _due(step: int, every: int, last: int) -> bool:
    return (every > 0 and step % every == 0) or step == last


def _one_step(loop: _Loop, batches: BatchFn, loss_fn: LossFn, log: _Log) -> None:
    lr = lr_at(loop.config, loop.step)
    for group in loop.optimizer.param_groups:
        group["lr"] = lr
    loop.model.train()
    loss = loss_fn(loop.model, batches(loop.generator))
    loop.optimizer.zero_grad(set_to_none=True)
    loss.backward()
    if loop.config.grad_clip:
        nn.utils.clip_grad_norm_(loop.model.parameters(), loop.config.grad_clip)
    loop.optimizer.step()
    loop.step += 1
    value = float(loss.detach())
    if not math.isfinite(value):
        raise FloatingPointError(
            f"the training loss became {value} at step {loop.step}; lower the learning rate "
            f"(lr={loop.config.lr}) or raise warmup_steps"
        )
    loop.loss_sum, loop.loss_count = loop.loss_sum + value, loop.loss_count + 1
    if _due(loop.step, loop.config.log_every, loop.config.steps):
        mean = loop.loss_sum / loop.loss_count
        log.write(
            {
                "step": loop.step,
                "kind": "train",
                "loss": mean,
                "lr": lr,
                "elapsed": round(loop.elapsed, 3),
            }
        )
        loop.loss_sum, loop.loss_count = 0.0, 0
    log.progress(loop.step, value, lr)


def _run_eval(model: nn.Module, evaluate: EvalFn, step: int) -> dict[str, Any]:
    was_training = model.training
    rng = torch.get_rng_state()
    model.eval()
    try:
        with torch.no_grad():
            metrics = evaluate(model, step)
    finally:
        torch.set_rng_state(rng)
        model.train(was_training)
    return eval_record(step, metrics)


def eval_record(step: int, metrics: dict[str, Any]) -> dict[str, Any]:
    """The history's record of an evaluation at ``step`` (what metrics.jsonl holds)."""
    return {"step": step, "kind": "eval", **jsonable(metrics)}


class _Log:
    """Appends records to the history, metrics.jsonl and the reporter."""

    def __init__(self, loop: _Loop, stream: TextIO | None, reporter: Reporter | None) -> None:
        self.loop, self.stream, self.reporter = loop, stream, reporter

    def write(self, record: dict[str, Any]) -> None:
        self.loop.history.append(record)
        if self.stream is not None:
            self.stream.write(json.dumps(record) + "\n")
            self.stream.flush()
        if self.reporter is not None:
            self.reporter.record(record)

    def progress(self, step: int, loss: float, lr: float) -> None:
        if self.reporter is not None:
            self.reporter.update(step, loss, lr)

    def sync(self) -> None:
        if self.stream is not None:
            os.fsync(self.stream.fileno())

    def close(self) -> None:
        if self.stream is not None:
            self.stream.close()


def _open_run(loop: _Loop, out_dir: Path, resume: bool) -> TextIO:
    """Prepare the run directory; on resume restore the state and keep metrics up to its step.

    A resume creates nothing: a refused one (no such run, a checkpoint refused) leaves no empty
    folder behind where the user meant to name an existing run."""
    path = out_dir / "metrics.jsonl"
    if resume:
        loop.restore(load_checkpoint(out_dir))
        loop.history = [r for r in read_metrics(path) if r["step"] <= loop.step]
        write_atomic(path, "".join(json.dumps(r) + "\n" for r in loop.history).encode())
    else:
        out_dir.mkdir(parents=True, exist_ok=True)
        existing = latest_checkpoint(out_dir)
        if existing is not None:
            raise CheckpointError(
                f"{out_dir} already holds a run (checkpoint {existing.name}); resume it with "
                "--resume, or choose another --out directory"
            )
        path.unlink(missing_ok=True)
    return open(path, "a", encoding="utf-8")


def read_metrics(path: Path | str) -> list[dict[str, Any]]:
    """The records of a metrics.jsonl file; a torn last line (a killed writer) is skipped."""
    path = Path(path)
    if not path.exists():
        return []
    records = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            records.append(json.loads(line))
        except ValueError:
            continue
    return records


@contextmanager
def _sigint_flag(enabled: bool = True) -> Iterator[Callable[[], bool]]:
    """While active, the first Ctrl-C only sets a flag (the loop saves and stops); a second one
    interrupts at once. Disabled (a run with nothing to save) or outside the main thread, where
    signals cannot be caught, Ctrl-C raises KeyboardInterrupt as usual."""
    hit = threading.Event()
    if not enabled or threading.current_thread() is not threading.main_thread():
        yield hit.is_set
        return
    previous = signal.getsignal(signal.SIGINT)

    def handler(signum: int, frame: Any) -> None:
        if hit.is_set():
            raise KeyboardInterrupt
        hit.set()

    signal.signal(signal.SIGINT, handler)
    try:
        yield hit.is_set
    finally:
        signal.signal(signal.SIGINT, previous)
