"""What a run ran on (headlab.provenance), checked against importlib.metadata's own answers, the
lock files' SHA-256 computed here, and made-up locks that do and do not match what is installed."""

from __future__ import annotations

import hashlib
import json
import platform
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

from headlab import provenance

ROOT = Path(__file__).resolve().parents[2]


def oracle_installed() -> dict[str, str]:
    """Every distribution's name (PEP 503) and version as importlib.metadata parses them."""
    out: dict[str, str] = {}
    for dist in metadata.distributions():
        name = dist.metadata["Name"].replace("_", "-").replace(".", "-").lower()
        out.setdefault(name, dist.version)
    return out


def write_lock(path: Path, packages: dict[str, str]) -> Path:
    """A lock in ``uv pip compile``'s format: a header, then each package and its hash lines."""
    lines = ["# a made-up lock", "#   torch>=2"]
    for name, version in packages.items():
        lines += [f"{name}=={version} \\", f"    --hash=sha256:{'0' * 64}", "    # via headlab"]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def some_installed(count: int) -> dict[str, str]:
    return dict(sorted(oracle_installed().items())[:count])


def test_the_versions_are_the_installed_packages_metadata() -> None:
    found = provenance.versions()
    assert found["python"] == ".".join(map(str, sys.version_info[:3]))
    assert found["platform"] == f"{platform.system()} {platform.machine()}"
    for name in ("torch", "numpy", "numba", "transformers", "headlab"):
        assert found[name] == metadata.version(name), name
    assert set(provenance.PACKAGES) <= set(found) and "lock" in found
    assert json.loads(json.dumps(found)) == found


def test_a_package_that_is_not_installed_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(provenance, "PACKAGES", ("torch", "no-such-package-here"))
    found = provenance.versions()
    assert found["no-such-package-here"] == "not installed"
    assert found["torch"] == metadata.version("torch")


def test_the_installed_packages_are_importlib_metadatas() -> None:
    assert provenance.installed() == oracle_installed()


def test_a_lock_the_installed_packages_match_is_named_with_its_hash(tmp_path: Path) -> None:
    lock = write_lock(tmp_path / "serve.txt", some_installed(5))
    sha = hashlib.sha256(lock.read_bytes()).hexdigest()
    assert provenance.lock_match(tmp_path) == f"serve {sha[:12]}"


def test_the_largest_matching_lock_is_named(tmp_path: Path) -> None:
    write_lock(tmp_path / "serve.txt", some_installed(3))
    dev = write_lock(tmp_path / "dev.txt", some_installed(8))
    sha = hashlib.sha256(dev.read_bytes()).hexdigest()[:12]
    assert provenance.lock_match(tmp_path) == f"dev {sha}"


def test_one_version_off_and_the_lock_is_not_matched(tmp_path: Path) -> None:
    packages = some_installed(5)
    name = next(iter(packages))
    write_lock(tmp_path / "dev.txt", {**packages, name: packages[name] + ".post999"})
    assert provenance.lock_match(tmp_path) == "none: the installed versions are not a lock's"
    serve = write_lock(tmp_path / "serve.txt", packages)  # the smaller one still holds
    assert provenance.lock_match(tmp_path).split() == [
        "serve",
        hashlib.sha256(serve.read_bytes()).hexdigest()[:12],
    ]


def test_a_package_missing_from_the_environment_fails_the_match(tmp_path: Path) -> None:
    write_lock(tmp_path / "dev.txt", {**some_installed(2), "no-such-package-here": "1.0"})
    write_lock(tmp_path / "empty.txt", {})
    assert provenance.lock_match(tmp_path).startswith("none: ")


def test_a_package_found_only_by_its_metadata_still_matches(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A package with no NAME-VERSION.dist-info folder (an egg-info) is looked up by name."""
    write_lock(tmp_path / "dev.txt", {"torch": metadata.version("torch")})
    monkeypatch.setattr(provenance, "installed", dict)
    assert provenance.lock_match(tmp_path).startswith("dev ")


def test_no_locks_folder_is_an_installed_wheel(tmp_path: Path) -> None:
    wheel = tmp_path / "lib/python3.11/site-packages/headlab"
    assert provenance.checkout_locks(wheel) is None
    assert provenance.versions(None)["lock"] == "none: no locks/ folder (an installed wheel)"
    assert provenance.lock_match(tmp_path / "missing") == provenance.NO_LOCKS
    assert provenance.checkout_locks(ROOT / "src/headlab") == ROOT / "locks"
    assert provenance.LOCKS == ROOT / "locks"


def test_the_checkouts_environment_is_named_by_its_lock() -> None:
    """Whichever of locks/*.txt the environment holds exactly (read here with a second parser),
    the largest is the one named; none, and it says so."""
    here = oracle_installed()
    matches = []
    for path in (ROOT / "locks").glob("*.txt"):
        pins = [
            line.split(" ")[0].split("==")
            for line in path.read_text(encoding="utf-8").splitlines()
            if line and not line.startswith((" ", "#"))
        ]
        if pins and all(here.get(n.replace("_", "-").lower()) == v for n, v in pins):
            matches.append((len(pins), path))
    expected = "none: the installed versions are not a lock's"
    if matches:
        path = min(matches, key=lambda m: (-m[0], m[1].stem))[1]  # ties: the first by name
        expected = f"{path.stem} {hashlib.sha256(path.read_bytes()).hexdigest()[:12]}"
    assert provenance.lock_match() == expected


def test_it_imports_no_torch() -> None:
    """Cheap enough for a cold-start benchmark: the versions come from metadata, not imports."""
    code = "import sys, headlab.provenance as p; p.versions(); print(sorted(sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded = set(json.loads(out.stdout.replace("'", '"')))
    assert "headlab.provenance" in loaded
    assert not {"torch", "numpy", "numba", "transformers"} & loaded
