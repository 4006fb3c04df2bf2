"""One training loop for every headlab model: seeded, logged, checkpointed, exactly resumable.

``train(model, config, batches, ...)`` runs AdamW with a linear warm-up and a cosine decay. The
caller brings the data (``batches(generator) -> batch``), optionally the loss
(``loss_fn(model, batch) -> scalar``, next-token cross-entropy by default) and an evaluation hook
(``evaluate(model, step) -> dict``, run every ``eval_every`` steps and at the end); experiments and
the shipped model all call this one function.

Run directory (``out_dir``), when given::

    metrics.jsonl                  one JSON record per line: {"step", "kind": "train"|"eval", ...}
    checkpoints/latest             the name of the newest complete checkpoint, e.g. "step-000500"
    checkpoints/step-000500/       model.safetensors, optimizer.safetensors, state.json

``state.json`` holds the step, every RNG state (the data generator's and torch's global one), the
optimizer's hyper-parameters, the training config and the SHA-256 of both tensor files.

Exact resume: a checkpoint at step k is the complete state after k optimizer steps. Resuming
restores the weights, the optimizer moments, the data generator and the global RNG, and the
learning rate is a pure function of the step, so a resumed run takes the same steps as an
uninterrupted one and ends with bit-identical weights on CPU.

Atomic checkpoints: each is written into a temporary directory, every file is fsynced, the
directory is renamed into place, and only then is ``latest`` replaced (temporary file, fsync,
rename). A process killed at any point leaves ``latest`` naming a complete checkpoint. Loading
verifies sizes and hashes and parses everything before touching the model, so a corrupt or
truncated checkpoint is refused, never half-loaded.

Ctrl-C (SIGINT) during a ``train`` with a run directory finishes the current step, saves a
checkpoint and returns with ``interrupted=True``; without one, KeyboardInterrupt is raised.
"""

from __future__ import annotations

import base64
import hashlib
import importlib
import json
import math
import os
import shutil
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Protocol, TextIO

import torch
from safetensors import SafetensorError
from safetensors.torch import load as load_safetensors_bytes
from safetensors.torch import save as save_safetensors_bytes
from torch import Tensor, nn

from headlab.measure import next_token_loss

CHECKPOINT_FORMAT = 1

Batch = Any
BatchFn = Callable[[torch.Generator], Batch]
LossFn = Callable[[nn.Module, Batch], Tensor]
EvalFn = Callable[[nn.Module, int], dict[str, Any]]


class CheckpointError(ValueError):
    """A checkpoint that cannot be used: missing, corrupt, truncated, or from another run."""


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
# Progress: the loop reports to a Reporter; the CLI picks a progress bar or plain log lines
# ---------------------------------------------------------------------------------------------


class Reporter(Protocol):
    """Receives progress from :func:`train`; the library itself never prints."""

    def start(self, total: int, step: int) -> None: ...

    def update(self, step: int, loss: float, lr: float) -> None: ...

    def record(self, record: dict[str, Any]) -> None: ...

    def message(self, text: str) -> None: ...

    def finish(self) -> None: ...


class LogReporter:
    """Plain log lines on a stream (for logs and pipes): one every ``every`` steps."""

    def __init__(self, stream: TextIO | None = None, every: int = 100) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.every = every
        self._t0 = time.perf_counter()
        self._step0 = 0
        self.total = 0

    def start(self, total: int, step: int) -> None:
        self.total, self._step0, self._t0 = total, step, time.perf_counter()
        self.message(f"training {total} steps" + (f", resuming at step {step}" if step else ""))

    def update(self, step: int, loss: float, lr: float) -> None:
        if step % self.every and step != self.total:
            return
        elapsed = time.perf_counter() - self._t0
        rate = (step - self._step0) / elapsed if elapsed > 0 else 0.0
        eta = (self.total - step) / rate if rate > 0 else float("nan")
        self.message(
            f"step {step}/{self.total}  loss {loss:.4f}  lr {lr:.2e}  "
            f"{rate:.1f} steps/s  eta {_duration(eta)}"
        )

    def record(self, record: dict[str, Any]) -> None:
        if record.get("kind") == "eval":
            shown = {k: v for k, v in record.items() if isinstance(v, float)}
            text = "  ".join(f"{k} {v:.4f}" for k, v in list(shown.items())[:6])
            self.message(f"eval @ step {record['step']}: {text}")

    def message(self, text: str) -> None:
        print(text, file=self.stream, flush=True)

    def finish(self) -> None:
        pass


