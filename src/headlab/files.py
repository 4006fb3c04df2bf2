"""The ground floor: every file headlab writes goes through here, and every torch thread count.

    write_atomic      bytes or text to a file: a temporary file beside it, fsync, rename, fsync
                      the folder; the target is absent, its old self, or complete, never torn
    write_json        finite JSON (NaN and infinity as null) through :func:`write_atomic`
    write_folder      a folder of files, written whole beside the target and renamed into place
    finite            a value with every NaN or infinite float replaced by None
    check_writable    the reason ``path`` cannot be written (not a regular file …), or None
    torch_threads     run torch on n CPU threads, then restore the count; ``one_thread``

A writer refuses a target that exists and is not a regular file (a device, a FIFO, a socket, a
folder): renaming onto it would replace ``/dev/null`` with a file when run as root.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import stat
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any


class NotAFileError(ValueError):
    """The target of a write exists and is not a regular file."""


def check_writable(path: str | Path) -> str | None:
    """Why ``path`` cannot be written as a file, in a sentence for the user; None if it can.

    A missing file in an existing folder can; an existing regular file can (it is replaced);
    anything else that exists (device, FIFO, socket, folder) cannot, and neither can a path
    whose folder does not exist.
    """
    p = Path(path)
    try:
        mode = os.lstat(p).st_mode
    except FileNotFoundError:
        if not p.parent.is_dir():
            return f"{p}: the folder {p.parent} does not exist; create it first"
        return None
    except OSError as e:
        return f"{p}: cannot be written ({e.strerror or e})"
    if stat.S_ISREG(mode):
        return None
    kind = (
        "a folder"
        if stat.S_ISDIR(mode)
        else "a link"
        if stat.S_ISLNK(mode)
        else ("a device, FIFO or socket")
    )
    return f"{p} is {kind}, not a regular file; give the path of a file to write"


def _sync_folder(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: str | Path, data: bytes | str) -> Path:
    """Write ``data`` (text is UTF-8) to ``path`` through a temporary file beside it: fsync,
    rename over the target, fsync the folder. Raises :class:`NotAFileError` for a target that
    exists and is not a regular file, before anything is written."""
    p = Path(path)
    problem = check_writable(p)
    if problem is not None:
        raise NotAFileError(problem)
    blob = data.encode("utf-8") if isinstance(data, str) else data
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=p.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(blob)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, p)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _sync_folder(p.parent)
    return p


def finite(value: Any) -> Any:
    """``value`` with every NaN or infinite float replaced by None (JSON has neither)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite(v) for v in value]
    return value


def json_text(data: Any, indent: int | None = 1) -> str:
    """``data`` as JSON text ending in a newline, NaN and infinity written as null."""
    return json.dumps(finite(data), indent=indent, allow_nan=False) + "\n"


def write_json(path: str | Path, data: Any, indent: int | None = 1) -> Path:
    """Write ``data`` as finite JSON (:func:`json_text`) through :func:`write_atomic`; the
    folder is created when missing."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    return write_atomic(path, json_text(data, indent))


def write_folder(path: str | Path, files: Mapping[str, bytes | str]) -> Path:
    """Write ``files`` (name → content) as the folder ``path``, whole or not at all: each file
    is written and synced in a temporary folder beside it, which then replaces ``path`` (an
    old folder is moved aside first and removed after)."""
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise NotAFileError(f"{p} exists and is not a folder; give the path of a folder")
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{p.name}.", suffix=".tmp", dir=p.parent))
    try:
        for name, data in files.items():
            blob = data.encode("utf-8") if isinstance(data, str) else data
            with open(tmp / name, "wb") as f:
                f.write(blob)
                f.flush()
                os.fsync(f.fileno())
        _sync_folder(tmp)
        old = p.with_name(f".{p.name}.old-{os.getpid()}")
        if p.exists():
            p.rename(old)
        tmp.rename(p)
        _sync_folder(p.parent)
        shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return p


@contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """Run torch on ``n`` CPU threads, then restore the previous count."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@contextmanager
def one_thread() -> Iterator[None]:
    """Run torch on one CPU thread, then restore the previous count.

    On a shared machine whose load exceeds its cores, two-thread kernels measured here ran many
    times slower than one-thread ones (threads wait on each other); one thread keeps timings
    comparable between variants and runs.
    """
    with torch_threads(1):
        yield
