"""Weights in: Hugging Face BERT, GPT-2 and Llama models as headlab Transformers.

Each converter reads a ``transformers`` model's config and state dict (no download, no
network) and copies every weight into a :class:`headlab.model.Transformer` whose arithmetic
is the same, so logits, hidden states and every head's attention weights match Hugging Face's
eager attention. What each family needs:

    GPT-2  pre-LN, learned positions, causal. ``Conv1D`` stores weights as (in, out), the
           transpose of ``nn.Linear``; ``c_attn`` packs W_Q, W_K, W_V side by side.
           Activation "gelu_new" is the tanh approximation (Radford et al. 2019).
    BERT   post-LN, learned positions, bidirectional, a LayerNorm after the embeddings. The
           token-type embedding of segment 0 is added to every position, so it is folded into
           the position table (headlab runs single-segment inputs). BertModel has no LM head:
           the logits use the tied word embeddings; compare hidden states (Devlin et al. 2019).
    Llama  pre-RMSNorm, rotary positions (half-split), grouped-query attention, SwiGLU MLP, no
           biases (Touvron et al. 2023; Ainslie et al. 2023).

:func:`from_hf` picks the converter from ``config.model_type``. Each family is written once, as
a list of (headlab name, tensor) pairs (:func:`converted_tensors`); the same pairs fill a model
in memory (:func:`from_hf`) or, read lazily from the checkpoint's files, a headlab checkpoint on
disk one layer at a time (:func:`convert_checkpoint`), which accelerate then places across GPUs,
CPU and disk for a model larger than memory (:func:`dispatch`).
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from headlab.files import json_text, new_folder
from headlab.model import ModelConfig, Transformer

SUPPORTED = ("bert", "gpt2", "llama")

_GPT2_ACT = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu"}
_GPT2_ACT |= {"relu": "relu", "silu": "silu"}


def from_hf(hf_model: Any) -> Transformer:
    """A headlab Transformer with the weights of a Hugging Face BERT, GPT-2 or Llama model.

    Accepts the bare models (``BertModel``, ``GPT2Model``, ``LlamaModel``) and their heads
    (``GPT2LMHeadModel``, ``LlamaForCausalLM``, ``BertFor…`` — whose task heads are dropped).
    Returns the converted model in eval mode, float32 unless the source is float64.
    """
    config = hf_config(hf_model.config)
    state = {k: v.detach() for k, v in hf_model.state_dict().items()}
    model = Transformer(config)
    fill(model, converted_tensors(hf_model.config, state))
    dtype = torch.float64 if next(iter(state.values())).dtype == torch.float64 else torch.float32
    return model.to(dtype).eval()


def hf_config(c: Any) -> ModelConfig:
    """The headlab config of a Hugging Face BERT, GPT-2 or Llama config."""
    configs = {"bert": bert_config, "gpt2": gpt2_config, "llama": llama_config}
    kind = getattr(c, "model_type", None)
    if kind not in configs:
        raise ValueError(
            f"cannot convert a {kind!r} model; supported Hugging Face families: "
            f"{', '.join(SUPPORTED)}"
        )
    return configs[kind](c)


def converted_tensors(c: Any, state: Mapping[str, Tensor]) -> Iterator[tuple[str, Tensor]]:
    """Every weight of the headlab model of HF config ``c`` as (headlab name, tensor), from the
    HF state ``state`` (names as in its checkpoint; a lazy mapping reads only what is asked).
    Block l's weights come together, in block order: a writer can flush layer by layer."""
    families = {"bert": _bert_tensors, "gpt2": _gpt2_tensors, "llama": _llama_tensors}
    hf_config(c)  # refuses an unsupported family or variant with its reason
    return families[c.model_type](c, state)


def fill(model: Transformer, tensors: Iterator[tuple[str, Tensor]]) -> Transformer:
    """Copy (name, tensor) pairs into ``model``'s parameters; every parameter must be given."""
    params = dict(model.named_parameters())  # a tied unembedding is listed once, as embed
    given = set()
    for name, tensor in tensors:
        target = params.get(name)
        if target is None:
            raise ValueError(f"source has a weight {name} that the headlab model has no slot for")
        if target.shape != tensor.shape:
            raise ValueError(
                f"shape mismatch at {name}: headlab {tuple(target.shape)} vs source "
                f"{tuple(tensor.shape)}"
            )
        with torch.no_grad():
            target.copy_(tensor)
        given.add(name)
    missing = sorted(set(params) - given)
    if missing:
        raise ValueError(f"the source has no weights for {', '.join(missing[:5])}")
    return model


class _Stripped(Mapping[str, Tensor]):
    """A view of a state mapping whose keys lose a wrapper prefix (``model.``, ``bert.``)."""

    def __init__(self, state: Mapping[str, Tensor], prefix: str) -> None:
        self.state, self.prefix = state, prefix

    def __getitem__(self, key: str) -> Tensor:
        return self.state[self.prefix + key]

    def __iter__(self) -> Iterator[str]:
        n = len(self.prefix)
        return (k[n:] for k in self.state if k.startswith(self.prefix))

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and self.prefix + key in self.state


