"""Checkpoints of a training run: written atomically, verified before anything is loaded.

Layout, inside a run directory::

    checkpoints/latest             the name of the newest complete checkpoint, e.g. "step-000500"
    checkpoints/step-000500/       model.safetensors, optimizer.safetensors, state.json

``state.json`` holds the step, every RNG state (the data generator's and torch's global one), the
optimizer's hyper-parameters, the training config and the SHA-256 of both tensor files.

Atomic: each checkpoint is written whole (:func:`headlab.files.write_folder`: a temporary
directory, every file fsynced, renamed into place), and only then is ``latest`` replaced
(:func:`headlab.files.write_atomic`). A process killed at any point leaves ``latest`` naming a
complete checkpoint, or a newer complete folder that ``latest`` does not name yet, which a
resume takes (:func:`latest_checkpoint`). Loading verifies sizes and hashes and parses
everything before touching the model, so a corrupt or truncated checkpoint is refused, never
half-loaded.
:func:`headlab.training.train.train` writes and resumes them.

Checked by meaning, not by hash alone. The SHA-256s catch corruption (a torn write, a flipped
bit, a truncated copy, a hand edit that left the hash as it was); they are not a signature, since
anyone who can write the folder can recompute them. So before anything is loaded a checkpoint
must also make sense (:mod:`headlab.checkpoint.schema`: every field of its type and range; the
step agreeing with the folder's name, the run's length and the optimizer's own step counters;
Adam's state complete, finite, second moments >= 0) and fit the run resumed
(:func:`check_compatible`: its settings, the optimizer's hyper-parameters and learning rate, the
model's tensors and the optimizer state's shapes). Each refusal is one sentence naming the field.

Out of scope: a self-consistent forgery of values — a weight, a moment or an RNG state changed
to another valid one, every hash recomputed. That is a valid checkpoint of some other run; telling
it from this run's would need a secret key (a MAC), which a run folder meant to be copied between
machines does not have, and a second record of the hashes in the same folder (metrics.jsonl, an
older checkpoint) could be rewritten just as easily. Guard a run folder as you guard code you run.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import shutil
from dataclasses import asdict, dataclass, is_dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load as load_safetensors_bytes
from safetensors.torch import save as save_safetensors_bytes
from torch import Tensor, nn

from headlab.checkpoint.schema import TENSOR_FILES, content_problem, short, state_problem
from headlab.files import remove_leftovers, write_atomic, write_folder

# 2: state.json carries the SHA-256 of its own content (format 1 had none, so a hand-edited step
# or RNG state went unnoticed)
CHECKPOINT_FORMAT = 2


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
    """The newest complete checkpoint of a run, or None if there is none: the one
    ``checkpoints/latest`` names, unless a newer ``step-*`` folder verifies
    (:func:`read_checkpoint`): a save killed after its folder was renamed into place (whole)
    but before ``latest`` was written, even the run's first, whose work is kept. With no
    ``latest`` at all, the newest folder (a resume then verifies it, naming the intact ones)."""
    root = checkpoint_dir(out_dir)
    named = _named_by_latest(root)
    after = -1 if named is None else _step(named.name)
    newer = sorted(
        (p for p in root.glob("step-*") if p.is_dir() and _step(p.name) > after),
        key=lambda p: _step(p.name),
        reverse=True,
    )
    for folder in newer:
        try:
            read_checkpoint(folder)
        except CheckpointError:
            continue
        return folder
    return named if named is not None or not newer else newer[0]


def _named_by_latest(root: Path) -> Path | None:
    """The checkpoint ``root/latest`` names, or None when there is no ``latest``; a
    CheckpointError when it names no checkpoint."""
    pointer = root / "latest"
    if not pointer.exists():
        return None
    try:
        name = pointer.read_text(encoding="utf-8", errors="replace").strip()
    except OSError as e:
        raise CheckpointError(f"{pointer} is unreadable ({e.strerror})") from None
    if _step(name) < 0:
        raise CheckpointError(f"{pointer} is corrupt: it should name a checkpoint, got {name!r}")
    return root / name


def _step(name: str) -> int:
    """The step of a checkpoint's name ``step-000500``; -1 for a name that is not one."""
    digits = name[5:]
    ok = name.startswith("step-") and digits.isascii() and digits.isdigit()
    return int(digits) if ok else -1


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
    schema and its own SHA-256, the tensor files' sizes and SHA-256, the content's meaning
    (:func:`headlab.checkpoint.schema.content_problem`), the RNG states. Nothing is loaded into
    a model here, so a refusal leaves every model untouched."""
    if not path.is_dir():
        raise CheckpointError(f"checkpoint {path} named by 'latest' is missing")
    state = _read_state(path)
    blobs = {fname: _read_verified(path / fname, state["files"][fname]) for fname in TENSOR_FILES}
    try:
        model = load_safetensors_bytes(blobs["model.safetensors"])
        opt_tensors = load_safetensors_bytes(blobs["optimizer.safetensors"])
    except (SafetensorError, ValueError) as e:
        raise CheckpointError(f"checkpoint {path} is corrupt: {e}") from None
    problem = content_problem(state, model, opt_tensors)
    if problem is not None:
        raise CheckpointError(f"checkpoint {path} is altered or corrupt: {problem}")
    optimizer = _unflatten_optimizer(opt_tensors, state["optimizer"])
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
    ck: Checkpoint,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    config: dict[str, Any],
    lr: float | None = None,
) -> None:
    """Refuse to resume into a different run, before anything is loaded: the training config
    (``asdict`` of a TrainConfig; bookkeeping settings may change but must be whole numbers),
    the model config, tensor names, shapes and dtypes, the optimizer's param groups (every
    hyper-parameter as this run's fresh ``optimizer`` has it; ``lr``, when given, is what the
    run's schedule gives at the checkpoint's step) and its per-parameter state's shapes."""
    _check_config(ck, config)
    model_config = model_config_of(model)
    if ck.state.get("model_config") != model_config:
        raise CheckpointError(
            f"checkpoint {ck.path} was saved from model config {ck.state.get('model_config')}, "
            f"not {model_config}"
        )
    own = model.state_dict()
    wrong = sorted(set(own) ^ set(ck.model)) or [
        k
        for k in own
        if tuple(own[k].shape) != tuple(ck.model[k].shape) or own[k].dtype != ck.model[k].dtype
    ]
    if wrong:
        raise CheckpointError(
            f"checkpoint {ck.path} does not fit this model (tensors differ: {wrong[:5]})"
        )
    _check_groups(ck, optimizer, lr)
    _check_param_state(ck, optimizer)


