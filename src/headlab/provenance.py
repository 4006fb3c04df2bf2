"""What a run ran on: the one record every results and benchmark file carries as ``"versions"``.

    versions()   Python, the platform, the computing libraries' versions and the lock they match:
                 {"python": "3.11.2", "platform": "Linux x86_64", "headlab": "0.1.0",
                  "torch": "2.13.0+cpu", ..., "lock": "dev 3f2a9c1b2d4e"}
    lock_match   which lock of a ``locks/`` folder the installed packages match, in words
    locked       a lock file's packages, name → version

A figure measured on versions nobody wrote down cannot be checked or reproduced, so each writer of
a results file (benchmarks/record.py, the experiments' ``ship_results``, the docs' stored
answers) stores this dict beside its figures, and the docs' captions quote it.

The versions come from the installed packages' metadata (``importlib.metadata``), never from
importing them, so this module is cheap (a few milliseconds) and loads no torch. A lock
(``locks/NAME.txt``, written by ``make lock``) is matched when every package it names is installed
at exactly its version; of the locks that match, the largest is named (``dev``, the whole
development set, before ``serve``, the base set), with the first 12 hex digits of its file's
SHA-256. An installed wheel has no ``locks/`` folder beside it, and says so.
"""

from __future__ import annotations

import hashlib
import os
import platform
import re
import sys
from importlib import metadata
from pathlib import Path

# the packages that compute headlab's figures, and those that export or run them elsewhere
PACKAGES = ("headlab", "torch", "numpy", "numba", "transformers", "onnx", "onnxruntime")
NOT_INSTALLED = "not installed"
NO_LOCKS = "none: no locks/ folder (an installed wheel)"
NO_MATCH = "none: the installed versions are not a lock's"


def checkout_locks(package: Path) -> Path | None:
    """The ``locks/`` folder of the checkout the package folder ``package`` sits in
    (``<checkout>/src/headlab``), or None: an installed wheel (``site-packages/headlab``)."""
    return package.parents[1] / "locks" if package.parent.name == "src" else None


LOCKS = checkout_locks(Path(__file__).resolve().parent)


def versions(locks: Path | None = LOCKS) -> dict[str, str]:
    """Python, the platform, each of :data:`PACKAGES` ("not installed" where it is not) and the
    lock the installed packages match (:func:`lock_match` of ``locks``): a JSON-able dict."""
    found = {
        "python": platform.python_version(),
        "platform": f"{platform.system()} {platform.machine()}",
    }
    for name in PACKAGES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = NOT_INSTALLED
    found["lock"] = lock_match(locks)
    return found


def lock_match(locks: Path | None = LOCKS) -> str:
    """``"dev 3f2a9c1b2d4e"``: the largest lock in the folder ``locks`` whose every package is
    installed at its exact version, and its SHA-256's first 12 hex digits; else a sentence
    beginning ``"none:"`` that says why none is named."""
    if locks is None or not Path(locks).is_dir():
        return NO_LOCKS
    here = installed()
    matches = []
    for path in sorted(Path(locks).glob("*.txt")):
        wanted = locked(path)
        if wanted and all(_has(here, name, version) for name, version in wanted.items()):
            matches.append((-len(wanted), path.stem, path))
    if not matches:
        return NO_MATCH
    _, name, path = min(matches)
    return f"{name} {hashlib.sha256(path.read_bytes()).hexdigest()[:12]}"


def _has(here: dict[str, str], name: str, version: str) -> bool:
    """Whether ``name`` is installed at ``version``: the folder names first, then (a package
    installed otherwise, an egg-info) its metadata, the authority."""
    if here.get(name) == version:
        return True
    try:
        return metadata.version(name) == version
    except metadata.PackageNotFoundError:
        return False


def locked(path: Path) -> dict[str, str]:
    """A lock file's packages (``uv pip compile`` format: ``name==version \\`` lines, each
    followed by its ``--hash=`` lines), names normalised: name → version."""
    out = {}
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        if line[:1].isspace() or line.startswith(("#", "-")) or "==" not in line:
            continue
        name, _, rest = line.partition("==")
        out[canonical(name.split("[")[0])] = re.split(r"[\s;\\]", rest.strip(), maxsplit=1)[0]
    return out


def installed() -> dict[str, str]:
    """Every distribution on ``sys.path``, name → version, the first of a name winning as at
    import. Read from the ``NAME-VERSION.dist-info`` folders' names (the wheel standard spells
    both there), which takes a directory listing instead of parsing every package's metadata."""
    out: dict[str, str] = {}
    for entry in sys.path:
        try:
            names = os.listdir(entry or ".")
        except OSError:  # a zip file, a folder that is gone
            continue
        for folder in names:
            if folder.endswith(".dist-info"):
                name, _, version = folder.removesuffix(".dist-info").partition("-")
                out.setdefault(canonical(name), version)
    return out


def canonical(name: str) -> str:
    """A package name as the standard compares them (PEP 503): ``Typing_Extensions`` →
    ``typing-extensions``."""
    return re.sub(r"[-_.]+", "-", name.strip()).lower()
