"""A checkpoint on disk, for models larger than memory: tensors read lazily from safetensors
files, and a headlab checkpoint written one block per shard (:func:`convert_checkpoint`).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from torch import Tensor

from headlab.convert.families import hf_config
from headlab.convert.weights import converted_tensors
from headlab.files import json_text, new_folder, write_manifest
from headlab.model import ModelConfig


class CheckpointState(Mapping[str, Tensor]):
    """The tensors of a checkpoint directory, each read from its file when asked for.

    Reads ``model.safetensors`` or shards listed in ``model.safetensors.index.json`` (never a
    pickle): no more than the tensors in use are in memory.
    """

    def __init__(self, directory: str | Path) -> None:
        from safetensors import safe_open

        d = Path(directory)
        self._files: dict[str, Path] = {}
        if (d / "model.safetensors.index.json").is_file():
            weight_map = json.loads((d / "model.safetensors.index.json").read_text())["weight_map"]
            self._files = {k: d / f for k, f in weight_map.items()}
        elif (d / "model.safetensors").is_file():
            with safe_open(str(d / "model.safetensors"), "pt") as f:
                self._files = dict.fromkeys(f.keys(), d / "model.safetensors")
        else:  # never a pickle (*.bin): unpickling a weights file can run code
            raise ValueError(
                f"no safetensors weights in {d}: expected model.safetensors or "
                "model.safetensors.index.json (headlab loads no pickle files)"
            )
        self._open: dict[Path, Any] = {}

    def __getitem__(self, key: str) -> Tensor:
        from safetensors import safe_open

        path = self._files[key]
        if path not in self._open:
            self._open[path] = safe_open(str(path), "pt")
        return self._open[path].get_tensor(key)

    def __iter__(self) -> Iterator[str]:
        return iter(self._files)

    def __len__(self) -> int:
        return len(self._files)

    def __contains__(self, key: object) -> bool:
        return key in self._files


def _native_tensors(
    config: ModelConfig, state: Mapping[str, Tensor]
) -> Iterator[tuple[str, Tensor]]:
    """A headlab checkpoint's own tensors (a tied embedding may be saved under either name)."""
    for name in sorted(state, key=_shard_key):
        if config.tie_embeddings and name == "unembed.weight":
            if "embed.weight" not in state:
                yield "embed.weight", state[name]
            continue
        yield name, state[name]


def _untied(
    config: ModelConfig, tensors: Iterator[tuple[str, Tensor]]
) -> Iterator[tuple[str, Tensor]]:
    """``tensors`` with a tied embedding also written as the unembedding: accelerate reads each
    disk-offloaded module's weights under that module's own names."""
    for name, tensor in tensors:
        yield name, tensor
        if config.tie_embeddings and name == "embed.weight":
            yield "unembed.weight", tensor.clone()  # its own bytes in the file


def _shard_key(name: str) -> tuple[int, str]:
    """Block l's tensors sort and shard together; the rest come first (−1)."""
    parts = name.split(".")
    return (int(parts[1]) if parts[0] == "blocks" else -1), name


def _is_hf(directory: Path) -> bool:
    return "model_type" in json.loads((directory / "config.json").read_text())


def checkpoint_config(directory: str | Path) -> ModelConfig:
    """The headlab config of a checkpoint directory: a Hugging Face one or headlab's own."""
    d = Path(directory)
    if not (d / "config.json").is_file():
        raise ValueError(f"no config.json in {d}: not a model directory")
    if not _is_hf(d):
        return ModelConfig.from_dict(json.loads((d / "config.json").read_text()))
    import transformers

    return hf_config(transformers.AutoConfig.from_pretrained(str(d), local_files_only=True))


def convert_checkpoint(source: str | Path, out: str | Path) -> Path:
    """Write the model in ``source`` (a Hugging Face directory of a supported family, or headlab's
    own ``Transformer.save`` directory) to ``out`` as a headlab checkpoint accelerate can
    dispatch: ``config.json`` (headlab's), one safetensors shard per block plus one for the
    rest, and ``model.safetensors.index.json``. A tied embedding is written twice, as the
    embedding and as the unembedding (they are tied again on loading).

    Tensors are read from ``source`` lazily and written block by block, so the memory needed is
    about one block's weights, whatever the model's size; the dtype is the source's. The
    directory is written whole or not at all (:func:`headlab.files.new_folder`), its manifest
    (each file's size and SHA-256, :func:`headlab.files.write_manifest`) last.
    """
    src, dst = Path(source), Path(out)
    config = checkpoint_config(src)
    state = CheckpointState(src)
    if _is_hf(src):
        import transformers

        hf = transformers.AutoConfig.from_pretrained(str(src), local_files_only=True)
        tensors = converted_tensors(hf, state)
    else:
        tensors = _native_tensors(config, state)
    with new_folder(dst) as tmp:
        weight_map = _write_shards(_untied(config, tensors), tmp)
        index = {"metadata": {"format": "pt"}, "weight_map": weight_map}
        (tmp / "model.safetensors.index.json").write_text(json_text(index))
        (tmp / "config.json").write_text(json_text(config.to_dict(), indent=2))
        write_manifest(tmp, None, {"converted_from": src.name})
    return dst


def _write_shards(tensors: Iterator[tuple[str, Tensor]], directory: Path) -> dict[str, str]:
    """Save (name, tensor) pairs as one safetensors file per run of the same block; returns
    the weight map (name → file name)."""
    from safetensors.torch import save_file

    weight_map: dict[str, str] = {}
    shard: dict[str, Tensor] = {}
    group: int | None = None

    def flush() -> None:
        file = f"model-{len(set(weight_map.values())) + 1:05d}.safetensors"
        save_file(shard, str(directory / file), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(shard, file))
        shard.clear()

    for name, tensor in tensors:
        if shard and _shard_key(name)[0] != group:
            flush()
        group = _shard_key(name)[0]
        shard[name] = tensor.contiguous()
    if shard:
        flush()
    return weight_map
