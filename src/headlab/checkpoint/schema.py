"""What a checkpoint's ``state.json`` may hold, and what a checkpoint's content must agree with.

Two passes, both run by :func:`headlab.checkpoint.read_checkpoint` before anything is loaded:

    state_problem    the schema: every field present, of its type, in its range, no unknown
                     field; run before the SHA-256 check, so a mangled file is named by its field
    content_problem  the meaning, once the tensors are parsed: the step agrees with the run's
                     length and with the optimizer's own step counters, the running loss with the
                     step; every parameter's Adam state is complete; weights and moments are
                     finite, second moments >= 0

Each returns one sentence naming the field (for ``CheckpointError``), or None. What a checkpoint
must agree with outside itself (the run's settings, the model) is
:func:`headlab.checkpoint.check_compatible`.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from typing import Any

from torch import Tensor

TENSOR_FILES = ("model.safetensors", "optimizer.safetensors")


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _at_least_0(value: Any) -> bool:
    return _number(value) and value >= 0


def _hex64(value: Any) -> bool:
    return isinstance(value, str) and re.fullmatch(r"[0-9a-f]{64}", value) is not None


def _file_entry(value: Any) -> bool:
    return isinstance(value, dict) and _whole(value.get("bytes")) and _hex64(value.get("sha256"))


def _exactly(value: Any, keys: set[str]) -> bool:
    return isinstance(value, dict) and set(value) == keys


def short(value: Any) -> str:
    """``value`` as JSON, cut to 60 characters (for a message)."""
    text = json.dumps(value)
    return text if len(text) <= 60 else text[:57] + "..."


Check = tuple[Callable[[Any], bool], str]  # a test and what a valid value is, for the message

# state.json's schema: field -> (test, what a valid value is)
STATE_SCHEMA: dict[str, Check] = {
    "format": (_whole, "a whole number"),
    "sha256": (_hex64, "64 hexadecimal digits"),
    "step": (_whole, "a whole number >= 0"),
    "elapsed": (_at_least_0, "a number of seconds >= 0"),
    "loss_sum": (_number, "a finite number"),
    "loss_count": (_whole, "a whole number >= 0"),
    "config": (lambda v: isinstance(v, dict), "an object of training settings"),
    "model_config": (lambda v: v is None or isinstance(v, dict), "an object or null"),
    "rng": (
        lambda v: _exactly(v, {"data", "torch"}) and all(isinstance(s, str) for s in v.values()),
        'an object with just "data" and "torch" RNG states (base64 text)',
    ),
    "files": (
        lambda v: _exactly(v, set(TENSOR_FILES)) and all(map(_file_entry, v.values())),
        f'an object with just {" and ".join(TENSOR_FILES)}, each {{"bytes", "sha256"}}',
    ),
    "optimizer": (
        lambda v: (
            _exactly(v, {"param_groups", "scalars"})
            and isinstance(v["param_groups"], list)
            and isinstance(v["scalars"], dict)
        ),
        'an object with "param_groups" (a list) and "scalars" (an object)',
    ),
}

_FLAG: Check = (lambda v: isinstance(v, bool), "true or false")
_MAYBE_FLAG: Check = (lambda v: v is None or isinstance(v, bool), "true, false or null")

# the fields of an optimizer's param group (torch's Adam and AdamW) -> (test, what is valid);
# a field torch adds later passes here and is compared with this torch's optimizer on resume
GROUP_SCHEMA: dict[str, Check] = {
    "params": (
        lambda v: isinstance(v, list) and all(map(_whole, v)) and len(set(v)) == len(v),
        "a list of distinct parameter indices",
    ),
    "lr": (_at_least_0, "a finite number >= 0"),
    "betas": (
        lambda v: isinstance(v, list) and len(v) == 2 and all(_number(b) and 0 <= b < 1 for b in v),
        "two numbers in [0, 1)",
    ),
    "eps": (_at_least_0, "a finite number >= 0"),
    "weight_decay": (_at_least_0, "a finite number >= 0"),
    "amsgrad": _FLAG,
    "maximize": _FLAG,
    "capturable": _FLAG,
    "differentiable": _FLAG,
    "decoupled_weight_decay": _FLAG,
    "foreach": _MAYBE_FLAG,
    "fused": _MAYBE_FLAG,
}


def state_problem(state: dict[str, Any]) -> str | None:
    """What is wrong with a parsed state.json against :data:`STATE_SCHEMA` and
    :data:`GROUP_SCHEMA`, in a phrase after "state.json", or None."""
    for name, (valid, what) in STATE_SCHEMA.items():
        if name not in state:
            return f"lacks the field {name!r} ({what})"
        if not valid(state[name]):
            return f"field {name!r} should be {what}, got {short(state[name])}"
    unknown = sorted(set(state) - set(STATE_SCHEMA))
    if unknown:
        return f"has an unknown field {unknown[0]!r} (its fields are {', '.join(STATE_SCHEMA)})"
    return _optimizer_problem(state["optimizer"])


def _optimizer_problem(meta: dict[str, Any]) -> str | None:
    """The optimizer's param groups and scalar slots against their schema."""
    held: list[int] = []
    for i, group in enumerate(meta["param_groups"]):
        if not isinstance(group, dict) or "params" not in group:
            return f"optimizer param group {i} should be an object with 'params'"
        for name, value in group.items():
            valid, what = GROUP_SCHEMA.get(name, (lambda v: True, ""))
            if not valid(value):
                return (
                    f"optimizer param group {i} field {name!r} should be {what}, got {short(value)}"
                )
        held += group["params"]
    if len(set(held)) != len(held):
        return "optimizer param groups hold a parameter twice"
    for idx, slots in meta["scalars"].items():
        known = idx.isascii() and idx.isdigit() and int(idx) in held
        if not known or not isinstance(slots, dict):
            return f"optimizer scalars name {idx!r}, which is not a parameter of a param group"
        for slot, value in slots.items():
            if not _number(value):
                return (
                    f"optimizer scalar '{idx}.{slot}' should be a finite number, got {short(value)}"
                )
    return None


