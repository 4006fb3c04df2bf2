"""Checkpoints of a training run: written atomically, verified before anything is loaded.

Layout, inside a run directory::

    checkpoints/latest             the name of the newest complete checkpoint, e.g. "step-000500"
    checkpoints/step-000500/       model.safetensors, optimizer.safetensors, state.json

``state.json`` holds the step, every RNG state (the data generator's and torch's global one), the
optimizer's hyper-parameters, the training config and the SHA-256 of both tensor files.

Atomic: each checkpoint is written whole (:func:`headlab.files.write_folder`: a temporary
directory, every file fsynced, renamed into place), and only then is ``latest`` replaced
(:func:`headlab.files.write_atomic`). A process killed at any point leaves ``latest`` naming a
complete checkpoint. Loading verifies sizes and hashes and parses everything before touching the
model, so a corrupt or truncated checkpoint is refused, never half-loaded.
:func:`headlab.training.train.train` writes and resumes them.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import math
import re
import shutil
from collections.abc import Callable
from dataclasses import asdict, dataclass, is_dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load as load_safetensors_bytes
from safetensors.torch import save as save_safetensors_bytes
from torch import Tensor, nn

from headlab.files import remove_leftovers, write_atomic, write_folder

# 2: state.json carries the SHA-256 of its own content (format 1 had none, so a hand-edited step
# or RNG state went unnoticed)
CHECKPOINT_FORMAT = 2
TENSOR_FILES = ("model.safetensors", "optimizer.safetensors")


class CheckpointError(ValueError):
    """A checkpoint that cannot be used: missing, corrupt, truncated, or from another run."""


# training-config fields that change only bookkeeping, never the weights: a resumed run may
# change them
_BOOKKEEPING = {"eval_every", "log_every", "checkpoint_every", "keep_checkpoints"}


@dataclass
class Checkpoint:
    """A checkpoint read fully into memory and verified (sizes, SHA-256, parse)."""

    path: Path
    state: dict[str, Any]  # state.json: step, rng, config, optimizer groups, file hashes
    model: dict[str, Tensor]  # the model's state_dict
    optimizer: dict[str, Any]  # the optimizer's state_dict
    rng: dict[str, Tensor]  # "data" and "torch": RNG states, decoded and checked

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
    try:
        name = pointer.read_text(encoding="utf-8", errors="replace").strip()
    except OSError as e:
        raise CheckpointError(f"{pointer} is unreadable ({e.strerror})") from None
    digits = name[5:]
    if not name.startswith("step-") or not (digits.isascii() and digits.isdigit()):
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
    full_state["sha256"] = state_digest(full_state)
    blobs["state.json"] = json.dumps(full_state, indent=1, sort_keys=True).encode()
    write_folder(final, blobs)  # replaces a stale copy that ``latest`` never named
    write_atomic(root / "latest", name.encode())
    _prune(root, keep=int(state.get("config", {}).get("keep_checkpoints", 2)), current=name)
    return final


def load_checkpoint(out_dir: Path) -> Checkpoint:
    """Read and verify the newest checkpoint of a run; raise CheckpointError if it is unusable,
    saying which other checkpoint of the run is intact, if one is."""
    root = checkpoint_dir(out_dir)
    try:
        path = latest_checkpoint(out_dir)
    except CheckpointError as e:
        raise CheckpointError(str(e) + _intact_hint(root, None)) from None
    if path is None:
        raise CheckpointError(f"no checkpoint in {root}; start the run without --resume")
    try:
        return read_checkpoint(path)
    except CheckpointError as e:
        raise CheckpointError(str(e) + _intact_hint(root, path)) from None


def read_checkpoint(path: Path) -> Checkpoint:
    """Read one checkpoint directory fully into memory and verify it: state.json against its
    schema and its own SHA-256, the tensor files' sizes and SHA-256, the RNG states. Nothing is
    loaded into a model here, so a refusal leaves every model untouched."""
    if not path.is_dir():
        raise CheckpointError(f"checkpoint {path} named by 'latest' is missing")
    state = _read_state(path)
    blobs = {fname: _read_verified(path / fname, state["files"][fname]) for fname in TENSOR_FILES}
    try:
        model = load_safetensors_bytes(blobs["model.safetensors"])
        opt_tensors = load_safetensors_bytes(blobs["optimizer.safetensors"])
        optimizer = _unflatten_optimizer(opt_tensors, state["optimizer"])
    except (SafetensorError, KeyError, ValueError, TypeError) as e:
        raise CheckpointError(f"checkpoint {path} is corrupt: {e}") from None
    rng = {kind: _checked_rng(path, kind, state["rng"][kind]) for kind in ("data", "torch")}
    return Checkpoint(path, state, model, optimizer, rng)


def state_digest(state: dict[str, Any]) -> str:
    """SHA-256 of state.json's content without its own ``sha256`` field (canonical JSON)."""
    content = {k: v for k, v in state.items() if k != "sha256"}
    text = json.dumps(content, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def _intact_hint(root: Path, refused: Path | None) -> str:
    """'; the intact checkpoint step-… remains: …', naming the newest other checkpoint that
    verifies, or a note that none does."""
    others = sorted((p for p in root.glob("step-*") if p != refused and p.is_dir()), reverse=True)
    for other in others:
        try:
            read_checkpoint(other)
        except CheckpointError:
            continue
        return (
            f"; the intact checkpoint {other.name} remains: write {other.name} into "
            f"{root / 'latest'} to resume from it"
        )
    return "; no other intact checkpoint remains in this run"


def _read_state(path: Path) -> dict[str, Any]:
    """state.json, parsed, checked against its schema and its own SHA-256."""
    try:
        state = json.loads((path / "state.json").read_bytes())
    except (OSError, ValueError, RecursionError) as e:
        raise CheckpointError(
            f"checkpoint {path} is corrupt: state.json unreadable ({e})"
        ) from None
    if not isinstance(state, dict):
        raise CheckpointError(
            f"checkpoint {path} is corrupt: state.json should hold an object, got "
            f"{type(state).__name__}"
        )
    if state.get("format") != CHECKPOINT_FORMAT:
        raise CheckpointError(
            f"checkpoint {path} has format {state.get('format')!r}; this headlab reads format "
            f"{CHECKPOINT_FORMAT} (start the run again without --resume, in a new --out)"
        )
    problem = state_problem(state)
    if problem is not None:
        raise CheckpointError(f"checkpoint {path} is corrupt: state.json {problem}")
    if state_digest(state) != state["sha256"]:
        raise CheckpointError(
            f"checkpoint {path} is altered or corrupt: state.json does not match its SHA-256 "
            "(edited by hand?)"
        )
    if path.name != f"step-{state['step']:06d}":
        raise CheckpointError(
            f"checkpoint {path} is corrupt: its state.json is for step {state['step']}"
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


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _hex64(value: Any) -> bool:
    return isinstance(value, str) and re.fullmatch(r"[0-9a-f]{64}", value) is not None


def _file_entry(value: Any) -> bool:
    return isinstance(value, dict) and _whole(value.get("bytes")) and _hex64(value.get("sha256"))


def _optimizer_meta(value: Any) -> bool:
    if not isinstance(value, dict) or not isinstance(value.get("scalars"), dict):
        return False
    groups = value.get("param_groups")
    return isinstance(groups, list) and all(
        isinstance(g, dict) and isinstance(g.get("params"), list) and all(map(_whole, g["params"]))
        for g in groups
    )


# state.json's schema: field -> (test, what a valid value is)
STATE_SCHEMA: dict[str, tuple[Callable[[Any], bool], str]] = {
    "format": (_whole, "a whole number"),
    "sha256": (_hex64, "64 hexadecimal digits"),
    "step": (_whole, "a whole number >= 0"),
    "elapsed": (lambda v: _number(v) and v >= 0, "a number of seconds >= 0"),
    "loss_sum": (_number, "a finite number"),
    "loss_count": (_whole, "a whole number >= 0"),
    "config": (lambda v: isinstance(v, dict), "an object of training settings"),
    "model_config": (lambda v: v is None or isinstance(v, dict), "an object or null"),
    "rng": (
        lambda v: isinstance(v, dict) and all(isinstance(v.get(k), str) for k in ("data", "torch")),
        'an object with "data" and "torch" RNG states (base64 text)',
    ),
    "files": (
        lambda v: isinstance(v, dict) and all(_file_entry(v.get(f)) for f in TENSOR_FILES),
        f'an object with {" and ".join(TENSOR_FILES)}, each {{"bytes", "sha256"}}',
    ),
    "optimizer": (_optimizer_meta, 'an object with "param_groups" and "scalars"'),
}


def state_problem(state: dict[str, Any]) -> str | None:
    """What is wrong with a parsed state.json against :data:`STATE_SCHEMA`, or None."""
    for name, (valid, what) in STATE_SCHEMA.items():
        if name not in state:
            return f"lacks the field {name!r} ({what})"
        if not valid(state[name]):
            return f"field {name!r} should be {what}, got {_short(state[name])}"
    return None


def _short(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _checked_rng(path: Path, kind: str, text: str) -> Tensor:
    """A saved RNG state, decoded and tried on a scratch generator: CheckpointError if it is not
    one, before any model or generator is touched."""
    try:
        state = rng_from_json(text)
        torch.Generator().set_state(state)
    except (ValueError, RuntimeError, binascii.Error) as e:
        raise CheckpointError(
            f"checkpoint {path} is corrupt: its {kind!r} RNG state is not a torch RNG state ({e})"
        ) from None
    return state


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


def _prune(root: Path, keep: int, current: str) -> None:
    names = sorted(p.name for p in root.iterdir() if p.name.startswith("step-") and p.is_dir())
    stale = [n for n in names if n != current][: max(0, len(names) - keep)]
    for name in stale:
        shutil.rmtree(root / name, ignore_errors=True)
    remove_leftovers(root)  # of runs killed mid-save: one process writes a run, so all are stale


def check_compatible(
    ck: Checkpoint, model: nn.Module, optimizer: torch.optim.Optimizer, config: dict[str, Any]
) -> None:
    """Refuse to resume into a different run: training config (``asdict`` of a TrainConfig),
    model config, tensor names and shapes."""
    saved, now = ck.state["config"], config
    changed = [k for k in now if k not in _BOOKKEEPING and saved.get(k) != jsonable(now[k])]
    if changed:
        diffs = ", ".join(
            f"{k}: {saved.get(k)!r} in the checkpoint, {now[k]!r} now" for k in changed
        )
        raise CheckpointError(f"checkpoint {ck.path} is from a different run ({diffs})")
    model_config = model_config_of(model)
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


def model_config_of(model: nn.Module) -> Any:
    """The model's dataclass config as plain JSON values, or None when it has none."""
    config = getattr(model, "config", None)
    if config is None or not is_dataclass(config) or isinstance(config, type):
        return None
    return jsonable(asdict(config))


def jsonable(value: Any) -> Any:
    """``value`` as it reads back from JSON (tuples become lists, and so on)."""
    return json.loads(json.dumps(value))


def rng_to_json(state: Tensor) -> str:
    """A torch RNG state (a uint8 tensor) as base64 text for state.json."""
    return base64.b64encode(state.numpy().tobytes()).decode("ascii")


def rng_from_json(text: str) -> Tensor:
    """The uint8 RNG state tensor that :func:`rng_to_json` wrote."""
    return torch.frombuffer(bytearray(base64.b64decode(text, validate=True)), dtype=torch.uint8)
