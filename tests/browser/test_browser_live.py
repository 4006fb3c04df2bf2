"""The "train it yourself" panel in a real headless Chromium: Train starts a run on the server,
the curves grow, the phase change is marked, the induction circuit is redrawn at each
evaluation, and the final scores and circuit are those of the experiment's own library call
with the same seed and recipe."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import asdict

import pytest
from axe_playwright_python.sync_playwright import Axe
from playwright.sync_api import expect
from test_browser_learners import serious

from conftest import watched_page

pytestmark = [pytest.mark.browser, pytest.mark.slow]
RUN_SECONDS = 900_000  # ms: a whole run on a busy shared machine
PHONE = 390  # px


@pytest.fixture
def live_page(browser, server: str):
    context, pg = watched_page(browser)
    pg.goto(server + "/")
    pg.wait_for_selector("#live-train")
    yield pg
    context.close()


def _points(page) -> int:
    return int(page.get_attribute("#live-losses", "data-points") or 0)


def wait_points(page, at_least: int) -> int:
    """Poll (from Python: the page's CSP forbids evaluated strings) until the loss chart has
    ``at_least`` evaluation points; returns how many it has."""
    deadline = time.monotonic() + RUN_SECONDS / 1000
    while (n := _points(page)) < at_least:
        assert time.monotonic() < deadline, f"the chart stayed at {n} points"
        page.wait_for_timeout(100)
    return n


def test_train_draws_the_phase_change_and_the_circuit_and_ends_with_the_librarys(
    browser, server: str, induction_quick
) -> None:
    """One run serves both live panels (a live run is the costliest thing a page test
    starts). The thread picker offers what the server serves; during the run the phase-change
    window is marked provisional, at the end final; the last message names the steps, the wall
    time and the threads (auto's pick, and why), and the final scores are the library's on
    those threads; no colour means two things across the two live charts. The circuit is
    redrawn at each evaluation: every layer-0 and last-layer head a node, an edge exactly where
    the K-composition the server sent clears the random floor, the step it was read at moving
    on, nothing confirmed before the run's ablations; at the end its edges are the trained
    model's, confirmed by the run's own ablations, inside the viewport at a phone's width
    too."""
    import re

    import httpx

    from headlab.experiments import induction as ind

    context, page = watched_page(browser)
    page.goto(server + "/")
    page.wait_for_selector("#live-train")
    base = page.url.rstrip("/")
    knob = httpx.get(base + "/api/live").json()["knobs"]["threads"]
    offered = page.locator("#live-threads option").evaluate_all("os => os.map(o => o.value)")
    assert offered == [str(c["value"]) for c in knob["choices"]] and offered[:3] == [
        "auto",
        "1",
        "2",
    ]
    assert page.input_value("#live-threads") == "auto"
    page.fill("#live-seed", "0")
    page.click("#live-train")
    expect(page.locator("#live-status")).to_contain_text("torch thread", timeout=60_000)
    seen = wait_points(page, 2)
    watch_circuit(page)  # three evaluations' graphs
    wait_points(page, seen + 3)  # the curves grow while the run trains
    assert page.locator("#live-scores svg polyline").count() >= 8  # 4 induction + 4 prev-token
    phase = page.locator("#live-phase")
    expect(phase).to_have_attribute("data-state", "provisional", timeout=RUN_SECONDS)
    expect(phase).to_contain_text("Phase change so far: steps ")
    expect(phase).to_contain_text("may still move until the run ends")
    assert page.get_attribute("#live-verdict", "data-final") is None  # still training
    assert page.locator('#live-losses svg rect[fill="#E69F00"]').count() == 1  # window shaded
    page.wait_for_selector("#live-verdict-text", timeout=RUN_SECONDS)
    expect(phase).to_have_attribute("data-state", "final", timeout=60_000)
    assert "may still move" not in phase.inner_text() and "(final)" in phase.inner_text()
    status = page.locator("#live-status")
    expect(status).to_contain_text("finished", timeout=60_000)
    said = re.search(
        r"finished: (\d+) steps in (\d+\.\d) s on (\d+) torch threads? \((.+?)\)\.",
        status.inner_text(),
    )
    assert said, status.inner_text()
    threads = int(said[3])
    assert int(said[1]) == ind.LIVE.steps and float(said[2]) > 0
    # auto's reason, or the server's setting (a test worker fixes it to its share of the cores)
    assert said[4].startswith(("auto: load average ", "set by headlab serve --live-threads"))
    assert threads == int(page.get_attribute("#live-train-widget", "data-threads") or 0)
    assert page.locator("#live-patterns svg.heatmap").count() == 2
    n = ind.LIVE.seq_len  # the whole context in view: every query against every key, no window
    for heat in page.locator("#live-patterns svg.heatmap").all():
        assert heat.get_attribute("data-n") == str(n)
        assert heat.locator("rect[data-i]").count() == n * n
        assert heat.locator(".hv-map").count() == 0
    strokes = page.locator(
        "#live-losses svg g[data-series] polyline, #live-scores svg g[data-series] polyline"
    ).evaluate_all("ls => ls.map(l => getComputedStyle(l).stroke)")
    assert len(strokes) >= 3 + 8 + 1 and len(set(strokes)) == len(strokes), strokes
    shown = json.loads(page.get_attribute("#live-verdict", "data-final"))

    # `headlab experiment induction --quick --seed 0 --threads N`, N the threads the run used
    library, _, _ = induction_quick(threads)  # ind.run(quick=True, seed=0, threads=threads)
    assert library["config"] == asdict(ind.LIVE) and library["threads"] == threads
    assert shown["induction"] == library["final"]["induction"]
    assert shown["prev_token"] == library["final"]["prev_token"]
    assert shown["phase_change"]["window"] == library["phase_change"]["window"]
    assert library["verdict"]["circuit"]
    assert page.inner_text("#live-verdict-text") == library["verdict"]["text"]
    # the wall time to the window's end, as the server measured it for this run
    assert shown["seconds"] > 0
    assert f"over {shown['seconds']:.1f} s after training started" in phase.inner_text()

    # the circuit at the end: the trained model's edges, confirmed by the run's ablations
    graph = page.locator("#live-circuit-graph")
    expect(page.locator("#live-circuit-note")).to_contain_text("confirmed by the run's ablation")
    page.set_viewport_size({"width": PHONE, "height": 900})
    graph.scroll_into_view_if_needed()
    b = graph.bounding_box()
    assert b is not None and b["x"] >= 0 and b["x"] + b["width"] <= PHONE + 0.5, b
    assert serious(Axe().run(page, context="#live-circuit").response) == []
    drawn = {
        ln.get_attribute("data-edge"): (
            float(ln.get_attribute("data-k")),
            ln.get_attribute("data-confirmed"),
        )
        for ln in graph.locator("[data-edge]").all()
    }
    assert_final_circuit(drawn, threads, induction_quick)
    errors = list(page.errors)
    context.close()
    assert errors == []
    assert not [t for t in threading.enumerate() if t.name.startswith("live-")]


def watch_circuit(page) -> None:
    """Until the live circuit has been drawn at three evaluation steps: at each, every edge's
    K-composition at least the floor drawn with it, a node for every head of layer 0 and of the
    last layer, and no edge confirmed (the run's ablations come at its end)."""
    graph = page.locator("#live-circuit-graph")
    box = page.locator("#live-circuit")
    expect(graph).to_have_count(1, timeout=RUN_SECONDS)
    steps = [int(box.get_attribute("data-step"))]
    deadline = time.monotonic() + RUN_SECONDS / 1000
    while len(steps) < 3:
        assert time.monotonic() < deadline, f"the circuit stayed at steps {steps}"
        step = int(box.get_attribute("data-step") or 0)
        if step != steps[-1]:
            steps.append(step)
            floor = float(graph.get_attribute("data-floor"))
            ks = graph.locator("[data-edge]").evaluate_all("ls => ls.map(l => l.dataset.k)")
            assert all(float(k) >= floor for k in ks), (ks, floor)
            if page.locator("#live-heads").count():
                assert graph.locator("[data-node]").count() == 2 * int(
                    page.input_value("#live-heads")
                )
            assert graph.locator('[data-confirmed="true"]').count() == 0
        page.wait_for_timeout(200)
    assert steps == sorted(steps)


def test_bad_knob_and_cancel_from_the_page(live_page) -> None:
    page = live_page
    page.fill("#live-seed", "-3")
    page.click("#live-train")
    expect(page.locator("#live-status")).to_contain_text("Not started: seed", timeout=30_000)
    page.fill("#live-seed", "5")
    page.select_option("#live-layers", "1")
    page.select_option("#live-threads", "1")
    page.click("#live-train")
    expect(page.locator("#live-status")).to_contain_text("on 1 torch thread (as picked)")
    wait_points(page, 1)
    page.click("#live-cancel")
    status = page.locator("#live-status")
    expect(status).to_contain_text("stopped: cancelled, after ", timeout=60_000)
    expect(status).to_contain_text("steps in ")
    expect(status).to_contain_text(" s on 1 torch thread (as picked).")
    expect(page.locator("#live-train")).to_be_enabled()
    # the one error is the browser's own log line for the refused request
    assert [e for e in page.errors if "status of 422" not in e] == []


# every text of the svgs under a selector: the box it is in, its words, and its rendered size in
# CSS px: its computed font size times the scale its svg is drawn at (drawn width / viewBox width)
RENDERED = """sel => [...document.querySelectorAll(sel)].flatMap(box => [...box.querySelectorAll(
  'svg text')].filter(t => t.getBoundingClientRect().width).map(t => {
    const svg = t.ownerSVGElement, view = svg.viewBox.baseVal;
    const scale = view && view.width ? svg.getBoundingClientRect().width / view.width : 1;
    const px = parseFloat(getComputedStyle(t).fontSize) * scale;
    return [box.id || box.dataset.figure, t.textContent, Math.round(px * 10) / 10]; }))"""
LEGIBLE = 11  # CSS px


@pytest.mark.parametrize("width", [1280, PHONE])
def test_the_training_charts_read_at_any_width(browser, server: str, width: int) -> None:
    """The live training charts and the stored run's phase-change charts, on a desktop and a
    phone: every axis, tick and title is drawn at 11 CSS px or more once the svg is scaled to
    its box (the live charts were drawn 640 wide and shrunk on a phone to 6 px type), and no
    chart is wider than the screen. A setting changed after the run started marks the charts
    as that run's, not the new setting's."""
    context, page = watched_page(browser, width)
    try:
        page.goto(server + "/")
        page.wait_for_selector("#live-train")
        stored = page.locator('[data-experiment="induction"]')
        stored.scroll_into_view_if_needed()
        expect(stored.locator("figure svg").first).to_be_visible(timeout=60_000)
        stored.locator("details").evaluate_all("ds => ds.forEach(d => { d.open = true; })")
        page.fill("#live-seed", "0")
        page.click("#live-train")
        wait_points(page, 3)  # the loss and score charts drawn with three evaluations
        drawn = page.evaluate(RENDERED, "#live-losses, #live-scores")
        drawn += page.evaluate(RENDERED, '[data-experiment="induction"] figure')
        charts = {box for box, _, _ in drawn}
        assert {"live-losses", "live-scores", "induction-losses", "induction-scores"} <= charts
        small = [d for d in drawn if d[2] < LEGIBLE]
        assert small == [], small[:10]
        for svg in page.locator("#live-losses svg, #live-scores svg").all():
            box = svg.bounding_box()
            assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= width + 0.5

        expect(page.locator("#live-stale")).to_be_hidden()
        page.fill("#live-seed", "1")
        expect(page.locator("#live-stale")).to_contain_text("press Train")
        expect(page.locator("#live-results")).to_have_class("stale")
        page.click("#live-cancel")
        expect(page.locator("#live-status")).to_contain_text("stopped", timeout=60_000)
        assert page.errors == []
    finally:
        context.close()


def assert_final_circuit(drawn: dict[str, tuple[float, str]], threads: int, quick) -> None:
    """The live run's last graph against the same recipe trained here on as many threads: an
    edge wherever the trained model's K-composition (layer 0 → last layer) clears the floor,
    confirmed where a feeder head meets a head labelled induction. When the page's recipe is
    the quick run's, that run's 2-layer study (``quick``: conftest's ``induction_quick``) is
    the one trained here."""
    from headlab.experiments import induction as ind
    from headlab.files import torch_threads
    from headlab.heads.composition import composition_scores
    from headlab.server.live import Knobs

    knobs = Knobs()
    if (knobs.config(), knobs.n_layers) == (ind.QUICK, 2):
        r = quick(threads)[2]  # ind.study(ind.QUICK, 2, 0) on ``threads``, inside run_seed
    else:
        with torch_threads(threads):
            r = ind.study(knobs.config(), knobs.n_layers, 0)
    assert r is not None
    found = composition_scores(r["_model"])
    last = knobs.n_layers - 1
    k, floor = found.scores["k"][0, :, last, :], found.floor("k")
    feeders = {f["head"] for f in r.get("feeder_heads", [])}
    want = {
        f"0.{i}-{last}.{j}": (
            round(float(k[i, j]), 4),
            str(f"0.{i}" in feeders and f"{last}.{j}" in r["induction_heads"]).lower(),
        )
        for i in range(k.shape[0])
        for j in range(k.shape[1])
        if float(k[i, j]) >= floor
    }
    assert want, "the trained model has no edge above the floor: nothing to compare"
    assert drawn.keys() == want.keys()
    for edge, (score, confirmed) in want.items():
        assert drawn[edge][0] == pytest.approx(score, abs=1e-4) and drawn[edge][1] == confirmed, (
            edge
        )
    assert "true" in {c for _, c in want.values()}, "no edge confirmed: the circuit did not form"