# the per-parameter state torch's Adam and AdamW keep (plus max_exp_avg_sq with amsgrad)
ADAM_SLOTS = ("step", "exp_avg", "exp_avg_sq")
_SQUARES = ("exp_avg_sq", "max_exp_avg_sq")  # running means of squares: never below 0


def content_problem(
    state: dict[str, Any], model: dict[str, Tensor], optimizer: dict[str, Tensor]
) -> str | None:
    """What is wrong with a checkpoint's content (state.json that passed :func:`state_problem`,
    the model's tensors, the optimizer's flat tensors ``"PARAM.SLOT"``), or None."""
    step, steps = state["step"], state["config"].get("steps")
    if _whole(steps) and step > steps:
        return f"step {step} is beyond the run's {steps} steps (its config's 'steps')"
    if state["loss_count"] > step:
        return (
            f"field 'loss_count' is {state['loss_count']}, more than the checkpoint's step {step}"
        )
    if state["loss_count"] == 0 and state["loss_sum"] != 0:
        return (
            f"field 'loss_sum' is {state['loss_sum']} while 'loss_count' is 0 (a sum of none is 0)"
        )
    for name, tensor in model.items():
        if tensor.is_floating_point() and not bool(tensor.isfinite().all()):
            return f"model tensor {name!r} holds a value that is not finite (NaN or infinity)"
    slots = _slots(state["optimizer"], optimizer)
    if isinstance(slots, str):
        return slots
    groups = {p: g for g in state["optimizer"]["param_groups"] for p in g["params"]}
    for idx, held in sorted(slots.items()):
        problem = _param_state_problem(idx, held, groups[idx], step)
        if problem is not None:
            return problem
    return None


def _slots(meta: dict[str, Any], tensors: dict[str, Tensor]) -> dict[int, dict[str, Any]] | str:
    """The optimizer's state per parameter index (tensors and scalars), or what is wrong."""
    held = {p for g in meta["param_groups"] for p in g["params"]}
    slots: dict[int, dict[str, Any]] = {}
    for name, tensor in tensors.items():
        idx, _, slot = name.partition(".")
        if not (idx.isascii() and idx.isdigit() and slot) or int(idx) not in held:
            return f"optimizer tensor {name!r} is not named PARAMETER.SLOT of a held parameter"
        slots.setdefault(int(idx), {})[slot] = tensor
    for idx, scalars in meta["scalars"].items():
        for slot, value in scalars.items():
            if slot in slots.get(int(idx), {}):
                return (
                    f"optimizer scalar '{idx}.{slot}' duplicates the tensor of that name in "
                    "optimizer.safetensors"
                )
            slots.setdefault(int(idx), {})[slot] = value
    return slots


def _param_state_problem(
    idx: int, held: dict[str, Any], group: dict[str, Any], step: int
) -> str | None:
    """One parameter's optimizer state: complete (for Adam), counters at ``step``, tensors
    floating point and finite, second moments >= 0."""
    if "betas" in group:  # Adam or AdamW
        need = {*ADAM_SLOTS, *(("max_exp_avg_sq",) if group.get("amsgrad") else ())}
        keeps = f"(Adam keeps {', '.join(sorted(need))})"
        missing, extra = sorted(need - set(held)), sorted(set(held) - need)
        if missing:
            return f"parameter {idx} lacks the optimizer state {missing[0]!r} {keeps}"
        if extra:
            return f"parameter {idx} has an unknown optimizer state {extra[0]!r} {keeps}"
    for slot, value in sorted(held.items()):
        name = f"optimizer state '{idx}.{slot}'"
        if isinstance(value, Tensor) and not value.is_floating_point():
            return f"{name} is {str(value.dtype).removeprefix('torch.')}, not floating point"
        if slot == "step":
            if isinstance(value, Tensor) and value.dim() != 0:
                return f"{name} should be one number, got shape {list(value.shape)}"
            if float(value) != step:
                return f"{name} is {float(value)}, not the checkpoint's step {step}"
        elif isinstance(value, Tensor) and not bool(value.isfinite().all()):
            return f"{name} holds a value that is not finite (NaN or infinity)"
        elif slot in _SQUARES and isinstance(value, Tensor) and bool((value < 0).any()):
            return f"{name} holds a negative value; Adam's second moments are >= 0"
    return None