class RichReporter:
    """A rich progress bar (steps/s, loss, ETA) for an interactive terminal."""

    def __init__(self, console: Any = None) -> None:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeRemainingColumn,
        )

        self.console = console if console is not None else Console(stderr=True)
        self.progress = Progress(
            TextColumn("[bold]train"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[rate]:.1f} steps/s"),
            TextColumn("loss {task.fields[loss]:.4f}"),
            TimeRemainingColumn(),
            console=self.console,
            transient=False,
        )
        self._task: Any = None
        self._t0 = 0.0
        self._step0 = 0

    def start(self, total: int, step: int) -> None:
        self.progress.start()
        self._t0, self._step0 = time.perf_counter(), step
        self._task = self.progress.add_task("train", total=total, completed=step, rate=0.0, loss=0)

    def update(self, step: int, loss: float, lr: float) -> None:
        elapsed = time.perf_counter() - self._t0
        rate = (step - self._step0) / elapsed if elapsed > 0 else 0.0
        self.progress.update(self._task, completed=step, loss=loss, rate=rate)

    def record(self, record: dict[str, Any]) -> None:
        pass

    def message(self, text: str) -> None:
        self.console.print(text)

    def finish(self) -> None:
        self.progress.stop()


def make_reporter(stream: TextIO | None = None, every: int = 100) -> Reporter:
    """A progress bar when ``stream`` (stderr by default) is a terminal, else plain log lines."""
    stream = stream if stream is not None else sys.stderr
    if stream.isatty():
        return RichReporter()
    return LogReporter(stream, every)


def _duration(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "?"
    minutes, secs = divmod(round(seconds), 60)
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


# ---------------------------------------------------------------------------------------------
# Checkpoints: written atomically, verified before anything is loaded
# ---------------------------------------------------------------------------------------------

# fields that change only bookkeeping, never the weights: a resumed run may change them
_BOOKKEEPING = {"eval_every", "log_every", "checkpoint_every", "keep_checkpoints"}


@dataclass
class Checkpoint:
    """A checkpoint read fully into memory and verified (sizes, SHA-256, parse)."""

    path: Path
    state: dict[str, Any]  # state.json: step, rng, config, optimizer groups, file hashes
    model: dict[str, Tensor]  # the model's state_dict
    optimizer: dict[str, Any]  # the optimizer's state_dict

    @property
    def step(self) -> int:
        return int(self.state["step"])


def checkpoint_dir(out_dir: Path) -> Path:
    """Where a run keeps its checkpoints."""
    return Path(out_dir) / "checkpoints"


def latest_checkpoint(out_dir: Path) -> Path | None:
    """The newest complete checkpoint named by ``checkpoints/latest``, or None if there is none."""
    pointer = checkpoint_dir(out_dir) / "latest"
    if not pointer.exists():
        return None
    name = pointer.read_text(encoding="utf-8", errors="replace").strip()
    if not name.startswith("step-") or "/" in name or not name[5:].isdigit():
        raise CheckpointError(f"{pointer} is corrupt: it should name a checkpoint, got {name!r}")
    return checkpoint_dir(out_dir) / name


def save_checkpoint(
    out_dir: Path, model: nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]
) -> Path:
    """Write a checkpoint for ``state["step"]`` atomically and point ``latest`` at it.

    The files go to a temporary directory that is fsynced and renamed into place; ``latest`` is
    replaced last, so a crash at any moment leaves the previous checkpoint current and loadable.
    """
    root = checkpoint_dir(out_dir)
    root.mkdir(parents=True, exist_ok=True)
    name = f"step-{int(state['step']):06d}"
    final = root / name
    if final.exists() and latest_checkpoint(out_dir) == final:
        return final  # this exact state is already saved
    opt_tensors, opt_meta = _flatten_optimizer(optimizer.state_dict())
    blobs = {
        "model.safetensors": save_safetensors_bytes(_plain_tensors(model.state_dict())),
        "optimizer.safetensors": save_safetensors_bytes(opt_tensors),
    }
    files = {
        f: {"bytes": len(b), "sha256": hashlib.sha256(b).hexdigest()} for f, b in blobs.items()
    }
    full_state = {**state, "format": CHECKPOINT_FORMAT, "optimizer": opt_meta, "files": files}
    blobs["state.json"] = json.dumps(full_state, indent=1, sort_keys=True).encode()
    tmp = root / f".tmp-{name}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    for fname, blob in blobs.items():
        _write_synced(tmp / fname, blob)
    _fsync_dir(tmp)
    if final.exists():  # a stale copy that ``latest`` never named: move it aside first
        final.rename(root / f".old-{name}-{os.getpid()}")
    tmp.rename(final)
    _fsync_dir(root)
    _replace_atomic(root / "latest", name.encode())
    _prune(root, keep=int(state.get("config", {}).get("keep_checkpoints", 2)), current=name)
    return final


