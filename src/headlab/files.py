"""The ground floor: every file headlab writes goes through here, and every torch thread count.

    write_atomic      one file: written beside the target, fsynced, renamed over it, the folder
                      fsynced; the target is absent, its old self, or complete, never torn
    write_json        finite JSON (NaN and infinity as null) through :func:`write_atomic`
    new_folder        a folder filled in a temporary folder beside it and renamed into place whole
    write_folder      :func:`new_folder` for files held in memory (name → content)
    remove_leftovers  what writes killed part-way left beside their targets (all, or one's)
    finite            a value with every NaN or infinite float replaced by None
    check_writable    the reason ``path`` cannot be written (not a regular file …), or None;
                      with ``try_it`` a file is made beside it and removed, as a write would
    open_regular      a regular file opened for reading; devices, FIFOs, sockets and folders
                      are refused before they are opened (non-blocking, looked at again)
    read_text         a regular file's UTF-8 text, read with a bound that the refusal names
    file_kind         "a FIFO", "a socket", "a device" …: what a file is, in words
    write_manifest    a cache folder's record of its files (size, SHA-256) and of what made them
    manifest_problem  why a cache folder's files are not those recorded, in words, or None
    file_digest       a file's SHA-256, hashed once a process while it is unchanged
    torch_threads     run torch on n CPU threads, then restore the count; ``one_thread``

Content is bytes, text (UTF-8), or a function that writes the file at the path it is given (a
library's own writer: safetensors, matplotlib, tokenizers). A writer refuses a target that exists
and is not a regular file (a device, a FIFO, a socket, a folder): renaming onto it would replace
``/dev/null`` with a file when run as root; the target is looked at again just before the
rename, so one swapped in during the write is not replaced either. Temporary names are
``.NAME.PID-RANDOM.tmp`` and a replaced folder is parked as ``.NAME.PID-RANDOM.old`` until the
new one is in place.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import re
import secrets
import shutil
import stat
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO

# bytes, text (written as UTF-8), or a function that writes the file at the path it is given
Content = bytes | str | Callable[[Path], object]


class NotAFileError(ValueError):
    """The target of a write exists and is not a regular file (or, for a folder, not a folder)."""


def check_writable(path: str | Path, try_it: bool = False) -> str | None:
    """Why ``path`` cannot be written as a file, in a sentence for the user; None if it can.

    A missing file in an existing folder can; an existing regular file can (it is replaced);
    anything else that exists (device, FIFO, socket, folder) cannot, and neither can a path
    whose folder does not exist or a name longer than the file system allows. With ``try_it``
    a temporary file is made beside ``path`` and removed again, as :func:`write_atomic` would:
    folders that take no new file (``/proc``, ``/sys``, read-only mounts) answer truthfully,
    so a command can check its output before any work.
    """
    p = Path(path)
    try:
        mode = os.lstat(p).st_mode
    except FileNotFoundError:
        if not p.parent.is_dir():
            return f"{p}: the folder {p.parent} does not exist; create it first"
        return _try_writing(p) if try_it else None
    except OSError as e:
        return _too_long(p) or f"{p}: cannot be written ({e.strerror or e})"
    if stat.S_ISREG(mode):
        return _try_writing(p) if try_it else None
    kind = "a folder" if stat.S_ISDIR(mode) else "a link" if stat.S_ISLNK(mode) else None
    kind = kind or "a device, FIFO or socket"
    return f"{p} is {kind}, not a regular file; give the path of a file to write"


def file_kind(mode: int) -> str:
    """What a file of ``st_mode`` ``mode`` is, in words ("a regular file", "a FIFO", …)."""
    kinds = (
        (stat.S_ISREG, "a regular file"),
        (stat.S_ISDIR, "a folder"),
        (stat.S_ISLNK, "a link"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
    )
    for test, kind in kinds:
        if test(mode):
            return kind
    return "a device"


def _name_max(folder: Path) -> int:
    """The longest file name the file system of ``folder`` allows (255 on most)."""
    try:
        return os.pathconf(folder, "PC_NAME_MAX")
    except (OSError, ValueError):
        return 255


def _too_long(p: Path) -> str | None:
    """A sentence when ``p``'s name is longer than its file system allows, else None."""
    size, most = len(os.fsencode(p.name)), _name_max(p.parent)
    if size <= most:
        return None
    return f"{p.name[:24]}...: the file name is {size} bytes long; this file system allows {most}"


def _try_writing(p: Path) -> str | None:
    """Make and remove a temporary file beside ``p``: why that fails, in a sentence, or None."""
    tmp = _beside(p, "tmp")
    try:
        os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except OSError as e:
        return (
            f"{p}: cannot write in {p.parent} ({e.strerror or e}); choose a folder you can write to"
        )
    tmp.unlink(missing_ok=True)
    return None


