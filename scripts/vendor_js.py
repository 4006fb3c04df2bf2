"""Copy the page's JavaScript libraries from web/node_modules into the package's static folder.

    cd web && npm ci --ignore-scripts && cd .. && python scripts/vendor_js.py

The page served by ``headlab serve`` must work where npm never ran (``make serve`` installs only
Python), so the libraries it imports are kept in the package (``server/static/vendor/``), copied
byte for byte from what npm installed from ``web/package-lock.json``; the static site copies the
static folder whole. tests/unit/test_vendored_js.py checks the copies against node_modules and
their versions against the lockfile: after ``npm install --save-exact <pkg>@<version>`` in web/,
run this script and commit the copies with the lockfile.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODULES = ROOT / "web" / "node_modules"
VENDOR = ROOT / "src" / "headlab" / "server" / "static" / "vendor"

# vendored name → (npm package, path inside it). dagre's ES module build carries graphlib
# inside it (no imports, no eval); the two licences travel with it.
FILES = {
    "dagre.esm.js": ("@dagrejs/dagre", "dist/dagre.esm.js"),
    "dagre.LICENSE": ("@dagrejs/dagre", "LICENSE"),
    "graphlib.LICENSE": ("@dagrejs/graphlib", "LICENSE"),
}


def source(name: str) -> Path:
    """Where ``name`` (a key of :data:`FILES`) comes from under web/node_modules."""
    package, inside = FILES[name]
    return MODULES / package / inside


def installed_version(package: str) -> str:
    """The version of ``package`` that npm installed under web/node_modules."""
    meta = json.loads((MODULES / package / "package.json").read_text(encoding="utf-8"))
    return str(meta["version"])


def main() -> int:
    missing = [str(source(n)) for n in FILES if not source(n).is_file()]
    if missing:
        print(f"not installed: {', '.join(missing)}; run `npm ci --ignore-scripts` in web/ first")
        return 1
    VENDOR.mkdir(parents=True, exist_ok=True)
    for name in FILES:
        shutil.copyfile(source(name), VENDOR / name)
        package = FILES[name][0]
        print(f"{VENDOR.relative_to(ROOT) / name} ← {package} {installed_version(package)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
