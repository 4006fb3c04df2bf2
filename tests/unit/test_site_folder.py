"""Where `headlab static OUT` may write (issue 43): it once emptied whatever OUT held (a user's
thesis, the current folder) and gave tracebacks for '', links, link loops and paths under a
file. Now the site is built beside OUT and renamed into place whole; OUT is replaced only when
it is new, empty, a site headlab static wrote (its marker) or with --force; everything else is
one sentence and exit 2, and a build that fails or is killed leaves OUT as it was.

Most tests stand in for the slow part of the build (:func:`headlab.site.fill`: the ONNX export
and the API's answers) with a few files, so what is tested is the folder's safety; one test
runs the whole build through the command line.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from headlab import site
from headlab.cli import app
from headlab.site import MARKER, ORT_FILES, target_problem


@pytest.fixture
def web(tmp_path: Path) -> Path:
    """A stand-in for web/ after `npm ci`: onnxruntime-web's three files (their content is only
    copied by the build, never run here)."""
    dist = tmp_path / "web" / "node_modules" / "onnxruntime-web" / "dist"
    dist.mkdir(parents=True)
    for name in ORT_FILES:
        (dist / name).write_text("// stand-in\n")
    return tmp_path / "web"


@pytest.fixture(autouse=True)
def quick_answers(request, monkeypatch) -> None:
    """The server's stored answers, which the command line hands the builder, stood in for
    (the app is not started) except in the whole build."""
    if request.node.get_closest_marker("slow") is None:
        from headlab.server import stored

        # the server's health answer too: the builder writes the site's manifest into it
        answers = {"api/models.json": [], "api/health.json": {"status": "ok"}}
        monkeypatch.setattr(stored, "page_answers", lambda: answers)


def quick_fill(out: Path, dist: Path, model: object, tokenizer: object) -> list[str]:
    """The build's files, a few of them: what a real build writes first and last."""
    (out / "index.html").write_text("<html>new</html>")
    (out / "api").mkdir()
    (out / "api" / "models.json").write_text("[]")
    return ["models"]


def failing_fill(out: Path, dist: Path, model: object, tokenizer: object) -> list[str]:
    """A build that fails part-way: index.html written, api/ not (as the issue's killed build)."""
    (out / "index.html").write_text("<html>half</html>")
    raise OSError(28, "No space left on device")


def static(*args: str):
    """`headlab static ARGS`; checks what every run must show: no traceback, and an exit 2 says
    one line starting with error:."""
    result = CliRunner().invoke(app, ["static", *args])
    shown = f"headlab static {args}\n{result.output}"
    assert "Traceback" not in result.output, shown
    assert result.exception is None or isinstance(result.exception, SystemExit), shown
    if result.exit_code:
        said = result.stderr.strip()
        assert result.exit_code == 2 and said.startswith("error:") and "\n" not in said, shown
    return result


def tree(folder: Path) -> dict[str, str]:
    """Every file under ``folder`` (relative name → text), hidden ones included."""
    return {str(p.relative_to(folder)): p.read_text() for p in folder.rglob("*") if p.is_file()}


def a_site(folder: Path) -> Path:
    """A site as a build left it (its marker, written last)."""
    folder.mkdir()
    (folder / "index.html").write_text("<html>old</html>")
    marker = {"written_by": site.WRITTEN_BY, "version": "0"}
    (folder / MARKER).write_text(json.dumps(marker))
    return folder


# --- which folders may take the site ----------------------------------------------------------


def test_a_folder_of_the_users_is_refused_naming_force_and_kept(tmp_path, web, monkeypatch):
    monkeypatch.setattr(site, "fill", quick_fill)
    thesis = tmp_path / "thesis"
    thesis.mkdir()
    (thesis / "chapter1.tex").write_text("three years of work")
    (thesis / "figures").mkdir()
    (thesis / "figures" / "plot.pdf").write_text("%PDF")
    before = tree(thesis)
    result = static(str(thesis), "--web", str(web))
    assert result.exit_code == 2 and "--force" in result.stderr
    assert tree(thesis) == before
    assert target_problem(thesis, force=True) is None  # the flag the sentence names
    assert static(str(thesis), "--web", str(web), "--force").exit_code == 0
    assert site.is_site(thesis) and "chapter1.tex" not in tree(thesis)


