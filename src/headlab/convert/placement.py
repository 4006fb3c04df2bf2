"""A converted checkpoint loaded across GPUs, the CPU and disk, its blocks placed by accelerate
(:func:`dispatch`)."""

from __future__ import annotations

import contextlib
import io
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from headlab.convert.shards import checkpoint_config
from headlab.model import Transformer

NO_SPLIT = ["Block"]  # accelerate places a whole block on one device, never half of it
DEVICE_MAPS = ("auto", "balanced", "balanced_low_0", "sequential")


def dispatch(
    checkpoint: str | Path,
    device_map: str | dict[str, Any] = "auto",
    max_memory: dict[int | str, int | str] | None = None,
    offload_folder: str | Path | None = None,
    dtype: torch.dtype | None = None,
) -> Transformer:
    """A Transformer too large for one device, its blocks placed by accelerate on GPUs, the
    CPU and disk, loaded from a headlab checkpoint written by :func:`convert_checkpoint`.

    The model is first built on the meta device (``init_empty_weights``: no memory), the
    placement computed per block (``device_map`` "auto", "balanced", "balanced_low_0",
    "sequential" or an explicit {module name: device}, within ``max_memory`` per device, e.g.
    ``{0: "20GiB", "cpu": "60GiB"}``), then each block's weights loaded to its device; blocks
    that do not fit go to ``offload_folder`` and are read back, one at a time, onto the first
    device when they run. Hooks move each block's inputs to its device, so a Trace, head masks
    and streaming analysis work wherever a layer lives. float32 unless ``dtype`` is given.
    Raises a ValueError with one sentence when ``max_memory`` cannot hold even one block, or
    blocks must go to disk and no ``offload_folder`` was given.
    """
    from accelerate import init_empty_weights, load_checkpoint_and_dispatch
    from accelerate.hooks import remove_hook_from_module

    directory = Path(checkpoint)
    config = checkpoint_config(directory)
    with init_empty_weights():
        model = Transformer(config).to(dtype or torch.float32)
    placement = device_placement(model, device_map, max_memory)
    if "disk" in placement.values() and offload_folder is None:
        raise ValueError(
            "the weights do not fit in max_memory, so some layers must be offloaded to disk: "
            "give an offload folder (offload_folder=, --offload-folder)"
        )
    with _quiet_accelerate():
        model = load_checkpoint_and_dispatch(
            model,
            str(directory / "model.safetensors.index.json"),
            device_map=placement,
            offload_folder=None if offload_folder is None else str(offload_folder),
            dtype=dtype or torch.float32,
        )
    # RoPE is applied inside each block, on the block's own device (Rotary follows its input)
    for rotary in (model.rotary, model.rotary_local):
        if rotary is not None:
            remove_hook_from_module(rotary)
    return model.eval()


@contextlib.contextmanager
def _quiet_accelerate() -> Iterator[None]:
    """Without accelerate's per-weight progress bars and its "offloaded" warning: a library
    reports nothing itself (the CLI shows its own progress)."""
    logger = logging.getLogger("accelerate")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            yield
    finally:
        logger.setLevel(level)


def device_placement(
    model: Transformer,
    device_map: str | dict[str, Any],
    max_memory: dict[int | str, int | str] | None,
) -> dict[str, Any]:
    """accelerate's placement of ``model``'s modules (whole blocks) within ``max_memory``.

    Checks first that the largest block (or embedding) fits on some device other than disk:
    a disk-offloaded block still runs in memory, one at a time.
    """
    from accelerate.utils import (
        compute_module_sizes,
        convert_file_size_to_int,
        get_balanced_memory,
        infer_auto_device_map,
    )

    if isinstance(device_map, dict):
        return device_map
    if device_map not in DEVICE_MAPS:
        raise ValueError(
            f"unknown device_map {device_map!r}; valid: {', '.join(DEVICE_MAPS)} "
            "or a dict of module name → device"
        )
    sizes = compute_module_sizes(model)
    units = [n for n in sizes if n.count(".") == 1 and n.startswith("blocks.")]
    units += [n for n, _ in model.named_children() if n != "blocks"]
    largest = max(units, key=lambda n: sizes[n])
    if max_memory is not None:
        try:
            room = {k: convert_file_size_to_int(v) for k, v in max_memory.items() if k != "disk"}
        except ValueError as exc:
            raise ValueError(f"max_memory: {exc}; give sizes such as 2GiB or 500MB") from None
        if max(room.values(), default=0) < sizes[largest]:
            raise ValueError(
                f"max_memory {max_memory} is too small for even one layer: {largest} alone "
                f"needs {sizes[largest]:,} bytes on cpu or a GPU while it runs, with everything "
                "else offloaded to disk; give at least that much"
            )
    if device_map != "sequential" and torch.cuda.is_available():
        low_zero = device_map == "balanced_low_0"
        max_memory = get_balanced_memory(model, max_memory, NO_SPLIT, low_zero=low_zero)
    found = infer_auto_device_map(model, max_memory=max_memory, no_split_module_classes=NO_SPLIT)
    # one entry per unit (accelerate may answer {"": "disk"}); the rotary tables, which have
    # no weights, stay on the device that runs offloaded blocks (the CPU without a GPU)
    tables = ("rotary", "rotary_local")
    placement = {u: _device_of(u, found) for u in units if u not in tables}
    for name in tables:
        if getattr(model, name) is not None:
            placement[name] = next((d for d in placement.values() if d != "disk"), "cpu")
    return placement


def _device_of(unit: str, placement: dict[str, Any]) -> Any:
    """The device of ``unit`` in a placement whose keys may be its parents ("" = everything)."""
    for key in sorted(placement, key=len, reverse=True):
        if key == "" or unit == key or unit.startswith(key + "."):
            return placement[key]
    raise ValueError(f"the device map places no device for {unit}")