def load_checkpoint(out_dir: Path) -> Checkpoint:
    """Read and verify the newest checkpoint of a run; raise CheckpointError if it is unusable."""
    path = latest_checkpoint(out_dir)
    if path is None:
        raise CheckpointError(
            f"no checkpoint in {checkpoint_dir(out_dir)}; start the run without --resume"
        )
    if not path.is_dir():
        raise CheckpointError(f"checkpoint {path} named by 'latest' is missing")
    state = _read_state(path)
    blobs = {}
    for fname, expect in state["files"].items():
        blobs[fname] = _read_verified(path / fname, expect)
    try:
        model = load_safetensors_bytes(blobs["model.safetensors"])
        opt_tensors = load_safetensors_bytes(blobs["optimizer.safetensors"])
    except (SafetensorError, KeyError) as e:
        raise CheckpointError(f"checkpoint {path} is corrupt: {e}") from None
    optimizer = _unflatten_optimizer(opt_tensors, state["optimizer"])
    return Checkpoint(path, state, model, optimizer)


def _read_state(path: Path) -> dict[str, Any]:
    try:
        state = json.loads((path / "state.json").read_bytes())
    except (OSError, ValueError) as e:
        raise CheckpointError(
            f"checkpoint {path} is corrupt: state.json unreadable ({e})"
        ) from None
    missing = {"step", "format", "files", "optimizer", "rng", "config"} - set(state)
    if not isinstance(state, dict) or missing:
        raise CheckpointError(f"checkpoint {path} is corrupt: state.json lacks {sorted(missing)}")
    if state["format"] != CHECKPOINT_FORMAT:
        raise CheckpointError(
            f"checkpoint {path} has format {state['format']}; this headlab reads format "
            f"{CHECKPOINT_FORMAT}"
        )
    return state


def _read_verified(path: Path, expect: dict[str, Any]) -> bytes:
    try:
        blob = path.read_bytes()
    except OSError as e:
        raise CheckpointError(f"checkpoint file {path} is missing or unreadable ({e})") from None
    if len(blob) != expect["bytes"]:
        raise CheckpointError(
            f"checkpoint file {path} is truncated or corrupt: {len(blob)} bytes, "
            f"expected {expect['bytes']}"
        )
    if hashlib.sha256(blob).hexdigest() != expect["sha256"]:
        raise CheckpointError(f"checkpoint file {path} is corrupt: its SHA-256 does not match")
    return blob