def test_the_current_folder_is_refused_even_with_force(tmp_path, web, monkeypatch):
    monkeypatch.setattr(site, "fill", quick_fill)
    here = tmp_path / "here"
    here.mkdir()
    (here / "notes.txt").write_text("mine")
    monkeypatch.chdir(here)
    for force in ([], ["--force"]):
        for name in (".", str(here), "..", str(tmp_path)):  # and the folders above it
            result = static(name, "--web", str(web), *force)
            assert result.exit_code == 2 and "--force" in result.stderr, result.output
    assert tree(here) == {"notes.txt": "mine"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["here", "web"]


def test_the_root_and_the_home_folder_are_refused_even_with_force(tmp_path, monkeypatch):
    home = tmp_path / "home"
    home.mkdir()
    (home / "file").write_text("x")
    monkeypatch.setenv("HOME", str(home))
    for folder in ("/", str(home), str(tmp_path)):
        for force in (False, True):
            problem = target_problem(folder, force)
            assert problem is not None and "even with --force" in problem, folder
    assert target_problem(home / "site") is None  # a new folder under home is fine


def test_what_can_never_be_a_folder_is_one_sentence(tmp_path, web, monkeypatch):
    monkeypatch.setattr(site, "fill", quick_fill)
    (tmp_path / "file").write_text("keep")
    (tmp_path / "folder").mkdir()
    (tmp_path / "folder" / "inside").write_text("keep")
    os.symlink(tmp_path / "folder", tmp_path / "link")
    os.symlink(tmp_path / "loop", tmp_path / "loop")
    cases = {
        "": "not a folder name",
        " ": "not a folder name",
        str(tmp_path / "file"): "not a folder",
        str(tmp_path / "file" / "site"): "Not a directory",
        str(tmp_path / "link"): "is a link",
        str(tmp_path / "loop"): "is a link",
        str(tmp_path / "loop" / "site"): "symbolic links",
        str(tmp_path / ("n" * 300)): "too long",
    }
    for out, said in cases.items():
        for force in ([], ["--force"]):
            result = static(out, "--web", str(web), *force)
            assert result.exit_code == 2 and said in result.stderr, (out, result.output)
    assert (tmp_path / "file").read_text() == "keep"
    assert tree(tmp_path / "folder") == {"inside": "keep"}
    assert os.readlink(tmp_path / "link") == str(tmp_path / "folder")


def test_a_folder_that_takes_no_new_folder_is_refused_before_any_work(tmp_path, web, monkeypatch):
    """/sys's kind of target, in tmp: a read-only folder (as root, whom modes do not stop, the
    refusal the kernel would give is made to happen)."""
    calls: list[Path] = []
    monkeypatch.setattr(site, "fill", lambda out, *rest: calls.append(out) or [])
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    if os.geteuid() == 0:
        real_mkdir = os.mkdir

        def refused(path, *args, **kwargs):
            if Path(path).parent == locked:
                raise PermissionError(13, "Permission denied", str(path))
            return real_mkdir(path, *args, **kwargs)

        monkeypatch.setattr(os, "mkdir", refused)
    try:
        for out in (locked / "site", locked / "a" / "b"):
            result = static(str(out), "--web", str(web))
            assert result.exit_code == 2 and "cannot write in" in result.stderr, result.output
        assert calls == [] and list(locked.iterdir()) == []
    finally:
        locked.chmod(0o755)


def test_only_a_marker_headlab_wrote_makes_a_site(tmp_path: Path) -> None:
    assert site.is_site(a_site(tmp_path / "s"))
    forged = tmp_path / "forged"
    forged.mkdir()
    (forged / MARKER).write_text('{"written_by": "someone else"}')
    linked = tmp_path / "linked"
    linked.mkdir()
    os.symlink(tmp_path / "s" / MARKER, linked / MARKER)  # a link is no marker
    hollow = tmp_path / "hollow"
    hollow.mkdir()
    (hollow / MARKER).mkdir()
    for folder in (forged, linked, hollow):
        assert not site.is_site(folder)
        assert "--force" in (target_problem(folder) or ""), folder
    (tmp_path / "empty").mkdir()
    assert target_problem(tmp_path / "empty") is None


# --- building into place ------------------------------------------------------------------------


def test_a_site_is_built_whole_with_its_marker_and_rebuilt_in_place(tmp_path, web, monkeypatch):
    monkeypatch.setattr(site, "fill", quick_fill)
    out = tmp_path / "deep" / "site"
    assert static(str(out), "--web", str(web)).exit_code == 0
    assert set(tree(out)) == {"index.html", "api/models.json", "api/health.json", MARKER}
    assert json.loads((out / MARKER).read_text())["written_by"] == "headlab static"
    a_site(tmp_path / "old")
    assert static(str(tmp_path / "old"), "--web", str(web)).exit_code == 0
    assert tree(tmp_path / "old")["index.html"] == "<html>new</html>"
    empty = tmp_path / "empty"
    empty.mkdir()
    assert static(str(empty), "--web", str(web)).exit_code == 0 and site.is_site(empty)
    leftovers = [p.name for p in tmp_path.rglob(".*") if p.name != MARKER]
    assert leftovers == []


def test_a_build_that_fails_part_way_leaves_out_as_it_was(tmp_path, web, monkeypatch):
    monkeypatch.setattr(site, "fill", failing_fill)
    old = a_site(tmp_path / "old")
    before = tree(old)
    result = static(str(old), "--web", str(web))
    assert result.exit_code == 2 and "No space left" in result.stderr
    assert tree(old) == before
    assert static(str(tmp_path / "new"), "--web", str(web)).exit_code == 2
    assert not (tmp_path / "new").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old", "web"]  # no temporary left


def test_files_put_in_out_during_the_build_are_kept(tmp_path, web, monkeypatch):
    out = tmp_path / "out"

    def meanwhile(tmp: Path, *rest: object) -> list[str]:
        out.mkdir()
        (out / "draft.txt").write_text("written while the site was built")
        return quick_fill(tmp, *rest)

    monkeypatch.setattr(site, "fill", meanwhile)
    result = static(str(out), "--web", str(web))
    assert result.exit_code == 2 and "--force" in result.stderr
    assert tree(out) == {"draft.txt": "written while the site was built"}


KILLED = """
import os, signal, sys
from pathlib import Path
from headlab import site

def fill(out, *rest):
    (out / "index.html").write_text("<html>half</html>")  # then the machine goes down
    os.kill(os.getpid(), signal.SIGKILL)

site.fill = fill
site.build(sys.argv[1], Path(sys.argv[2]), dict)
"""


def test_a_killed_build_leaves_the_old_site_and_the_next_build_sweeps_its_folder(
    tmp_path, web, monkeypatch
):
    old = a_site(tmp_path / "old")
    before = tree(old)
    done = subprocess.run([sys.executable, "-c", KILLED, str(old), str(web)], check=False)
    assert done.returncode == -signal.SIGKILL
    assert tree(old) == before
    left = [p for p in tmp_path.iterdir() if p.name.startswith(".old.")]
    assert len(left) == 1 and left[0].name.endswith(".tmp"), left  # hidden, named a temporary
    assert tree(left[0]) == {"index.html": "<html>half</html>"}
    done = subprocess.run([sys.executable, "-c", KILLED, str(tmp_path / "new"), str(web)])
    assert done.returncode == -signal.SIGKILL and not (tmp_path / "new").exists()
    monkeypatch.setattr(site, "fill", quick_fill)
    assert static(str(old), "--web", str(web)).exit_code == 0
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith(".new.")) == [
        "old",
        "web",
    ]  # the killed build's folder for old is gone; new's waits for a build of new


# --- the whole build, through the command line -------------------------------------------------


@pytest.mark.slow
def test_the_whole_site_builds_through_the_command_line_and_rebuilds_in_place(tmp_path, web):
    pytest.importorskip("onnxruntime", reason="headlab[static] installs onnxruntime")
    pytest.importorskip("wordfreq", reason="headlab[static] installs wordfreq")
    out = tmp_path / "site"
    result = static(str(out), "--web", str(web))
    assert result.exit_code == 0, result.output
    names = set(tree_names(out))
    assert {"index.html", "openapi.json", "api/models.json", MARKER} <= names
    assert "static/offline/model.onnx" in names and site.is_site(out)
    (out / "stale.txt").write_text("from an older build")  # inside a site: replaced with it
    assert static(str(out), "--web", str(web)).exit_code == 0
    assert set(tree_names(out)) == names


def tree_names(folder: Path) -> list[str]:
    return [str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()]
