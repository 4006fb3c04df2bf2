"""The long-context sections in a real browser: the stored retrieval and sinks runs drawn from
their results files, the live needle against the API's own answer, and axe finds nothing serious."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

import pytest
import test_browser
from playwright.sync_api import expect

from conftest import watched_page
from headlab.experiments import results_path

pytestmark = [pytest.mark.browser, pytest.mark.slow]


@pytest.fixture(scope="module")
def reader(browser, server: str) -> Iterator[object]:
    test_browser._model_name()
    context, pg = watched_page(browser)
    pg.goto(server + "/")
    for name in ("sinks", "retrieval"):
        test_browser.reveal(pg, name)
    yield pg
    context.close()


def stored(name: str) -> dict:
    return json.loads(results_path(name).read_text())


def test_retrieval_figures_draw_the_stored_run(reader) -> None:
    r = stored("retrieval")
    section = reader.locator('[data-experiment="retrieval"]')
    for fig in ("retrieval-accuracy", "retrieval-histogram", "retrieval-heat"):
        box = section.locator(f'figure[data-figure="{fig}"]')
        expect(box).to_have_count(1)
        expect(box.locator("[data-remake]")).to_contain_text("headlab experiment retrieval")
    draws = max(len(row["random"]) for row in r["masking"]["by_k"])
    lines = section.locator('figure[data-figure="retrieval-accuracy"] svg polyline')
    expect(lines).to_have_count(3 + draws)  # top-k, random mean, each draw, no mask
    counts = section.locator('figure[data-figure="retrieval-histogram"] svg text')
    values = [int(t) for t in counts.all_text_contents() if t.isdigit()]
    assert sum(values) == r["heads"] == sum(len(row) for row in r["scores"])
    heat = section.locator('figure[data-figure="retrieval-heat"] svg')
    cells = heat.locator('rect[fill]:not([width="100%"])')
    grid = r["heat"]
    assert cells.count() - 1 == len(grid["depths"]) * len(grid["lengths"])  # one background
    rows = section.locator("#retrieval-masking tbody tr")
    expect(rows).to_have_count(len(r["masking"]["by_k"]))
    first = r["masking"]["by_k"][0]
    want = ", ".join(f"{v:.2f}" for v in first["random"])
    assert rows.nth(0).locator("td").nth(2).text_content() == want
    assert reader.errors == []


def test_sinks_figures_draw_each_model(reader) -> None:
    s = stored("sinks")
    section = reader.locator('[data-experiment="sinks"]')
    for m in s["models"]:
        ppl = section.locator(f'figure[data-figure="sinks-{m["model"]}-ppl"]')
        expect(ppl).to_have_count(1)
        sinks = {run["sinks"] for run in m["runs"]}
        expect(ppl.locator("svg polyline")).to_have_count(len(sinks) + 1)  # + the full cache
        expect(ppl.locator("[data-remake]")).to_contain_text("headlab experiment sinks")
        share = section.locator(f'figure[data-figure="sinks-{m["model"]}-share"]')
        layers = share.locator("svg text", has_text=re.compile(r"^layer \d+$"))
        expect(layers).to_have_count(len(m["sink_share"]))
    expect(section.locator("#sinks-verdict li")).to_have_count(len(s["verdict"]))


def test_the_live_needle_shows_the_api_answer(reader, server: str) -> None:
    section = reader.locator('[data-experiment="retrieval"]')
    reader.select_option("#needle-depth", "0.25")
    reader.fill("#needle-seed", "2")
    with reader.expect_response("**/api/retrieval/needle", timeout=180_000) as answer:
        section.locator("#needle-run").click()
    body = answer.value.json()
    summary = reader.locator("#needle-summary")
    expect(summary).to_contain_text(body["generated"], timeout=30_000)
    expect(summary).to_contain_text("repeated the number whole" if body["answered"] else "did not")
    rows = reader.locator("#needle-heads tbody tr")
    expect(rows).to_have_count(len(body["top_heads"]))
    for k, head in enumerate(body["top_heads"]):
        cells = rows.nth(k).locator("td").all_text_contents()
        assert cells[:2] == [f"{head['layer']}.{head['head']}", f"{head['score']:.3f}"]
    if body["model"] == "smollm2":
        assert body["answered"] and body["above_threshold"] > 0
    assert reader.errors == []


def test_axe_finds_nothing_serious_in_the_long_context_sections(reader) -> None:
    from axe_playwright_python.sync_playwright import Axe

    results = Axe().run(reader).response
    assert results["passes"], "axe ran no checks"
    bad = [
        f"{v['impact']} {v['id']}: {[n['target'] for n in v['nodes'][:3]]}"
        for v in results["violations"]
        if v["impact"] in ("serious", "critical")
    ]
    assert bad == []