def _strip(state: Mapping[str, Tensor], prefixes: tuple[str, ...]) -> Mapping[str, Tensor]:
    """Drop the wrapper prefix (``transformer.``, ``bert.``, ``model.``) if the keys carry one."""
    for prefix in prefixes:
        if any(k.startswith(prefix) for k in state):
            return _Stripped(state, prefix)
    return state


def _linear(
    ours: str, s: Mapping[str, Tensor], theirs: str, weight: Tensor | None = None
) -> Iterator[tuple[str, Tensor]]:
    """``ours.weight`` (and ``ours.bias`` if the source has one) from ``theirs.*``."""
    yield f"{ours}.weight", s[f"{theirs}.weight"] if weight is None else weight
    if f"{theirs}.bias" in s:
        yield f"{ours}.bias", s[f"{theirs}.bias"]


# --- GPT-2 -------------------------------------------------------------------------------------


def gpt2_config(c: Any) -> ModelConfig:
    """The headlab config of a ``GPT2Config``."""
    if c.activation_function not in _GPT2_ACT:
        raise ValueError(f"GPT-2 activation {c.activation_function!r} is not supported")
    if getattr(c, "scale_attn_by_inverse_layer_idx", False) or not c.scale_attn_weights:
        raise ValueError("only GPT-2's standard 1/sqrt(d_k) attention scaling is supported")
    return ModelConfig(
        vocab_size=c.vocab_size,
        d_model=c.n_embd,
        n_layers=c.n_layer,
        n_heads=c.n_head,
        d_ff=c.n_inner,
        max_len=c.n_positions,
        positional="learned",
        norm="pre",
        norm_eps=c.layer_norm_epsilon,
        causal=True,
        activation=_GPT2_ACT[c.activation_function],  # type: ignore[arg-type]
        tie_embeddings=True,
    )


def _gpt2_tensors(c: Any, state: Mapping[str, Tensor]) -> Iterator[tuple[str, Tensor]]:
    s = _strip(state, ("transformer.",))
    yield "embed.weight", s["wte.weight"]
    yield "pos_embed.weight", s["wpe.weight"]
    for l in range(c.n_layer):
        p, b = f"h.{l}.", f"blocks.{l}."
        yield from _linear(b + "norm_attn", s, p + "ln_1")
        # Conv1D keeps (in, out); c_attn's output columns are [W_Q | W_K | W_V]
        weights = s[p + "attn.c_attn.weight"].t().chunk(3, dim=0)
        biases = s[p + "attn.c_attn.bias"].chunk(3)
        for name, w, bias in zip(("W_Q", "W_K", "W_V"), weights, biases, strict=True):
            yield f"{b}attn.{name}.weight", w
            yield f"{b}attn.{name}.bias", bias
        yield from _linear(b + "attn.W_O", s, p + "attn.c_proj", s[p + "attn.c_proj.weight"].t())
        yield from _linear(b + "norm_mlp", s, p + "ln_2")
        yield from _linear(b + "mlp.W_in", s, p + "mlp.c_fc", s[p + "mlp.c_fc.weight"].t())
        yield from _linear(b + "mlp.W_out", s, p + "mlp.c_proj", s[p + "mlp.c_proj.weight"].t())
    yield from _linear("final_norm", s, "ln_f")


# --- BERT --------------------------------------------------------------------------------------


def bert_config(c: Any) -> ModelConfig:
    """The headlab config of a ``BertConfig`` (absolute positions only)."""
    position_type = getattr(c, "position_embedding_type", None) or "absolute"
    if position_type != "absolute":
        raise ValueError(
            f"BERT position_embedding_type {position_type!r}: only 'absolute' converts"
        )
    if c.hidden_act not in ("gelu", "relu", "gelu_new"):
        raise ValueError(f"BERT activation {c.hidden_act!r} is not supported")
    return ModelConfig(
        vocab_size=c.vocab_size,
        d_model=c.hidden_size,
        n_layers=c.num_hidden_layers,
        n_heads=c.num_attention_heads,
        d_ff=c.intermediate_size,
        max_len=c.max_position_embeddings,
        positional="learned",
        norm="post",
        norm_eps=c.layer_norm_eps,
        embed_norm=True,
        causal=False,
        activation={"gelu_new": "gelu_tanh"}.get(c.hidden_act, c.hidden_act),
        tie_embeddings=True,
    )


def _bert_tensors(c: Any, state: Mapping[str, Tensor]) -> Iterator[tuple[str, Tensor]]:
    s = _strip(state, ("bert.",))
    yield "embed.weight", s["embeddings.word_embeddings.weight"]
    segment0 = s["embeddings.token_type_embeddings.weight"][0]  # (d_model,)
    yield "pos_embed.weight", s["embeddings.position_embeddings.weight"] + segment0
    yield from _linear("embed_norm", s, "embeddings.LayerNorm")
    for l in range(c.num_hidden_layers):
        p, b = f"encoder.layer.{l}.", f"blocks.{l}."
        a, o = p + "attention.self.", p + "attention.output."
        for ours, theirs in (("W_Q", "query"), ("W_K", "key"), ("W_V", "value")):
            yield from _linear(f"{b}attn.{ours}", s, a + theirs)
        yield from _linear(b + "attn.W_O", s, o + "dense")
        yield from _linear(b + "norm_attn", s, o + "LayerNorm")
        yield from _linear(b + "mlp.W_in", s, p + "intermediate.dense")
        yield from _linear(b + "mlp.W_out", s, p + "output.dense")
        yield from _linear(b + "norm_mlp", s, p + "output.LayerNorm")