def _check_config(ck: Checkpoint, now: dict[str, Any]) -> None:
    saved = ck.state["config"]
    unknown = sorted(set(saved) - set(now))
    if unknown:
        raise CheckpointError(
            f"checkpoint {ck.path} is from a different run: its config has an unknown setting "
            f"{unknown[0]!r}"
        )
    for k in sorted(_BOOKKEEPING & set(saved)):
        value = saved[k]
        if not (isinstance(value, int) and not isinstance(value, bool) and value >= 0):
            raise CheckpointError(
                f"checkpoint {ck.path} is corrupt: its config {k!r} should be a whole number "
                f">= 0, got {short(value)}"
            )
    changed = [k for k in now if k not in _BOOKKEEPING and saved.get(k) != jsonable(now[k])]
    if changed:
        diffs = ", ".join(
            f"{k}: {saved.get(k)!r} in the checkpoint, {now[k]!r} now" for k in changed
        )
        raise CheckpointError(f"checkpoint {ck.path} is from a different run ({diffs})")


# param-group fields without which a group fails at its first step (torch fills in the flags)
_GROUP_NEEDS = {"params", "lr", "betas", "eps", "weight_decay"}


def _check_groups(ck: Checkpoint, optimizer: torch.optim.Optimizer, lr: float | None) -> None:
    """Each saved param group holds this run's parameters with this run's hyper-parameters:
    torch's ``load_state_dict`` takes the saved groups as they are, so a weight_decay edited
    in state.json would otherwise replace the run's."""
    fresh = jsonable(optimizer.state_dict()["param_groups"])
    saved_groups = ck.state["optimizer"]["param_groups"]
    if len(saved_groups) != len(fresh):
        raise CheckpointError(
            f"checkpoint {ck.path} optimizer has {len(saved_groups)} param groups, this run's "
            f"has {len(fresh)}: it does not fit this model"
        )
    for i, (now, saved) in enumerate(zip(fresh, saved_groups, strict=True)):
        for key in sorted(now.keys() - {"lr"}):
            if (key in saved and saved[key] == now[key]) or key not in saved.keys() | _GROUP_NEEDS:
                continue
            got = repr(saved[key]) if key in saved else "missing"
            raise CheckpointError(
                f"checkpoint {ck.path} is from a different run: optimizer param group {i} "
                f"{key!r} is {got} in the checkpoint, {now[key]!r} for this run's settings"
            )
        if "lr" not in saved or (lr is not None and saved["lr"] != lr):
            raise CheckpointError(
                f"checkpoint {ck.path} is altered: optimizer param group {i} 'lr' is "
                f"{saved.get('lr', 'missing')!r}; this run's schedule gives {lr!r} after step "
                f"{ck.step}"
            )


def _check_param_state(ck: Checkpoint, optimizer: torch.optim.Optimizer) -> None:
    """Every per-parameter tensor of the optimizer (Adam's moments) has its parameter's shape
    and dtype; counters are 0-dimensional (checked with the content)."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    for idx, slots in sorted(ck.optimizer["state"].items()):
        param = params[idx]  # the groups' params matched this optimizer's just before
        for slot, value in sorted(slots.items()):
            if not isinstance(value, Tensor) or value.dim() == 0:
                continue
            name, dtype = f"'{idx}.{slot}'", str(param.dtype).removeprefix("torch.")
            if value.shape != param.shape:
                raise CheckpointError(
                    f"checkpoint {ck.path} does not fit this model: optimizer state {name} has "
                    f"shape {list(value.shape)}; its parameter has {list(param.shape)}"
                )
            if value.dtype != param.dtype:
                raise CheckpointError(
                    f"checkpoint {ck.path} is altered or corrupt: optimizer state {name} is "
                    f"{str(value.dtype).removeprefix('torch.')}; its parameter is {dtype}"
                )


def model_config_of(model: nn.Module) -> Any:
    """The model's dataclass config as plain JSON values, or None when it has none."""
    config = getattr(model, "config", None)
    if config is None or not is_dataclass(config) or isinstance(config, type):
        return None
    to_dict = getattr(config, "to_dict", None)  # a ModelConfig leaves out unused variants
    return jsonable(to_dict() if callable(to_dict) else asdict(config))


def jsonable(value: Any) -> Any:
    """``value`` as it reads back from JSON (tuples become lists, and so on)."""
    return json.loads(json.dumps(value))


def rng_to_json(state: Tensor) -> str:
    """A torch RNG state (a uint8 tensor) as base64 text for state.json."""
    return base64.b64encode(state.numpy().tobytes()).decode("ascii")


def rng_from_json(text: str) -> Tensor:
    """The uint8 RNG state tensor that :func:`rng_to_json` wrote."""
    return torch.frombuffer(bytearray(base64.b64decode(text, validate=True)), dtype=torch.uint8)
