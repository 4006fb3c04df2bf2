"""headlab.files, the one writer: a file or a folder is absent, its old self, or complete; NaN
becomes null; a target that is not a regular file (a device, a FIFO, a folder) is refused and
left as it is."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
from typer.testing import CliRunner

from headlab import files


def names(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def test_write_atomic_writes_bytes_text_and_a_writer_function(tmp_path: Path) -> None:
    assert files.write_atomic(tmp_path / "b", b"\x00\xff").read_bytes() == b"\x00\xff"
    assert files.write_atomic(tmp_path / "t", "δ").read_bytes() == "δ".encode()
    files.write_atomic(tmp_path / "f", lambda path: path.write_bytes(b"by a library"))
    assert (tmp_path / "f").read_bytes() == b"by a library"
    files.write_atomic(tmp_path / "t", "replaced")
    assert (tmp_path / "t").read_text() == "replaced" and names(tmp_path) == ["b", "f", "t"]
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE((tmp_path / "t").stat().st_mode) == 0o666 & ~umask  # as open() makes


def test_write_atomic_keeps_the_old_file_when_writing_fails(tmp_path, monkeypatch):
    out = tmp_path / "t.json"
    out.write_text("old")

    def broken_replace(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(OSError):
        files.write_atomic(out, "new")
    assert out.read_text() == "old" and list(tmp_path.iterdir()) == [out]


def test_a_writer_function_that_fails_leaves_nothing(tmp_path: Path) -> None:
    def half(path: Path) -> None:
        path.write_bytes(b"half")
        raise RuntimeError("the library failed")

    with pytest.raises(RuntimeError):
        files.write_atomic(tmp_path / "x", half)
    assert names(tmp_path) == []


def test_write_json_is_finite_and_makes_the_folder(tmp_path: Path) -> None:
    data = {"a": [float("nan"), 1.5], "b": float("-inf")}
    path = files.write_json(tmp_path / "new" / "r.json", data)
    assert json.loads(path.read_text()) == {"a": [None, 1.5], "b": None}
    assert path.read_text().endswith("\n") and "NaN" not in path.read_text()


def _device(tmp_path: Path) -> Path:
    """A character device like /dev/null (1, 3); made with mknod, so root only."""
    if os.geteuid() != 0:
        pytest.skip("mknod needs root")
    node = tmp_path / "n"
    os.mknod(node, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    return node


def _targets(tmp_path: Path) -> dict[str, Path]:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    (tmp_path / "folder").mkdir()
    return {"a FIFO": fifo, "a folder": tmp_path / "folder"}


def test_writers_refuse_what_is_not_a_regular_file(tmp_path: Path) -> None:
    for kind, target in _targets(tmp_path).items():
        assert files.check_writable(target) is not None, kind
        with pytest.raises(files.NotAFileError, match="not a regular file"):
            files.write_atomic(target, "x")
        with pytest.raises(files.NotAFileError):
            files.write_json(target, {})
    assert stat.S_ISFIFO((tmp_path / "fifo").lstat().st_mode)
    assert (tmp_path / "folder").is_dir() and names(tmp_path / "folder") == []
    with pytest.raises(files.NotAFileError, match="does not exist"):
        files.write_atomic(tmp_path / "missing" / "x", "x")
    with pytest.raises(files.NotAFileError, match="not a folder"):
        files.write_folder(tmp_path / "fifo", {"a": "x"})
    assert names(tmp_path) == ["fifo", "folder"]  # no temporary file left


def test_a_device_is_refused_and_stays_a_device(tmp_path: Path) -> None:
    node = _device(tmp_path)
    with pytest.raises(files.NotAFileError, match="a device, FIFO or socket"):
        files.write_atomic(node, "x")
    assert stat.S_ISCHR(node.lstat().st_mode)


def test_cli_html_onto_a_device_exits_2_and_leaves_it(tmp_path: Path) -> None:
    """`headlab heads --html /dev/null` as root once replaced /dev/null with a file."""
    from headlab.cli import app

    node = _device(tmp_path)
    result = CliRunner().invoke(app, ["heads", "--html", str(node)])
    assert result.exit_code == 2, result.output
    said = result.stderr.strip()
    assert "not a regular file" in said and "\n" not in said, said
    assert "Traceback" not in result.output
    assert stat.S_ISCHR(node.lstat().st_mode)


def test_write_folder_writes_whole_and_replaces(tmp_path: Path) -> None:
    target = tmp_path / "f"
    files.write_folder(target, {"a.json": "{}", "b.bin": b"\x01", "c": lambda p: p.write_text("c")})
    assert names(target) == ["a.json", "b.bin", "c"] and (target / "c").read_text() == "c"
    files.write_folder(target, {"only": "new"})
    assert names(target) == ["only"] and names(tmp_path) == ["f"]


def test_an_error_mid_folder_leaves_the_old_folder_intact(tmp_path: Path) -> None:
    target = tmp_path / "f"
    files.write_folder(target, {"a": "old a", "b": "old b"})

    def broken(path: Path) -> None:
        path.write_text("half")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        files.write_folder(target, {"a": "new a", "b": broken})
    assert names(target) == ["a", "b"] and (target / "a").read_text() == "old a"
    with pytest.raises(KeyboardInterrupt), files.new_folder(target) as tmp:
        (tmp / "a").write_text("new a")
        raise KeyboardInterrupt
    assert (target / "a").read_text() == "old a"
    assert names(tmp_path) == ["f"]  # no temporary or parked folder left


def test_remove_leftovers_sweeps_only_old_temporaries(tmp_path: Path) -> None:
    (tmp_path / ".x.1-ab.tmp").mkdir()
    (tmp_path / ".y.1-ab.old").mkdir()
    (tmp_path / ".z.1-ab.tmp").write_text("")
    (tmp_path / "keep.tmp").write_text("")  # not hidden: not ours
    assert files.remove_leftovers(tmp_path, older_than=3600) == []
    removed = files.remove_leftovers(tmp_path)
    assert sorted(p.name for p in removed) == [".x.1-ab.tmp", ".y.1-ab.old", ".z.1-ab.tmp"]
    assert names(tmp_path) == ["keep.tmp"]


def test_remove_leftovers_of_one_target_sweeps_only_its_dead_writers(tmp_path: Path) -> None:
    """A site's parent may be any folder of the user's: only the leftovers of that target, of
    processes that have ended, are removed (issue 43)."""
    import subprocess
    import sys

    code = "import os; print(os.getpid())"
    ended = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    dead, alive = int(ended.stdout), os.getpid()
    ours = [f".site.{dead}-ab12.tmp", f".site.{dead}-cd34.old"]
    others = [f".site2.{dead}-ab12.tmp", f".x.site.{dead}-ab12.tmp", ".site.tmp", ".backup.tmp"]
    kept = [f".site.{alive}-ab12.tmp", f".site.{dead}-zz.tmp", *others]
    for name in ours + kept:
        (tmp_path / name).mkdir()
    removed = files.remove_leftovers(tmp_path, of="site")
    assert sorted(p.name for p in removed) == sorted(ours)
    assert names(tmp_path) == sorted(kept)


# --- issue 24: targets checked by trying, and the bounded reader of regular files ---------------


def test_a_target_in_a_folder_that_takes_no_files_is_refused_up_front(tmp_path: Path) -> None:
    """/proc and /sys exist as folders but take no new file: only trying tells (issue 24)."""
    for target in ("/proc/headlab-x.json", "/sys/headlab-x.json"):
        assert files.check_writable(target) is None  # the kind check alone lets it through
        problem = files.check_writable(target, try_it=True)
        assert problem is not None and "cannot write in" in problem and "\n" not in problem
    assert files.check_writable(tmp_path / "fine.json", try_it=True) is None
    assert names(tmp_path) == []  # the try left nothing behind


def test_a_long_name_is_refused_with_the_limit_and_one_that_fits_is_written(tmp_path) -> None:
    problem = files.check_writable(tmp_path / ("a" * 300 + ".json"), try_it=True)
    assert problem is not None and "305 bytes" in problem and "255" in problem, problem
    longest = tmp_path / ("b" * 250)  # fits; its temporary name beside it must fit too
    assert files.check_writable(longest, try_it=True) is None
    assert files.write_atomic(longest, "x").read_text() == "x"
    assert names(tmp_path) == [longest.name]


def test_a_target_swapped_for_a_fifo_during_the_write_is_not_renamed_over(tmp_path) -> None:
    target = tmp_path / "t.json"

    def swap(path: Path) -> None:
        path.write_text("new")
        os.mkfifo(target)  # appears after the first check, before the rename

    with pytest.raises(files.NotAFileError, match="not a regular file"):
        files.write_atomic(target, swap)
    assert stat.S_ISFIFO(target.lstat().st_mode) and names(tmp_path) == ["t.json"]


def _inputs(tmp_path: Path) -> dict[str, Path]:
    """Every kind of file input a user can name, made here (never the machine's own nodes)."""
    made = _targets(tmp_path)
    sock = tmp_path / "sock"
    import socket

    server = socket.socket(socket.AF_UNIX)
    server.bind(str(sock))
    server.close()
    made["a socket"] = sock
    if os.geteuid() == 0:
        made["a device"] = _device(tmp_path)
    return made


def test_read_text_refuses_what_is_not_a_regular_file_without_opening_it(tmp_path) -> None:
    for kind, path in _inputs(tmp_path).items():  # a FIFO with no writer would hang an open
        with pytest.raises(files.NotAFileError, match=f"is {kind}, not a regular file") as e:
            files.read_text(path, 100, "text file")
        assert str(e.value).startswith(f"text file {path} is"), kind
    with pytest.raises(ValueError, match="does not exist"):
        files.read_text(tmp_path / "missing", 100, "text file")


def test_read_text_reads_at_most_its_limit_and_names_it(tmp_path, monkeypatch) -> None:
    fine = tmp_path / "fine.txt"
    fine.write_text("δδ", encoding="utf-8")
    assert files.read_text(fine, 2, "text file") == "δδ"
    sparse = tmp_path / "sparse.txt"
    with open(sparse, "wb") as f:
        f.truncate(2**26)  # 64 MiB that take no disk: a regression reads it, it cannot OOM
    with pytest.raises(ValueError, match=r"the most headlab reads is 100 characters"):
        files.read_text(sparse, 100, "text file")
    read = []
    real = os.read
    monkeypatch.setattr(os, "read", lambda fd, n: read.append(n) or real(fd, n))
    monkeypatch.setattr(os, "fstat", lambda fd: os.stat_result((stat.S_IFREG | 0o644,) + (0,) * 9))
    with pytest.raises(ValueError, match="100 characters"):  # sizes 0, as /proc's files say
        files.read_text(sparse, 100, "text file")
    assert sum(read) <= 4 * 100 + 1


def test_read_text_turns_a_read_error_into_a_sentence(tmp_path, monkeypatch) -> None:
    """`heads --text-file /proc/self/mem` failed reading with EIO (issue 24)."""
    assert "Input/output error" in str(_read_error(tmp_path, monkeypatch))
    if Path("/proc/self/mem").exists():
        monkeypatch.undo()
        with pytest.raises(ValueError, match="cannot read it"):
            files.read_text("/proc/self/mem", 100, "text file")


def _read_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ValueError:
    import errno

    path = tmp_path / "x.txt"
    path.write_text("x")

    def broken(fd, n):
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(os, "read", broken)
    with pytest.raises(ValueError, match="cannot read it") as e:
        files.read_text(path, 100, "text file")
    return e.value
