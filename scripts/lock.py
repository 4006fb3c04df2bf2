"""headlab's lock: every environment the Makefile and CI build, each package at an exact version
with its hashes, one file an environment under ``locks/``.

    python scripts/lock.py            write the locks from pyproject.toml (``make lock``), keeping
                                      each locked version that still fits
    python scripts/lock.py --upgrade  the same, each package at the newest version it allows
    python scripts/lock.py --check    fail, naming the command that fixes it, where
                                      pyproject.toml asks for something a lock was not made
                                      from (``make lock-check``)

uv resolves (``uv pip compile``); ``locks/dev.txt``, the whole development set, is resolved first
and every other environment is resolved inside it, so a package has one version in every lock.
Each lock begins with the requirements it was made from, which ``--check`` compares with
pyproject.toml: a dependency added, removed, tightened or loosened there without ``make lock``
fails the check. The locks hold no index addresses: packages come from the index pip and uv are
set up with, and PyTorch's CPU build from ``--find-links`` (``/opt/wheels`` on the machines
headlab is built on; PyTorch's CPU wheel index elsewhere).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
LOCKS = ROOT / "locks"
# PyTorch's CPU build: PyPI's Linux wheel of the same version is the CUDA build, several GB
PINS = ("torch==2.13.0+cpu",)
# the machines headlab is developed, tested and served on
PYTHON, PLATFORM = "3.11", "x86_64-manylinux_2_28"
WHEELS = os.environ.get("HEADLAB_WHEELS", "/opt/wheels")
HEADER = "# made from these requirements (scripts/lock.py compares them with pyproject.toml):"


def environments(pyproject: dict) -> dict[str, list[str]]:
    """Each environment's name → the extras it installs: the base set ('serve', what ``make
    serve`` installs) and one environment an extra ('dev' is what ``make test`` installs)."""
    extras = list(pyproject["project"].get("optional-dependencies", {}))
    return {"serve": [], **{extra: [extra] for extra in extras}}


def requirements(pyproject: dict, extras: list[str]) -> list[str]:
    """The requirements an environment asks for: the base dependencies and those of ``extras``,
    with headlab's own extras (``headlab[hf,docs]``) opened up, normalised and sorted."""
    project = pyproject["project"]
    name = canonicalize_name(project["name"])
    optional = project.get("optional-dependencies", {})
    wanted, seen, todo = set(project["dependencies"]), set(), list(extras)
    while todo:
        extra = todo.pop()
        if extra in seen:
            continue
        seen.add(extra)
        for line in optional[extra]:
            req = Requirement(line)
            if canonicalize_name(req.name) == name:
                todo += sorted(req.extras)
            else:
                wanted.add(line)
    return sorted({str(Requirement(line)) for line in wanted}, key=str.lower)


def lock_path(env: str) -> Path:
    return LOCKS / f"{env}.txt"


def recorded(lock: Path) -> list[str] | None:
    """The requirements a lock file says it was made from, or None where it says none."""
    if not lock.exists():
        return None
    lines = lock.read_text().splitlines()
    if HEADER not in lines:
        return None
    out = []
    for line in lines[lines.index(HEADER) + 1 :]:
        if not line.startswith("#   "):
            break
        out.append(line[4:])
    return out


def problems(pyproject: dict, locks: Path = LOCKS) -> list[str]:
    """One sentence for each environment whose lock does not match pyproject.toml."""
    out = []
    for env, extras in environments(pyproject).items():
        lock = locks / f"{env}.txt"
        want = [*requirements(pyproject, extras), *PINS]
        have = recorded(lock)
        if have is None:
            out.append(f"locks/{env}.txt is missing or was not written by scripts/lock.py")
            continue
        added = sorted(set(want) - set(have))
        gone = sorted(set(have) - set(want))
        if added or gone:
            parts = [f"pyproject.toml asks for {', '.join(added)}"] if added else []
            parts += [f"the lock was made from {', '.join(gone)}"] if gone else []
            out.append(f"locks/{env}.txt is out of date ({'; '.join(parts)})")
    return out


def compile_lock(env: str, extras: list[str], pyproject: dict, upgrade: bool) -> None:
    """One environment's lock, resolved by uv; every environment but 'dev' inside dev's lock."""
    want = [*requirements(pyproject, extras), *PINS]
    with tempfile.TemporaryDirectory() as tmp:
        inputs = Path(tmp) / "requirements.in"
        inputs.write_text("\n".join(want) + "\n")
        out = Path(tmp) / "lock.txt"
        if lock_path(env).exists() and not upgrade:
            out.write_bytes(lock_path(env).read_bytes())  # uv keeps the versions it finds there
        command = [
            *uv(),
            "pip",
            "compile",
            str(inputs),
            "--output-file",
            str(out),
            "--python-version",
            PYTHON,
            "--python-platform",
            PLATFORM,
            "--generate-hashes",
            "--no-header",
            "--no-annotate",
            "--no-emit-index-url",
            "--no-emit-find-links",
            "--quiet",
        ]
        if Path(WHEELS).is_dir():
            command += ["--find-links", WHEELS]
        if upgrade:
            command.append("--upgrade")
        if env != "dev":
            command += ["--constraint", str(lock_path("dev"))]
        subprocess.run(command, check=True)
        body = out.read_text()
    header = [
        f"# headlab's lock of the environment {env!r}: exact versions and hashes.",
        "# Written by `make lock` (scripts/lock.py, with uv), not by hand; install with",
        f"# `uv pip sync --require-hashes locks/{env}.txt` or `pip install --require-hashes -r`.",
        HEADER,
        *(f"#   {line}" for line in want),
    ]
    lock_path(env).write_text("\n".join(header) + "\n" + body)


def uv() -> list[str]:
    here = Path(sys.executable).parent / "uv"
    return [str(here)] if here.exists() else ["uv"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare the locks with pyproject")
    parser.add_argument("--upgrade", action="store_true", help="each package at its newest version")
    args = parser.parse_args(argv)
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    if args.check:
        found = problems(pyproject)
        for line in found:
            print(line, file=sys.stderr)
        if found:
            print("run 'make lock' and commit locks/", file=sys.stderr)
        return 1 if found else 0
    LOCKS.mkdir(exist_ok=True)
    envs = environments(pyproject)
    compile_lock("dev", envs["dev"], pyproject, args.upgrade)
    for env, extras in envs.items():
        if env != "dev":
            compile_lock(env, extras, pyproject, args.upgrade)
    return 0


if __name__ == "__main__":
    sys.exit(main())
