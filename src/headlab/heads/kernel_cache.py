"""Where Numba keeps the compiled loops of :mod:`headlab.heads.kernels`: a folder of headlab's
(``$HEADLAB_CACHE/kernels``, else ``~/.cache/headlab/kernels``), checked before Numba reads it.

Numba loads its cached machine code as it finds it: ``.nbc`` files rotated among the loops
crashed every later run (exit 139), flipped bytes raised LLVM's bitcode errors on every run. So
the SHA-256 of every ``.nbi``/``.nbc`` file is recorded (:func:`headlab.files.write_manifest`)
after this process compiled and saved one, and checked before the loops are decorated (Numba
reads the cache then): a file that is not the one recorded, or one the record does not know,
has every compiled file deleted, and Numba compiles them again (seconds), never loading a
damaged one. Where the folder cannot be written the loops are compiled in memory every run and
cached nowhere.

    cached(decorator)  a Numba decorator (``njit(...)``, ``cfunc(...)``) that caches in the folder
    record()           the folder's record written again when this process compiled something
"""

from __future__ import annotations

import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numba

from headlab.files import folder_files, manifest_problem, write_manifest
from headlab.pypi import cache_root


def produced_by() -> dict[str, str]:
    """What made the compiled files: Numba's and Python's versions (the record names them)."""
    return {"numba": numba.__version__, "python": sys.version.split()[0]}


def compiled_files(folder: Path) -> list[str]:
    """Numba's index and code files under ``folder`` (relative paths)."""
    return [name for name in folder_files(folder) if name.endswith((".nbi", ".nbc"))]


def checked_folder() -> Path | None:
    """The kernels' cache folder with no compiled file other than those recorded (any other,
    or any that differs, and all are deleted); None when it cannot be made or written."""
    folder = cache_root() / "kernels"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        compiled = compiled_files(folder)
        if compiled and manifest_problem(folder, compiled, produced_by()) is not None:
            for name in compiled:  # the files only: another process may be writing beside them
                (folder / name).unlink(missing_ok=True)
        tempfile.TemporaryFile(dir=folder).close()  # as Numba tries it, else it caches elsewhere
    except OSError:
        return None
    return folder


FOLDER = checked_folder()
CACHING = FOLDER is not None  # the ``cache=`` of every kernel's decorator
_MADE: list[Any] = []  # every dispatcher and cfunc decorated through :func:`cached`
_RECORDED = [0]  # how many compiles (cache misses) had been saved at the last record
_CONFIG: Any = numba.config  # its settings are set at run time, unseen by type checkers


def cached(decorator: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """``decorator`` applied with Numba's cache folder set to :data:`FOLDER` (Numba places a
    function's cache when it is decorated, and compiles a cfunc then)."""

    def apply(function: Any) -> Any:
        before = _CONFIG.CACHE_DIR
        _CONFIG.CACHE_DIR = str(FOLDER) if FOLDER is not None else before
        try:
            made = decorator(function)
        finally:
            _CONFIG.CACHE_DIR = before
        _MADE.append(made)
        return made

    return apply


def _compiles() -> int:
    """How many compiles of the decorated functions this process saved (cache misses)."""
    total = 0
    for made in _MADE:
        stats = getattr(made, "stats", None)
        total += sum(stats.cache_misses.values()) if stats is not None else made.cache_hits == 0
    return total


def record() -> None:
    """After the kernels ran or were decorated: when this process compiled (and so saved) code
    since the last record, record every compiled file of the folder again."""
    count = _compiles()
    if FOLDER is None or count == _RECORDED[0]:
        return
    _RECORDED[0] = count
    try:
        compiled = compiled_files(FOLDER)
        if manifest_problem(FOLDER, compiled, produced_by()) is not None:
            write_manifest(FOLDER, compiled, produced_by())
    except (OSError, ValueError):
        pass  # not recorded: the next run finds files it cannot vouch for and compiles again