def _beside(p: Path, kind: str) -> Path:
    """A fresh hidden name beside ``p``: ``.NAME.PID-RANDOM.KIND`` (:func:`remove_leftovers`),
    NAME cut to 200 bytes so that the longest name a file system allows can still be written."""
    return p.with_name(f".{_short(p.name)}.{os.getpid()}-{secrets.token_hex(4)}.{kind}")


def _short(name: str) -> str:
    """``name`` cut to at most 200 bytes (UTF-8), as :func:`_beside` puts it in a temporary name."""
    while len(os.fsencode(name)) > 200:
        name = name[:-1]
    return name


def _write_file(path: Path, data: Content) -> None:
    """Create ``path`` with ``data`` (not synced: see :func:`_sync`). Files get the usual mode
    (0666 less the umask), as ``open`` gives them."""
    if callable(data):
        data(path)
        return
    blob = data.encode("utf-8") if isinstance(data, str) else data
    with open(path, "xb") as f:
        f.write(blob)


def _sync(path: Path) -> None:
    """fsync a file or a folder: its content (or its list of names) reaches the disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: str | os.PathLike[str], data: Content) -> Path:
    """Write ``data`` to ``path`` through a temporary file beside it: fsync, rename over the
    target, fsync the folder. Raises :class:`NotAFileError` for a target that exists and is not
    a regular file, or whose folder is missing, before anything is written."""
    p = Path(path)
    problem = check_writable(p)
    if problem is not None:
        raise NotAFileError(problem)
    tmp = _beside(p, "tmp")
    try:
        _write_file(tmp, data)
        _sync(tmp)
        problem = check_writable(p)  # a device or FIFO put there meanwhile is not replaced
        if problem is not None:
            raise NotAFileError(problem)
        os.replace(tmp, p)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _sync(p.parent)
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


@contextmanager
def new_folder(path: str | Path) -> Iterator[Path]:
    """A temporary folder beside ``path`` to fill; when the block ends normally every file in it
    is fsynced and it replaces ``path`` whole (an old folder is parked beside it, then removed).
    When the block raises, or the process dies, ``path`` is as it was: the temporary folder is
    removed (or, after a kill, left for :func:`remove_leftovers`).

    Should another writer put a complete ``path`` in place first, theirs is kept and ours
    dropped: either is whole. Raises :class:`NotAFileError` if ``path`` exists and is not a
    folder."""
    p = Path(path)
    if p.is_symlink() or (p.exists() and not p.is_dir()):
        raise NotAFileError(f"{p} exists and is not a folder; give the path of a folder")
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = _beside(p, "tmp")
    tmp.mkdir()
    try:
        yield tmp
        for name in sorted(tmp.rglob("*")):
            if name.is_file() and not name.is_symlink():
                _sync(name)
        _sync(tmp)
        _swap_in(tmp, p)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # gone already when it was swapped in


def _swap_in(tmp: Path, p: Path) -> None:
    """Rename the complete folder ``tmp`` to ``p``, parking an old ``p`` aside until it is."""
    old = _beside(p, "old")
    with contextlib.suppress(FileNotFoundError):  # else nothing to replace
        p.rename(old)
    try:
        tmp.rename(p)
    except OSError:
        # a folder there now is another writer's, complete: keep it; else put the old one back
        if not p.is_dir():
            if old.exists():
                old.rename(p)
            raise
    _sync(p.parent)
    shutil.rmtree(old, ignore_errors=True)


def write_folder(path: str | Path, files: Mapping[str, Content]) -> Path:
    """Write ``files`` (name → content) as the folder ``path``, whole or not at all
    (:func:`new_folder`)."""
    with new_folder(path) as tmp:
        for name, data in files.items():
            _write_file(tmp / name, data)
    return Path(path)


def remove_leftovers(
    folder: str | Path, older_than: float = 0.0, of: str | None = None
) -> list[Path]:
    """Remove from ``folder`` what writes killed part-way left there (``.*.tmp``, ``.*.old``),
    when last changed more than ``older_than`` seconds ago (0: all of them, for a folder only
    one process writes); returns what was removed.

    With ``of``, the name of one target in ``folder``, only that target's leftovers go, and
    only those whose writer (the process whose id :func:`_beside` put in the name) has ended:
    a folder of the user's (a site's parent) may hold other programs' ``.*.tmp`` files, and
    another process may be writing the same target right now."""
    found = [*Path(folder).glob(".*.tmp"), *Path(folder).glob(".*.old")]
    if of is not None:
        own = re.compile(rf"\.{re.escape(_short(of))}\.\d+-[0-9a-f]+\.(tmp|old)")
        found = [leftover for leftover in found if own.fullmatch(leftover.name)]
    removed = []
    for leftover in found:
        try:
            if time.time() - leftover.lstat().st_mtime < older_than:
                continue  # perhaps a write still in progress
        except FileNotFoundError:
            continue
        if of is not None and _writer_runs(leftover):
            continue
        if leftover.is_dir() and not leftover.is_symlink():
            shutil.rmtree(leftover, ignore_errors=True)
        else:
            leftover.unlink(missing_ok=True)
        removed.append(leftover)
    return removed


def _writer_runs(leftover: Path) -> bool:
    """Whether the process that made ``leftover`` (``.NAME.PID-RANDOM.KIND``) still runs."""
    pid = int(leftover.name.rsplit(".", 2)[-2].split("-")[0])
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (OSError, OverflowError):  # EPERM: it runs, as another user
        return True
    return True


# --- reading: regular files only, with a bound -------------------------------------------------


def _refuse(p: Path, what: str, mode: int) -> NotAFileError:
    return NotAFileError(
        f"{what} {p} is {file_kind(mode)}, not a regular file; give the path of a text file"
    )


@contextmanager
def open_regular(path: str | os.PathLike[str], what: str) -> Iterator[BinaryIO]:
    """``path`` opened for reading in binary, if it is a regular file (a link to one counts).

    A device, FIFO, socket or folder raises :class:`NotAFileError` before it is opened (a FIFO
    with no writer would hang the open, ``/dev/zero`` never ends); the open itself is
    non-blocking and the opened file is looked at again, so one swapped in meanwhile is
    refused too. Any other failure is a ValueError naming ``what`` (e.g. "text file") and why.
    """
    p = Path(path)
    try:
        mode = os.stat(p).st_mode
        if not stat.S_ISREG(mode):
            raise _refuse(p, what, mode)
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
    except FileNotFoundError:
        raise ValueError(f"{what} {p} does not exist; give a UTF-8 text file") from None
    except OSError as e:
        raise ValueError(f"{what} {p}: cannot open it ({e.strerror or e})") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise _refuse(p, what, mode)
        f = os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
    with f:
        yield f


def read_text(path: str | os.PathLike[str], limit: int, what: str) -> str:
    """The UTF-8 text of the regular file ``path`` (:func:`open_regular`), of at most ``limit``
    characters; ``what`` names the file in messages ("text file"). At most ``4 * limit + 1``
    bytes are read (UTF-8 takes up to 4 bytes a character), whatever size the file claims:
    ``/proc``'s files claim 0. A ValueError says what is wrong and names the limit."""
    p = Path(path)
    most = 4 * limit
    too_big = f"the most headlab reads is {limit:,} characters"
    with open_regular(p, what) as f:
        size = os.fstat(f.fileno()).st_size
        if size > most:
            raise ValueError(f"{what} {p} is {size:,} bytes; {too_big}")
        blob = _read_at_most(f.fileno(), most + 1, p, what)
    if len(blob) > most:
        raise ValueError(f"{what} {p} has over {most:,} bytes; {too_big}")
    try:
        text = blob.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"{what} {p} is not UTF-8 (byte {exc.start}); save it as UTF-8") from None
    if len(text) > limit:
        raise ValueError(f"{what} {p} has {len(text):,} characters; {too_big}")
    return text


