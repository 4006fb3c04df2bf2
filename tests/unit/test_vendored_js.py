"""The page's vendored JavaScript (server/static/vendor/) is what npm installs from
web/package-lock.json, byte for byte, and ships in the wheel.

``headlab serve`` must work where npm never ran, so the libraries the page imports live in the
package; scripts/vendor_js.py copies them from web/node_modules. The oracles are npm's own
files: the lockfile, package.json, and what ``npm ci`` put under web/node_modules (``make test``
installs it; without it the byte comparison is skipped, saying so, and fails under CI).
"""

from __future__ import annotations

import importlib.util
import json
import tomllib
from pathlib import Path

import pytest

from conftest import require

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "headlab"
spec = importlib.util.spec_from_file_location("vendor_js", ROOT / "scripts" / "vendor_js.py")
assert spec is not None and spec.loader is not None
vendor_js = importlib.util.module_from_spec(spec)
spec.loader.exec_module(vendor_js)

HOW = (
    "run `npm ci --ignore-scripts` in web/, then `python scripts/vendor_js.py`, and commit "
    "src/headlab/server/static/vendor/ with web/package-lock.json"
)


def locked(package: str) -> str:
    """The version web/package-lock.json installs for ``package``."""
    lock = json.loads((ROOT / "web" / "package-lock.json").read_text(encoding="utf-8"))
    return str(lock["packages"][f"node_modules/{package}"]["version"])


def test_the_vendor_folder_holds_the_listed_files_and_nothing_else() -> None:
    held = {p.name for p in vendor_js.VENDOR.iterdir()}
    assert held == set(vendor_js.FILES), f"vendor/ differs from scripts/vendor_js.py: {HOW}"


def test_dagre_is_pinned_exactly_and_the_copy_says_the_locked_version() -> None:
    """package.json pins the exact version the lockfile holds, and the vendored build carries
    that version string (dagre exports ``version``): a copy from another release fails here
    even without node_modules."""
    pins = json.loads((ROOT / "web" / "package.json").read_text(encoding="utf-8"))
    version = locked("@dagrejs/dagre")
    assert pins["dependencies"]["@dagrejs/dagre"] == version
    text = (vendor_js.VENDOR / "dagre.esm.js").read_text(encoding="utf-8")
    assert f'="{version}"' in text, f"vendor/dagre.esm.js is not dagre {version}: {HOW}"


@pytest.mark.parametrize("name", sorted(vendor_js.FILES))
def test_each_vendored_file_is_the_one_npm_installed_from_the_lockfile(name: str) -> None:
    package = vendor_js.FILES[name][0]
    require(
        vendor_js.MODULES.is_dir(),
        "web/node_modules is absent (`make test` runs `npm ci` in web/): nothing to compare with",
    )
    assert vendor_js.installed_version(package) == locked(package), (
        f"web/node_modules holds {package} {vendor_js.installed_version(package)}, the lockfile "
        f"{locked(package)}: {HOW}"
    )
    copy = (vendor_js.VENDOR / name).read_bytes()
    assert copy == vendor_js.source(name).read_bytes(), f"vendor/{name} differs from npm's: {HOW}"


def test_the_wheel_carries_the_vendored_files() -> None:
    """pyproject's package-data globs take in every vendored file (the page imports them)."""
    globs = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"][
        "setuptools"
    ]["package-data"]["headlab"]
    packaged = {p for pattern in globs for p in SRC.glob(pattern)}
    for name in vendor_js.FILES:
        assert vendor_js.VENDOR / name in packaged, name


def test_the_page_imports_the_vendored_build_by_a_relative_url() -> None:
    """The page's module imports dagre from the static folder itself (served by ``headlab
    serve`` and copied whole into the static site), never from a CDN, and the build has no
    eval, which the page's Content-Security-Policy (script-src 'self') refuses."""
    script = (SRC / "server" / "static" / "js" / "evidence-card.js").read_text(encoding="utf-8")
    assert 'import dagre from "../vendor/dagre.esm.js";' in script
    build = (vendor_js.VENDOR / "dagre.esm.js").read_text(encoding="utf-8")
    assert "eval(" not in build and "new Function" not in build
    assert "import" not in build  # self-contained: graphlib is inside, nothing else is fetched