def _plain_tensors(tensors: dict[str, Tensor]) -> dict[str, Tensor]:
    # clones: safetensors refuses tensors that share memory (tied weights)
    return {k: v.detach().cpu().clone().contiguous() for k, v in tensors.items()}


def _flatten_optimizer(sd: dict[str, Any]) -> tuple[dict[str, Tensor], dict[str, Any]]:
    tensors: dict[str, Tensor] = {}
    scalars: dict[str, dict[str, Any]] = {}
    for idx, slots in sd["state"].items():
        for key, value in slots.items():
            if isinstance(value, Tensor):
                tensors[f"{idx}.{key}"] = value.detach().cpu().clone().contiguous()
            else:
                scalars.setdefault(str(idx), {})[key] = value
    return tensors, {"param_groups": sd["param_groups"], "scalars": scalars}


def _unflatten_optimizer(tensors: dict[str, Tensor], meta: dict[str, Any]) -> dict[str, Any]:
    state: dict[int, dict[str, Any]] = {}
    for name, value in tensors.items():
        idx, key = name.split(".", 1)
        state.setdefault(int(idx), {})[key] = value
    for idx, slots in meta.get("scalars", {}).items():
        state.setdefault(int(idx), {}).update(slots)
    groups = [
        {**g, "betas": tuple(g["betas"])} if "betas" in g else g for g in meta["param_groups"]
    ]
    return {"state": state, "param_groups": groups}


