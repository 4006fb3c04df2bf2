"""The lock (locks/, written by scripts/lock.py): made from what pyproject.toml asks for, one
version of each package across every environment, and exactly what `make test` installed."""

from __future__ import annotations

import copy
import importlib.util
import re
import sys
import tomllib
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from conftest import require

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("lock", ROOT / "scripts" / "lock.py")
assert spec and spec.loader
lock = importlib.util.module_from_spec(spec)
spec.loader.exec_module(lock)
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
PINNED = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)")


def locked(env: str) -> dict[str, str]:
    """A lock file's packages: canonical name → exact version, read from its lines alone."""
    out = {}
    for line in (ROOT / "locks" / f"{env}.txt").read_text().splitlines():
        match = PINNED.match(line)
        if match:
            out[canonicalize_name(match[1])] = match[2]
    return out


def test_every_lock_matches_pyproject() -> None:
    assert lock.problems(PYPROJECT) == []
    assert set(lock.environments(PYPROJECT)) == {
        "serve",
        *PYPROJECT["project"]["optional-dependencies"],
    }


def test_a_dependency_added_or_loosened_without_relocking_is_caught() -> None:
    loosened = copy.deepcopy(PYPROJECT)
    deps = loosened["project"]["dependencies"]
    deps[[Requirement(d).name for d in deps].index("numba")] = "numba>=0.50"
    found = lock.problems(loosened)
    # the base set is in every environment: each lock names the change
    assert len(found) == len(lock.environments(PYPROJECT))
    assert all("numba>=0.50" in line and "numba>=0.60" in line for line in found)

    added = copy.deepcopy(PYPROJECT)
    added["project"]["optional-dependencies"]["docs"].append("mkdocs-redirects>=1.2")
    found = lock.problems(added)
    # docs and dev (which holds docs) are out of date, nothing else
    assert [line.split()[0] for line in found] == ["locks/docs.txt", "locks/dev.txt"]
    assert all("asks for mkdocs-redirects>=1.2" in line for line in found)


def test_each_requirement_is_met_by_its_lock_and_versions_agree_across_locks() -> None:
    dev = locked("dev")
    for env, extras in lock.environments(PYPROJECT).items():
        versions = locked(env)
        for line in lock.requirements(PYPROJECT, extras):
            req = Requirement(line)
            if req.marker and not req.marker.evaluate({"sys_platform": "linux"}):
                continue
            name = canonicalize_name(req.name)
            assert name in versions, f"{env}: {name} is not locked"
            assert req.specifier.contains(versions[name], prereleases=True), (env, line)
        assert versions["torch"] == "2.13.0+cpu"
        assert {name: dev[name] for name in versions} == versions, env


def test_the_environment_holds_exactly_the_dev_lock() -> None:
    """`make test` runs in .venv, synced from locks/dev.txt: what pip freeze would list (each
    distribution's metadata) equals the lock, headlab itself aside."""
    require(
        Path(sys.prefix).resolve() == (ROOT / ".venv").resolve(),
        "the tests run outside the checkout's .venv, which `make test` installs from the lock",
    )
    installed = {
        canonicalize_name(dist.metadata["Name"]): dist.version for dist in metadata.distributions()
    }
    installed.pop("headlab")
    assert installed == locked("dev")
