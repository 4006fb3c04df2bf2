"""What only the command line needs: terminal progress reporters and the checks on ``--out``
made before any work. Nothing in the library imports this module; ``headlab.cli`` does. (The
training recipes of ``headlab train NAME`` are in :mod:`headlab.experiments.registry`.)
"""

from __future__ import annotations

import errno
import math
import os
import stat
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, TextIO

from headlab.files import file_kind
from headlab.training.train import Reporter

# ---------------------------------------------------------------------------------------------
# Progress: a progress bar on a terminal, plain log lines otherwise
# ---------------------------------------------------------------------------------------------


class LogReporter:
    """Plain log lines on a stream (for logs and pipes): one every ``every`` steps."""

    def __init__(self, stream: TextIO | None = None, every: int = 100) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.every = every
        self._t0 = time.perf_counter()
        self._step0 = 0
        self.total = 0

    def start(self, total: int, step: int) -> None:
        self.total, self._step0, self._t0 = total, step, time.perf_counter()
        self.message(f"training {total} steps" + (f", resuming at step {step}" if step else ""))

    def update(self, step: int, loss: float, lr: float) -> None:
        if step % self.every and step != self.total:
            return
        elapsed = time.perf_counter() - self._t0
        rate = (step - self._step0) / elapsed if elapsed > 0 else 0.0
        eta = (self.total - step) / rate if rate > 0 else float("nan")
        self.message(
            f"step {step}/{self.total}  loss {loss:.4f}  lr {lr:.2e}  "
            f"{rate:.1f} steps/s  eta {_duration(eta)}"
        )

    def record(self, record: dict[str, Any]) -> None:
        if record.get("kind") == "eval":
            shown = {k: v for k, v in record.items() if isinstance(v, float)}
            text = "  ".join(f"{k} {v:.4f}" for k, v in list(shown.items())[:6])
            self.message(f"eval @ step {record['step']}: {text}")

    def message(self, text: str) -> None:
        print(text, file=self.stream, flush=True)

    def finish(self) -> None:
        pass


class RichReporter:
    """A rich progress bar (steps/s, loss, ETA) for an interactive terminal."""

    def __init__(self, console: Any = None) -> None:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeRemainingColumn,
        )

        self.console = console if console is not None else Console(stderr=True)
        self.progress = Progress(
            TextColumn("[bold]train"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[rate]:.1f} steps/s"),
            TextColumn("loss {task.fields[loss]:.4f}"),
            TimeRemainingColumn(),
            console=self.console,
            transient=False,
        )
        self._task: Any = None
        self._t0 = 0.0
        self._step0 = 0

    def start(self, total: int, step: int) -> None:
        self.progress.start()
        self._t0, self._step0 = time.perf_counter(), step
        self._task = self.progress.add_task("train", total=total, completed=step, rate=0.0, loss=0)

    def update(self, step: int, loss: float, lr: float) -> None:
        elapsed = time.perf_counter() - self._t0
        rate = (step - self._step0) / elapsed if elapsed > 0 else 0.0
        self.progress.update(self._task, completed=step, loss=loss, rate=rate)

    def record(self, record: dict[str, Any]) -> None:
        pass

    def message(self, text: str) -> None:
        self.console.print(text)

    def finish(self) -> None:
        self.progress.stop()


def make_reporter(stream: TextIO | None = None, every: int = 100) -> Reporter:
    """A progress bar when ``stream`` (stderr by default) is a terminal, else plain log lines."""
    stream = stream if stream is not None else sys.stderr
    if stream.isatty():
        return RichReporter()
    return LogReporter(stream, every)


def _duration(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "?"
    minutes, secs = divmod(round(seconds), 60)
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


# ---------------------------------------------------------------------------------------------
# --out: checked before any work, so a run never trains for minutes and then cannot write
# ---------------------------------------------------------------------------------------------


def out_dir_problem(path: str | Path, option: str = "--out") -> str | None:
    """Why ``path`` cannot be the output directory (a sentence), or None. Nothing is created:
    an existing directory must be writable; a new one must be creatable inside the nearest
    existing folder above it. Null device, file, a file as parent, an unwritable folder and
    over-long names are all caught here."""
    text = os.fspath(path)
    if not text.strip() or "\0" in text:
        return f"{option} {text!r} is not a path; name a directory, e.g. runs/mine"
    limit = _name_max(Path(text))
    for part in Path(text).parts:
        if len(os.fsencode(part)) > limit:
            return (
                f"{option}: the name {part[:24]!r}... is {len(os.fsencode(part))} bytes long; "
                f"this file system allows {limit}"
            )
    if len(os.fsencode(os.path.abspath(text))) >= 4096:
        return f"{option}: the path is over 4096 bytes long; choose a shorter one"
    try:
        existing = _nearest_existing(Path(text))
    except OSError as exc:
        return f"{option} {text}: {exc.strerror}; choose another directory"
    if existing != Path(text) and not existing.is_dir():
        return f"{option} {text}: {existing} is a file, so no directory can be made under it"
    if existing == Path(text) and not existing.is_dir():
        if not existing.exists():
            return f"{option} {text} is a link to nothing; name a directory"
        mode = existing.stat().st_mode
        kind = "a file" if stat.S_ISREG(mode) else file_kind(mode)
        return f"{option} {text} is {kind}, not a directory; name a new or existing directory"
    return _unwritable(existing, option) or _holds_special(existing, option)


def _holds_special(directory: Path, option: str) -> str | None:
    """A sentence if ``directory`` holds a device, FIFO or socket (its first 10,000 names are
    looked at): a run writes its files there and never over one of those, so it would fail
    after the work."""
    try:
        with os.scandir(directory) as entries:
            for _, entry in zip(range(10_000), entries, strict=False):
                mode = entry.stat(follow_symlinks=False).st_mode
                if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode) or stat.S_ISLNK(mode)):
                    what = f"{entry.name} is {file_kind(mode)}"
                    return f"{option} {directory}: {what}; remove it or choose another directory"
    except OSError as exc:
        return f"{option}: cannot list {directory} ({exc.strerror}); choose another directory"
    return None


def _nearest_existing(path: Path) -> Path:
    """``path`` itself if it exists (a dangling link counts), else its nearest existing parent."""
    absolute = Path(os.path.abspath(path))
    candidate = absolute
    while not (candidate.exists() or candidate.is_symlink()) and candidate != candidate.parent:
        candidate = candidate.parent
    if candidate == absolute:
        return path
    return candidate


def _name_max(path: Path) -> int:
    """The longest file name the file system under ``path`` allows (255 on most)."""
    probe = Path(os.path.abspath(path))
    while True:
        try:
            return os.pathconf(probe, "PC_NAME_MAX")
        except (OSError, ValueError):
            if probe == probe.parent:
                return 255
            probe = probe.parent


def _unwritable(directory: Path, option: str) -> str | None:
    """A sentence if no file can be created in ``directory`` (tried, not guessed from modes:
    root, read-only mounts and ACLs all answer truthfully), else None."""
    try:
        with tempfile.TemporaryFile(dir=directory):
            pass
    except OSError as exc:
        why = exc.strerror or errno.errorcode.get(exc.errno or 0, "error")
        return f"{option}: cannot write in {directory} ({why}); choose a folder you can write to"
    return None