# --- Llama -------------------------------------------------------------------------------------


def llama_config(c: Any) -> ModelConfig:
    """The headlab config of a ``LlamaConfig`` (default RoPE, head_dim = hidden / heads)."""
    rope = getattr(c, "rope_parameters", None) or {}
    rope_type = rope.get("rope_type", "default")
    theta = rope.get("rope_theta", getattr(c, "rope_theta", 10000.0))
    if rope_type != "default":
        raise ValueError(f"Llama rope_type {rope_type!r}: only the default RoPE converts")
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    if head_dim * c.num_attention_heads != c.hidden_size:
        raise ValueError(
            f"Llama head_dim={head_dim} × {c.num_attention_heads} heads != hidden_size="
            f"{c.hidden_size}; headlab needs d_k = d_model / h"
        )
    if c.hidden_act != "silu":
        raise ValueError(f"Llama activation {c.hidden_act!r} is not supported (only silu)")
    if c.attention_bias != getattr(c, "mlp_bias", False):
        raise ValueError("Llama attention_bias and mlp_bias must agree to convert")
    return ModelConfig(
        vocab_size=c.vocab_size,
        d_model=c.hidden_size,
        n_layers=c.num_hidden_layers,
        n_heads=c.num_attention_heads,
        n_kv_heads=c.num_key_value_heads,
        d_ff=c.intermediate_size,
        max_len=c.max_position_embeddings,
        positional="rotary",
        rope_theta=float(theta),
        norm="pre",
        norm_kind="rmsnorm",
        norm_eps=c.rms_norm_eps,
        causal=True,
        activation="silu",
        mlp="gated",
        bias=c.attention_bias,
        mlp_bias=c.attention_bias,
        tie_embeddings=bool(c.tie_word_embeddings),
    )


def _llama_tensors(c: Any, state: Mapping[str, Tensor]) -> Iterator[tuple[str, Tensor]]:
    s = _strip(state, ("model.",))
    yield "embed.weight", s["embed_tokens.weight"]
    for l in range(c.num_hidden_layers):
        p, b = f"layers.{l}.", f"blocks.{l}."
        yield from _linear(b + "norm_attn", s, p + "input_layernorm")
        for ours, theirs in (("W_Q", "q"), ("W_K", "k"), ("W_V", "v"), ("W_O", "o")):
            yield from _linear(f"{b}attn.{ours}", s, f"{p}self_attn.{theirs}_proj")
        yield from _linear(b + "norm_mlp", s, p + "post_attention_layernorm")
        for ours, theirs in (("W_gate", "gate"), ("W_in", "up"), ("W_out", "down")):
            yield from _linear(f"{b}mlp.{ours}", s, f"{p}mlp.{theirs}_proj")
    yield from _linear("final_norm", s, "norm")
    if not c.tie_word_embeddings:
        head = "lm_head.weight"
        yield "unembed.weight", state[head] if head in state else s["embed_tokens.weight"]


# --- checkpoints on disk, for models larger than memory ------------------------------------------

NO_SPLIT = ["Block"]  # accelerate places a whole block on one device, never half of it
DEVICE_MAPS = ("auto", "balanced", "balanced_low_0", "sequential")


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
    """Write the model in ``source`` (a Hugging Face BERT/GPT-2/Llama directory, or headlab's
    own ``Transformer.save`` directory) to ``out`` as a headlab checkpoint accelerate can
    dispatch: ``config.json`` (headlab's), one safetensors shard per block plus one for the
    rest, and ``model.safetensors.index.json``. A tied embedding is written twice, as the
    embedding and as the unembedding (they are tied again on loading).

    Tensors are read from ``source`` lazily and written block by block, so the memory needed is
    about one block's weights, whatever the model's size; the dtype is the source's. The
    directory is written whole or not at all (:func:`headlab.files.new_folder`).
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
    if model.rotary is not None:
        remove_hook_from_module(model.rotary)
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
        raise ValueError(f"unknown device_map {device_map!r}; valid: {', '.join(DEVICE_MAPS)} "
                         "or a dict of module name → device")  # fmt: skip
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
    placement = {u: _device_of(u, found) for u in units if u != "rotary"}
    if model.rotary is not None:
        placement["rotary"] = next((d for d in placement.values() if d != "disk"), "cpu")
    return placement


def _device_of(unit: str, placement: dict[str, Any]) -> Any:
    """The device of ``unit`` in a placement whose keys may be its parents ("" = everything)."""
    for key in sorted(placement, key=len, reverse=True):
        if key == "" or unit == key or unit.startswith(key + "."):
            return placement[key]
    raise ValueError(f"the device map places no device for {unit}")
