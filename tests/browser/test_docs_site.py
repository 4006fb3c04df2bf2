"""The documentation site in a real headless Chromium (Debian's, driven by Playwright), opened
from disk (file://) with the network blocked: every request that is not file:// is aborted and
recorded. Every page renders with its title and no console error, search finds pages, and no
request leaves the machine.

The site is `make docs`'s site/ when it is newer than everything it is built from (as in
`make test`, which builds it first); otherwise it is built here, strictly, into a temporary folder.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import expect

pytestmark = [pytest.mark.browser, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
SOURCES = ["docs", "mkdocs.yml", "scripts/docs", "src/headlab", "benchmarks/results", "README.md"]


def _newest_source() -> float:
    newest = 0.0
    for name in SOURCES:
        path = ROOT / name
        files = path.rglob("*") if path.is_dir() else [path]
        newest = max([newest, *(f.stat().st_mtime for f in files if f.is_file())])
    return newest


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    built = ROOT / "site"
    index = built / "index.html"
    if index.is_file() and index.stat().st_mtime > _newest_source():
        return built
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert done.returncode == 0, f"the strict build failed:\n{done.stderr[-3000:]}"
    return out


@pytest.fixture
def offline(browser) -> Iterator[tuple[object, list[str], list[str]]]:
    """A page whose every request that is not file:// is aborted and recorded, with its
    console errors. ``page.seen`` lists the file:// requests the route let through."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    left: list[str] = []
    errors: list[str] = []
    seen: list[str] = []

    def route(r) -> None:
        if r.request.url.startswith("file://"):
            seen.append(r.request.url)
            r.continue_()
        else:
            left.append(r.request.url)
            r.abort()

    context.route("**/*", route)
    page = context.new_page()
    page.seen = seen
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    yield page, left, errors
    context.close()


def test_every_page_renders_offline_with_its_title(site: Path, offline) -> None:
    page, left, errors = offline
    # 404.html is what a web server answers for a missing page; its links are root-absolute
    # for that reason, and no link in the site leads to it
    pages = sorted(p for p in site.rglob("*.html") if p.name != "404.html")
    assert len(pages) >= 30, pages
    for html in pages:
        page.goto(html.as_uri(), wait_until="load")
        heading = page.locator("article h1").first
        expect(heading).to_be_visible()
        assert heading.inner_text().strip(), html
        assert not errors, f"{html.relative_to(site)}: {errors}"
        assert page.locator(".md-header").count() == 1  # the theme's own CSS and JS loaded
    assert not left, f"requests left the machine: {left}"


def test_the_figures_are_rendered_tables_and_drawn_images(site: Path, offline) -> None:
    page, left, errors = offline
    page.goto((site / "results/induction.html").as_uri(), wait_until="load")
    expect(page.locator("article table").first).to_contain_text("seed 0")
    images = page.locator("article img")
    assert images.count() >= 2
    for i in range(images.count()):  # each PNG decoded: it is in the site, not fetched
        assert images.nth(i).evaluate("img => img.complete && img.naturalWidth > 0")
    assert not errors and not left


def test_search_finds_pages_from_disk(site: Path, offline) -> None:
    page, left, errors = offline
    page.goto((site / "index.html").as_uri(), wait_until="load")
    box = page.locator("input.md-search__input")
    box.click()
    box.press_sequentially("induction", delay=50)  # typed: the theme searches on key events
    results = page.locator(".md-search-result__item")
    expect(results.first).to_be_visible(timeout=30_000)
    assert results.count() >= 3
    results.first.locator("a").first.click()
    page.wait_for_load_state("load")
    assert "induction" in page.locator("article").inner_text().lower()
    # the index came from disk, through the route that blocks everything else
    assert any(u.endswith("/search/search_index.js") for u in page.seen), page.seen
    assert not errors, errors
    assert not left, f"requests left the machine: {left}"


def test_no_page_refers_to_an_asset_outside_the_site(site: Path) -> None:
    """Read, not run: no script, stylesheet, image, font or frame is addressed to another host
    (links to papers may leave the site when a reader follows them; nothing loads from one)."""
    asset = re.compile(
        r"<(?:script|img|iframe|source|link)\b[^>]*?\b(?:src|href)=\"(https?:)?//", re.I
    )
    css_url = re.compile(r"url\(\s*['\"]?(https?:)?//", re.I)
    found = []
    for path in site.rglob("*"):
        if path.suffix in {".html", ".css"}:
            text = path.read_text(encoding="utf-8", errors="replace")
            found += [f"{path.relative_to(site)}: {m[0]}" for m in asset.finditer(text)]
            found += [f"{path.relative_to(site)}: {m[0]}" for m in css_url.finditer(text)]
    assert not found, found


PHONE_TABLES = """() => {
  const boxes = [...document.querySelectorAll('article .md-typeset__scrollwrap')].map((box) => ({
    scrolls: box.scrollWidth > box.clientWidth,  // as the browser's scroll-state query counts it
    cue: getComputedStyle(box.firstElementChild, '::after').content,
    right: box.getBoundingClientRect().right,
  }));
  const doc = document.documentElement;
  return { boxes, page: doc.scrollWidth, vw: doc.clientWidth };
}"""


def test_tables_fit_a_phone_or_say_that_they_scroll(site: Path, browser) -> None:
    """At 390 px the page never scrolls sideways; the short tables (a handful of figures each)
    fit the screen whole, and a table still wider than its box says under it that it scrolls."""
    context = browser.new_context(viewport={"width": 390, "height": 900})
    context.route(
        "**/*", lambda r: r.continue_() if r.request.url.startswith("file:") else r.abort()
    )
    page = context.new_page()
    short = ("results/induction.html", "results/one-vs-many.html")
    # the estimate tables on evidence.html have seven columns, and heads.html's table of scores
    # names each in code (`induction_active` does not wrap): they may scroll, and say so
    wide = (
        "tutorial.html",
        "benchmarks.html",
        "reference/json-api.html",
        "evidence.html",
        "heads.html",
    )
    for name in short + wide:
        page.goto((site / name).as_uri(), wait_until="load")
        found = page.evaluate(PHONE_TABLES)
        assert found["boxes"] and found["page"] <= found["vw"], (name, found)
        assert all(b["right"] <= found["vw"] + 0.5 for b in found["boxes"]), (name, found)
        said = ["scrolls sideways" in b["cue"] for b in found["boxes"]]
        assert said == [b["scrolls"] for b in found["boxes"]], (name, found)
        if name in short:
            assert not any(said), (name, found)
        if name == "tutorial.html":
            assert all(said), found  # thirteen columns: this one scrolls, and says so
    context.close()
