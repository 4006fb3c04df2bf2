"""The head widget's evidence, in the same headless Chromium as test_browser.py: the head card
(its sentence and numbers are those of POST /api/heads's ``evidence`` answer) and the induction
circuit graph (its edges are those :func:`headlab.heads.circuit.induction_circuit` finds, run
here in the test process), inside the viewport at a desktop's and a phone's width, and axe-core
finding nothing serious.

One page per width serves the module (the fixture ``shown``): it ticks "show the evidence" once.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import test_browser
from playwright.sync_api import expect

from conftest import watched_page

pytestmark = [pytest.mark.browser, pytest.mark.slow]
expect.set_options(timeout=60_000)
WIDTHS = (1280, 390)


@pytest.fixture(scope="module")
def circuit_oracle() -> dict:
    """``headlab circuit --json``'s answer for the page's model, computed here."""
    from headlab import zoo
    from headlab.heads.circuit import induction_circuit
    from headlab.measure import build_probe

    model, tokenizer = zoo.load(test_browser._model_name())
    c = model.config
    probe = build_probe("random-repeat", tokenizer, c.max_len, c.vocab_size, seed=0)
    return induction_circuit(model, probe, "mean").to_dict()


@pytest.fixture(scope="module", params=WIDTHS, ids=lambda w: f"{w}px")
def shown(request, browser, server: str) -> Iterator[tuple[object, dict]]:
    """A page at the width with the evidence box ticked, and the /api/heads answer it drew."""
    context, pg = watched_page(browser, request.param)
    pg.width = request.param
    pg.set_default_timeout(120_000)
    pg.goto(server + "/")
    pg.wait_for_selector("#heads-grid button[data-head]")
    box = pg.locator("#heads-evidence")
    assert box.count() == 1, "the head widget offers no 'show the evidence' box"
    with pg.expect_response(lambda r: r.url.endswith("/api/heads"), timeout=300_000) as info:
        box.check()
    assert info.value.ok, info.value.text()
    answer = info.value.json()
    assert answer.get("evidence"), "the page did not ask for the evidence"
    pg.wait_for_selector("#evidence-card")
    pg.wait_for_selector("#circuit-graph", timeout=300_000)
    yield pg, answer
    context.close()


def pick(pg, layer: int, head: int) -> None:
    pg.select_option("#heads-which", f"{layer}.{head}")
    expect(pg.locator("#evidence-card h3")).to_contain_text(f"head {layer}.{head}'s label")


def test_circuit_graph_draws_the_circuit_the_library_finds(shown, circuit_oracle) -> None:
    pg, _ = shown
    want = {
        (f"{e['from'][0]}.{e['from'][1]}-{e['to'][0]}.{e['to'][1]}", e["confirmed_by_ablation"])
        for e in circuit_oracle["edges"]
        if e["above_baseline"]
    }
    assert want, "the oracle found no edge: nothing to compare"
    lines = pg.locator("#circuit-graph [data-edge]")
    got = {
        (ln.get_attribute("data-edge"), ln.get_attribute("data-confirmed") == "true")
        for ln in lines.all()
    }
    assert got == want
    nodes = {g.get_attribute("data-node") for g in pg.locator("#circuit-graph [data-node]").all()}
    heads = circuit_oracle["previous"] + circuit_oracle["induction"]
    assert nodes == {f"{n['head'][0]}.{n['head'][1]}" for n in heads}
    # edge width grows with the K-composition score
    pairs = sorted(
        (float(ln.get_attribute("data-k")), float(ln.get_attribute("stroke-width")))
        for ln in lines.all()
    )
    assert [w for _, w in pairs] == sorted(w for _, w in pairs)
    assert pg.errors == []


@pytest.mark.parametrize("which", ["previous-token", "induction"])
def test_card_says_what_the_evidence_answer_says(shown, which: str) -> None:
    pg, answer = shown
    rows = answer["evidence"]["heads"]
    row = next(r for r in rows if r["label"] == which)
    pick(pg, row["layer"], row["head"])
    assert pg.inner_text("#evidence-sentence") == row["evidence"]
    for key, base in row["baselines"].items():
        if key.endswith("_mul"):
            continue
        cells = pg.locator(f'#evidence-scores tr[data-score="{key}"] td').all_inner_texts()
        rnd, shf = base["random"], base["shuffled"]
        assert cells == [
            f"{row['scores'][key]:.2f}",
            f"{rnd['mean']:.2f} ± {rnd['sd']:.2f}",
            f"{shf['mean']:.2f} ± {shf['sd']:.2f}",
        ], key
    feeds = row["ablation"]["induction_scores"]
    for f in feeds:
        text = pg.inner_text(f'#evidence-ablation [data-feeds="{f["head"][0]}.{f["head"][1]}"]')
        assert f"{f['from']:.2f} → {f['to']:.2f}" in text
    later = row["ablation"]["later_copy"]["loss_rise"]
    assert f"{later:+.2f} nats" in pg.inner_text("#evidence-ablation")
    shown_pairs = pg.locator("#evidence-compositions li").all_inner_texts()
    comps = row["compositions"]["from"] + row["compositions"]["into"]
    assert [f"{c['score']:.3f}" in t for c, t in zip(comps, shown_pairs, strict=True)] == [
        True
    ] * len(comps)


def test_thin_evidence_is_said_plainly(shown) -> None:
    """A head no type passes (or one whose ablation does less than its layer's median) is
    called thin; the previous-token head 0.0, whose ablation wipes out the induction heads, is
    not."""
    pg, answer = shown
    rows = answer["evidence"]["heads"]
    strong = next(r for r in rows if r["label"] == "previous-token")
    pick(pg, strong["layer"], strong["head"])
    assert pg.locator("#evidence-thin").count() == 0
    weak = next(
        (
            r
            for r in rows
            if r.get("ablation")
            and r["ablation"]["where_it_acts"]["loss_rise"]
            <= r["ablation"]["where_it_acts"]["layer_median"]
        ),
        None,
    )
    assert weak is not None, "every head beats its layer's median: nothing thin to show"
    pick(pg, weak["layer"], weak["head"])
    expect(pg.locator("#evidence-thin")).to_contain_text("The evidence is thin")


def test_card_and_circuit_fit_the_viewport(shown) -> None:
    pg, answer = shown
    row = next(r for r in answer["evidence"]["heads"] if r["label"] == "induction")
    pick(pg, row["layer"], row["head"])
    for sel in (
        "#evidence-card",
        "#evidence-scores",
        "#circuit-graph",
        "#circuit-note",
        "#heads-circuit figure",
    ):
        el = pg.locator(sel).first
        el.scroll_into_view_if_needed()
        box = el.bounding_box()
        assert box is not None, sel
        assert box["x"] >= 0 and box["x"] + box["width"] <= pg.width + 0.5, (sel, box, pg.width)
    # every node of the graph is inside the svg (drawn to the container's width)
    svg = pg.locator("#circuit-graph").bounding_box()
    for g in pg.locator("#circuit-graph circle").all():
        b = g.bounding_box()
        assert svg["x"] <= b["x"] and b["x"] + b["width"] <= svg["x"] + svg["width"] + 0.5
    assert pg.evaluate("document.documentElement.scrollWidth") <= pg.width


def test_axe_finds_nothing_serious_in_the_evidence(shown) -> None:
    from axe_playwright_python.sync_playwright import Axe
    from test_browser_learners import serious

    pg, _ = shown
    results = Axe().run(pg, context="#heads-card, #heads-circuit, #heads-form").response
    assert results["passes"], "axe ran no checks"
    assert serious(results) == []
    assert pg.errors == []