def _read_at_most(fd: int, n: int, p: Path, what: str) -> bytes:
    """Up to ``n`` bytes from ``fd``; a read error (EIO from ``/proc/self/mem``) as a sentence."""
    chunks: list[bytes] = []
    left = n
    try:
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
    except OSError as e:
        raise ValueError(f"{what} {p}: cannot read it ({e.strerror or e})") from None
    return b"".join(chunks)


# --- caches: what each file was when it was written, checked before it is used ---------------

MANIFEST = "manifest.json"  # a cache folder's record: each file's size and SHA-256, and its maker
MANIFEST_FORMAT = 1
# path → (its stat when hashed, its SHA-256): each file is hashed once a process while unchanged
RACY_SECONDS = 2.0  # a file changed this recently when hashed is hashed again at the next ask
_DIGESTS: dict[Path, tuple[tuple[int, ...], str]] = {}


def sha256_file(path: str | os.PathLike[str], chunk: int = 1 << 20) -> str:
    """The hex SHA-256 of a file, read in chunks (the file may be larger than memory wants)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def file_digest(path: str | os.PathLike[str]) -> str:
    """:func:`sha256_file` of ``path``, hashed in full the first time this process asks and
    again only when its size, mtime, ctime, inode or device changed since. A write in place
    changes the ctime whatever it does to the mtime (``touch -r`` cannot set a ctime), so a
    byte flipped under the same size and mtime is hashed again; a new process hashes anew.
    A file changed less than :data:`RACY_SECONDS` before it was hashed is hashed at every ask:
    file times tick coarsely (milliseconds), so a second write in the same tick would leave
    them as they were (git's "racy clean" entries, handled the same way)."""
    p = Path(path).absolute()
    st = os.stat(p)
    key = (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev)
    seen = _DIGESTS.get(p)
    if seen is not None and seen[0] == key:
        return seen[1]
    hashed_at = time.time()
    digest = sha256_file(p)
    if hashed_at - max(st.st_ctime, st.st_mtime) > RACY_SECONDS:
        _DIGESTS[p] = (key, digest)
    return digest


def write_manifest(
    folder: str | Path, names: Iterable[str] | None, produced_by: Mapping[str, Any]
) -> Path:
    """Record the files ``names`` of ``folder`` (None: every file in it, :func:`folder_files`),
    each one's size and SHA-256, and ``produced_by`` (what made them: pins, versions, code
    hashes; JSON values) in ``folder/manifest.json``, through :func:`write_json`. Written last,
    once the files are complete: a folder whose manifest is missing was never finished, or is
    not vouched for."""
    p = Path(folder)
    files = {}
    for name in sorted(folder_files(p) if names is None else names):
        files[name] = {"bytes": (p / name).stat().st_size, "sha256": file_digest(p / name)}
    record = {"format": MANIFEST_FORMAT, "produced_by": dict(produced_by), "files": files}
    return write_json(p / MANIFEST, record)


def manifest_problem(
    folder: str | Path, names: Iterable[str] | None, produced_by: Mapping[str, Any] | None = None
) -> str | None:
    """Why the files ``names`` of the cache ``folder`` are not the ones its manifest recorded
    when they were written (:func:`write_manifest`), in words ("model.safetensors has 4,096
    bytes where 538,086,728 were written"); None when every one matches, and, when
    ``produced_by`` is given, the manifest names that maker. ``names`` None: every file the
    manifest records and every file in the folder (one it does not record is a problem). The
    one check a cache folder passes before it is read: sizes first, then the full SHA-256
    (:func:`file_digest`: once a process per unchanged file)."""
    p = Path(folder)
    record = _manifest(p)
    if isinstance(record, str):
        return record
    if names is None:
        names = sorted(set(record["files"]) | set(folder_files(p)))
    if produced_by is not None and record["produced_by"] != json.loads(json_text(produced_by)):
        return f"its record of files ({MANIFEST}) names another maker than this headlab's"
    for name in names:
        expect = record["files"].get(name)
        if expect is None:
            return f"{name} is not in its record of files ({MANIFEST})"
        try:
            st = os.stat(p / name)
        except OSError:
            return f"{name} is missing"
        if not stat.S_ISREG(st.st_mode):
            return f"{name} is {file_kind(st.st_mode)}, not the file that was written"
        if st.st_size != expect["bytes"]:
            return f"{name} has {st.st_size:,} bytes where {expect['bytes']:,} were written"
        if file_digest(p / name) != expect["sha256"]:
            return f"{name} is not the file that was written (its SHA-256 differs from the record)"
    return None


def folder_files(folder: Path) -> list[str]:
    """Every regular file under ``folder`` (relative paths, with "/"), less its manifest and the
    hidden leftovers of writes (``.NAME.….tmp``)."""
    found = []
    for path in sorted(folder.rglob("*")):
        name = path.relative_to(folder).as_posix()
        if path.is_file() and name != MANIFEST and not path.name.startswith("."):
            found.append(name)
    return found


def _manifest(folder: Path) -> dict[str, Any] | str:
    """``folder``'s manifest, checked for shape; or why there is none to trust, in words."""
    path = folder / MANIFEST
    if not path.exists():
        return f"it has no record of its files ({MANIFEST}): it was never finished or vouched for"
    try:
        record = json.loads(read_text(path, 1_000_000, "manifest"))
    except (ValueError, RecursionError):
        return f"its record of files ({MANIFEST}) is unreadable"
    files = record.get("files") if isinstance(record, dict) else None
    if (
        not isinstance(files, dict)
        or record.get("format") != MANIFEST_FORMAT
        or not isinstance(record.get("produced_by"), dict)
        or not all(_is_entry(entry) for entry in files.values())
    ):
        return f"its record of files ({MANIFEST}) is malformed"
    return record


def _is_entry(entry: Any) -> bool:
    """Whether a manifest's entry is ``{"bytes": n ≥ 0, "sha256": 64 hex digits}``."""
    if not isinstance(entry, dict):
        return False
    size, digest = entry.get("bytes"), entry.get("sha256")
    return (
        isinstance(size, int)
        and not isinstance(size, bool)
        and size >= 0
        and isinstance(digest, str)
        and len(digest) == 64
        and set(digest) <= set("0123456789abcdef")
    )


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
