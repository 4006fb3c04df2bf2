"""Where a model runs: device names checked against this machine, and where its inputs go.

    DEVICES        the device kinds headlab accepts: cpu, cuda (cuda:N for one GPU), mps
    check_device   a user's device name → torch.device, or a ValueError saying what is valid here
    input_device   where a model's token ids must be for its first layer
    weights_in_place  a module's weights loaded where accelerate offloaded them, for a while

Nothing here assumes a GPU: "cpu" is always valid, the others only where torch sees them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

DEVICES = ("cpu", "cuda", "mps")


def available_devices() -> list[str]:
    """The device names valid on this machine, e.g. ``["cpu"]`` or ``["cpu", "cuda", "cuda:0"]``."""
    names = ["cpu"]
    if torch.cuda.is_available():
        names += ["cuda", *(f"cuda:{i}" for i in range(torch.cuda.device_count()))]
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        names.append("mps")
    return names


def check_device(name: str) -> torch.device:
    """``name`` ("cpu", "cuda", "cuda:1", "mps") as a torch.device, if this machine has it.

    Raises a ValueError with one sentence naming the devices that are valid here.
    """
    here = available_devices()
    kind = name.split(":", 1)[0]
    if kind not in DEVICES:
        raise ValueError(f"unknown device {name!r}; valid devices: {', '.join(DEVICES)}")
    if name not in here:
        why = "no GPU that torch can use" if kind == "cuda" else f"no {kind} device"
        raise ValueError(
            f"device {name!r} is not available here ({why}); valid here: {', '.join(here)}"
        )
    return torch.device(name)


def input_device(model: Any) -> torch.device:
    """Where ``model``'s token ids go: the device of its parameters.

    A model dispatched by accelerate (it has an ``hf_device_map``; see
    :func:`headlab.convert.dispatch`) takes its inputs on the CPU: a hook on each module moves
    them to wherever that module runs, and its parameters may sit on the meta device while
    their values are offloaded to disk.
    """
    if getattr(model, "hf_device_map", None):
        return torch.device("cpu")
    return next(model.parameters()).device


@contextlib.contextmanager
def weights_in_place(module: torch.nn.Module) -> Iterator[None]:
    """Within this context ``module``'s weights hold their values, read as its forward reads
    them. A module of a model dispatched by accelerate (:func:`input_device`) may hold meta
    tensors while its values wait on disk or in CPU memory; they are loaded here, for this
    module alone, and offloaded again on the way out, so a caller reading a model's weights
    block by block (composition scores) never holds more than one block's. Any other module
    is left as it is."""
    hooked = [m for m in module.modules() if getattr(m, "_hf_hook", None) is not None]
    if not hooked:
        yield
        return
    from accelerate.utils import align_module_device

    with contextlib.ExitStack() as stack:
        for m in hooked:
            stack.enter_context(align_module_device(m))
        yield