def _write_synced(path: Path, blob: bytes) -> None:
    with open(path, "wb") as f:
        f.write(blob)
        f.flush()
        os.fsync(f.fileno())


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _replace_atomic(path: Path, blob: bytes) -> None:
    """Replace ``path`` with ``blob``: temporary file, fsync, rename, fsync the directory."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    _write_synced(tmp, blob)
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def _prune(root: Path, keep: int, current: str) -> None:
    names = sorted(p.name for p in root.iterdir() if p.name.startswith("step-") and p.is_dir())
    stale = [n for n in names if n != current][: max(0, len(names) - keep)]
    for name in stale:
        shutil.rmtree(root / name, ignore_errors=True)
    # leftovers of runs killed mid-save (one process writes a run, so none is in progress now)
    for leftover in [*root.glob(".old-*"), *root.glob(".tmp-*")]:
        shutil.rmtree(leftover, ignore_errors=True)
    for leftover in root.glob(".latest.tmp-*"):
        leftover.unlink(missing_ok=True)


def _check_compatible(
    ck: Checkpoint, model: nn.Module, optimizer: torch.optim.Optimizer, config: TrainConfig
) -> None:
    """Refuse to resume into a different run: config, model config, tensor names and shapes."""
    saved, now = ck.state["config"], asdict(config)
    changed = [k for k in now if k not in _BOOKKEEPING and saved.get(k) != _jsonable(now[k])]
    if changed:
        diffs = ", ".join(
            f"{k}: {saved.get(k)!r} in the checkpoint, {now[k]!r} now" for k in changed
        )
        raise CheckpointError(f"checkpoint {ck.path} is from a different run ({diffs})")
    model_config = _model_config(model)
    if ck.state.get("model_config") != model_config:
        raise CheckpointError(
            f"checkpoint {ck.path} was saved from model config {ck.state.get('model_config')}, "
            f"not {model_config}"
        )
    own = model.state_dict()
    wrong = sorted(set(own) ^ set(ck.model)) or [
        k for k in own if tuple(own[k].shape) != tuple(ck.model[k].shape)
    ]
    if wrong:
        raise CheckpointError(
            f"checkpoint {ck.path} does not fit this model (tensors differ: {wrong[:5]})"
        )
    sizes = [len(g["params"]) for g in optimizer.state_dict()["param_groups"]]
    if sizes != [len(g["params"]) for g in ck.optimizer["param_groups"]]:
        raise CheckpointError(f"checkpoint {ck.path} optimizer does not fit this model")


def _model_config(model: nn.Module) -> Any:
    config = getattr(model, "config", None)
    if config is None or not hasattr(config, "__dataclass_fields__"):
        return None
    return _jsonable(asdict(config))


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value))


def _rng_to_json(state: Tensor) -> str:
    return base64.b64encode(state.numpy().tobytes()).decode("ascii")


def _rng_from_json(text: str) -> Tensor:
    return torch.frombuffer(bytearray(base64.b64decode(text)), dtype=torch.uint8)


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
            "config": _jsonable(asdict(self.config)),
            "model_config": _model_config(self.model),
            "rng": {
                "data": _rng_to_json(self.generator.get_state()),
                "torch": _rng_to_json(torch.get_rng_state()),
            },
        }

    def restore(self, ck: Checkpoint) -> None:
        _check_compatible(ck, self.model, self.optimizer, self.config)
        self.model.load_state_dict(ck.model)
        self.optimizer.load_state_dict(ck.optimizer)
        self.generator.set_state(_rng_from_json(ck.state["rng"]["data"]))
        torch.set_rng_state(_rng_from_json(ck.state["rng"]["torch"]))
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
    interrupted = False
    try:
        with _sigint_flag(enabled=out_dir is not None) as stop_requested:
            while loop.step < config.steps and not interrupted:
                step_t0 = time.perf_counter()
                _one_step(loop, batches, loss_fn, log)
                loop.elapsed += time.perf_counter() - step_t0
                interrupted = stop_requested()
                if evaluate is not None and _due(loop.step, config.eval_every, config.steps):
                    log.write(_run_eval(model, evaluate, loop.step))
                end = loop.step == config.steps or interrupted
                if out_dir is not None and (_due(loop.step, config.checkpoint_every, 0) or end):
                    log.sync()
                    last_ck = save_checkpoint(Path(out_dir), model, loop.optimizer, loop.state())
    finally:
        log.close()
        if reporter is not None:
            reporter.finish()
    wall = time.perf_counter() - t0
    return TrainResult(loop.step, interrupted, loop.history, wall, loop.elapsed, last_ck)


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
        log.write({"step": loop.step, "kind": "train", "loss": mean, "lr": lr,
                   "elapsed": round(loop.elapsed, 3)})  # fmt: skip
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
    return {"step": step, "kind": "eval", **_jsonable(metrics)}


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
    """Prepare the run directory; on resume restore the state and keep metrics up to its step."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "metrics.jsonl"
    if resume:
        loop.restore(load_checkpoint(out_dir))
        loop.history = [r for r in read_metrics(path) if r["step"] <= loop.step]
        _replace_atomic(path, "".join(json.dumps(r) + "\n" for r in loop.history).encode())
    else:
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


# ---------------------------------------------------------------------------------------------
# Recipes: named training runs for `headlab train NAME`
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RecipeArgs:
    """What `headlab train` passes to a recipe."""

    out: Path  # the run directory
    quick: bool = False  # a short version (for tests and a first look)
    seed: int = 0
    resume: bool = False
    reporter: Reporter | None = None


# name -> "module:function"; the function takes RecipeArgs and returns a TrainResult. Imported
# only when used, so `headlab --help` stays fast and the rooms below need not import the ones above.
RECIPES: dict[str, str] = {
    "induction": "headlab.experiments.induction:train_recipe",
    "default": "headlab.default_model:train_recipe",
}


def get_recipe(name: str) -> Callable[[RecipeArgs], TrainResult]:
    """The recipe function registered under ``name``; ValueError naming the valid ones."""
    if name not in RECIPES:
        raise ValueError(f"unknown recipe {name!r}; valid recipes: {', '.join(sorted(RECIPES))}")
    module, func = RECIPES[name].split(":")
    recipe: Callable[[RecipeArgs], TrainResult] = getattr(importlib.import_module(module), func)
    return recipe


def config_fields() -> list[str]:
    """The names of TrainConfig's fields (for messages and the CLI)."""
    return [f.name for f in fields(TrainConfig)]
