"""The explainer as a learner meets it, in the same headless Chromium as test_browser.py: the
shape widget's cards say what the API says, the layer diagram follows the sizes, the head view's
labels stay readable, and the page passes axe-core.

The run's one server and browser (conftest.py) serve the whole module; most tests share one
loaded page (each sets the inputs it reads), so the model runs a few times, not once per test.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

import pytest
import test_browser
from playwright.sync_api import expect

from conftest import watched_page

pytestmark = [pytest.mark.browser, pytest.mark.slow]
# a shared CI machine can take seconds over one answer; waiting longer costs nothing when it is fast
expect.set_options(timeout=30_000)


def watch(pg, base: str) -> list[str]:
    """Collect console errors, page errors and any request that leaves ``base``."""
    errors: list[str] = []
    pg.on("console", lambda m: m.type == "error" and errors.append(f"console: {m.text}"))
    pg.on("pageerror", lambda e: errors.append(f"pageerror: {e}"))
    pg.on(
        "request",
        lambda r: (
            r.url.startswith((base, "data:", "blob:"))
            or errors.append(f"request left the server: {r.url}")
        ),
    )
    return errors


@pytest.fixture(scope="module")
def learner(browser, server: str) -> Iterator[object]:
    """One page at 1280 px, loaded once, with the head widget's first run drawn."""
    test_browser._model_name()
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    pg = context.new_page()
    pg.errors = watch(pg, server)
    pg.set_default_timeout(30_000)
    pg.goto(server + "/")
    pg.wait_for_selector("#shapes-table")
    pg.wait_for_selector("#heads-grid button", timeout=60_000)
    yield pg
    context.close()


def shapes(pg, **fields: str) -> None:
    """Type sizes into the shape widget (bias: "on"/"off") and wait for the answer."""
    for key, value in fields.items():
        if key == "bias":
            pg.set_checked("#shapes-bias", value == "on")
        else:
            pg.fill(f"#shapes-{key}", value)
    if "n_heads" in fields:  # the table's query row shows h once the answer is drawn
        # (wait_for_function: an expect() that starts while the table is absent can miss it)
        pg.wait_for_function(
            """h => [...document.querySelectorAll('#shapes-table tr[data-stage="q"] td.shape')]
                   .some(td => td.textContent.includes(`, ${h}, `))""",
            arg=fields["n_heads"],
        )


def kv_card(pg) -> str:
    return pg.inner_text("#shapes-kv span")


# --- point 7: the shape widget's bugs -------------------------------------------------------


def test_kv_card_states_the_apis_ratio(learner) -> None:
    """The card's "N× smaller than MHA" is the API's own ratio_vs_mha (was "0×" for GQA)."""
    from fastapi.testclient import TestClient

    from headlab.server import create_app

    with TestClient(create_app(preload=())) as client:
        body = {"d_model": 512, "n_heads": 8, "n_kv_heads": 2, "seq_len": 10, "batch": 2}
        ratio = client.post("/api/shapes", json=body).json()["kv_cache"]["ratio_vs_mha"]
    assert ratio == 4.0
    learner.select_option("#shapes-preset", "")
    shapes(learner, d_model="512", n_kv_heads="2", seq_len="10", batch="2", n_heads="8")
    expect(learner.locator("#shapes-kv span")).to_contain_text("4× smaller than MHA")
    shapes(learner, n_kv_heads="")  # MHA: nothing to compare with
    expect(learner.locator("#shapes-kv span")).not_to_contain_text("smaller")
    assert learner.errors == []


def test_llama3_preset_kv_card(learner) -> None:
    options = learner.locator("#shapes-preset option").all_text_contents()
    llama = next((o for o in options if "Llama" in o and "3" in o), None)
    assert llama is not None, options
    learner.select_option("#shapes-preset", label=llama)
    expect(learner.locator("#shapes-n_kv_heads")).to_have_value("8")
    h = learner.input_value("#shapes-n_heads")
    expect(learner.locator("#shapes-kv span")).to_contain_text(f"{int(h) // 8}× smaller than MHA")
    learner.select_option("#shapes-preset", "")
    assert learner.errors == []


def test_parameter_card_follows_the_bias_box(learner) -> None:
    shapes(learner, d_model="512", n_kv_heads="", n_heads="8", bias="on")
    expect(learner.locator("#shapes-params-total b")).to_have_text("1,050,624")
    expect(learner.locator("#shapes-params-total span")).to_contain_text("with biases")
    shapes(learner, bias="off")
    expect(learner.locator("#shapes-params-total b")).to_have_text(f"{4 * 512 * 512:,}")
    expect(learner.locator("#shapes-params-total span")).to_contain_text("no biases")
    shapes(learner, bias="on")
    assert learner.errors == []


def test_bad_kv_heads_offer_only_kv_choices(learner) -> None:
    """h_kv = 3 with a valid h = 8: the key/value chips, not d_model's head counts."""
    shapes(learner, d_model="512", n_heads="8", n_kv_heads="3")
    expect(learner.locator("#shapes-valid-kv-heads button")).to_have_text(["1", "2", "4", "8"])
    assert learner.locator("#shapes-valid-heads").count() == 0
    shapes(learner, n_kv_heads="")
    learner.wait_for_selector("#shapes-table")
    assert learner.errors == []


def test_text_box_hides_while_the_model_reads_random_tokens(learner) -> None:
    box = learner.locator("#heads-text")
    ran = lambda r: r.url.endswith("/api/heads")  # noqa: E731
    with learner.expect_response(ran, timeout=60_000):
        learner.select_option("#heads-probe", "random-repeat")
    expect(box).to_be_hidden()
    with learner.expect_response(ran, timeout=60_000):
        learner.select_option("#heads-probe", "text")
    expect(box).to_be_visible()
    expect(box).to_be_enabled()
    assert learner.errors == []


# --- point 1: the layer, drawn ----------------------------------------------------------------


def row_texts(pg, step: str) -> list[str]:
    """The text lines of one diagram row (its title, then one line per shape)."""
    return pg.eval_on_selector(
        f'#layer-diagram .dg-row[data-step="{step}"]',
        "g => [...g.querySelectorAll('text')].map(t => t.textContent)",
    )


def sizes(pg, d_model: int, h: int, h_kv: int, n: int, B: int) -> None:
    shapes(pg, d_model=str(d_model), n_kv_heads=str(h_kv), seq_len=str(n), batch=str(B))
    shapes(pg, n_heads=str(h))
    d_k = d_model // h
    expect(pg.locator("#layer-diagram")).to_contain_text(f"({B}, {h}, {n}, {d_k})")


@pytest.mark.parametrize(
    ("d_model", "h", "h_kv", "n", "B", "lanes", "kv_boxes"),
    [
        (512, 8, 2, 10, 2, 8, 2),  # GQA: all 8 heads drawn, 2 key/value boxes of 4 heads each
        (768, 12, 12, 7, 1, 8, 8),  # MHA: 8 lanes and "+4", one key/value box per query head
        (256, 16, 1, 5, 3, 7, 1),  # MQA: 7 lanes and "+9", one key/value box over all of them
    ],
)
def test_diagram_labels_follow_the_widget(learner, d_model, h, h_kv, n, B, lanes, kv_boxes) -> None:
    """Every row shows the live shape, computed here by hand from the sizes typed in."""
    sizes(learner, d_model, h, h_kv, n, B)
    d_k = d_model // h
    kv = "h" if h_kv == h else "h_kv"  # the table writes MHA's key heads as h
    assert f"B×n×d_model = ({B}, {n}, {d_model})" in row_texts(learner, "x")
    assert f"K: B×n×{kv}·d_k = ({B}, {n}, {h_kv * d_k})" in row_texts(learner, "project")
    split = row_texts(learner, "split")
    assert f"Q: B×h×n×d_k = ({B}, {h}, {n}, {d_k})" in split
    assert f"K: B×{kv}×n×d_k = ({B}, {h_kv}, {n}, {d_k})" in split
    assert f"B×h×n×n = ({B}, {h}, {n}, {n})" in row_texts(learner, "scores")
    assert f"B×n×h·d_k = ({B}, {n}, {d_model})" in row_texts(learner, "concat")
    # one coloured query box per head drawn (at most 8 lanes), key/value boxes spanning groups
    drawn = learner.locator('#layer-diagram .dg-row[data-step="split"] rect[data-head]').count()
    keys = learner.locator("#layer-diagram rect.dg-k")
    assert (drawn, keys.count()) == (lanes, kv_boxes)
    served = {keys.nth(k).get_attribute("data-serves") for k in range(keys.count())}
    assert served == {str(h // h_kv)}
    more = learner.locator('#layer-diagram .dg-row[data-step="split"] .dg-more')
    assert more.all_text_contents() == ([f"+{h - lanes}"] if h > lanes else [])
    assert learner.errors == []


def test_stepping_marks_the_stage_its_table_rows_and_its_code(learner) -> None:
    sizes(learner, 512, 8, 2, 10, 2)
    learner.locator("#layer-diagram svg").focus()
    learner.keyboard.press("Home")
    expect(learner.locator("#layer-step")).to_contain_text("Step 1 of 9")
    learner.click("#layer-next")
    expect(learner.locator("#layer-step")).to_contain_text("Step 2 of 9")
    current = learner.locator("#shapes-table tr.current")
    expect(current).to_have_count(3)
    stages = [current.nth(k).get_attribute("data-stage") for k in range(3)]
    assert stages == ["q_proj", "k_proj", "v_proj"]
    assert learner.locator("#layer-diagram .dg-row.current").get_attribute("data-step") == "project"
    expect(learner.locator("#layer-code .hl").nth(1)).to_contain_text("self.W_Q(x)")
    learner.locator("#layer-diagram svg").focus()  # the keyboard steps too
    for key, step, stage, code in (
        ("ArrowDown", "split", "q", "split_heads("),
        ("ArrowRight", "scores", "scores", "k.transpose"),
        ("End", "residual", None, "x + a"),
    ):
        learner.keyboard.press(key)
        row = learner.locator("#layer-diagram .dg-row.current")
        expect(row).to_have_attribute("data-step", step)
        expect(learner.locator("#layer-code")).to_contain_text(code)
        highlighted = " ".join(learner.locator("#layer-code .hl").all_inner_texts())
        assert code in highlighted, (key, highlighted)
        if stage:
            expect(
                learner.locator(f'#shapes-table tr.current[data-stage="{stage}"]')
            ).to_have_count(1)
    expect(learner.locator("#layer-next")).to_be_disabled()
    learner.fill("#shapes-n_heads", "16")  # a redraw keeps the step
    expect(learner.locator("#layer-diagram")).to_contain_text("(2, 16, 10, 32)")
    expect(learner.locator("#layer-diagram .dg-row.current")).to_have_attribute(
        "data-step", "residual"
    )
    assert learner.errors == []


# --- point 2: a head view a learner can read ----------------------------------------------------


def synthetic(n: int, seed: int = 0) -> tuple[list[list[float]], list[str]]:
    """A causal head on n tokens (rows sum to 1) and token labels of mixed lengths."""
    import numpy as np

    rng = np.random.default_rng(seed)
    logits = rng.normal(0, 3, (n, n))
    logits[np.triu_indices(n, 1)] = -np.inf
    w = np.exp(logits - logits.max(axis=1, keepdims=True))
    w /= w.sum(axis=1, keepdims=True)
    tokens = [f" word{k}" if k % 3 else f"a_much_longer_token_{k}" for k in range(n)]
    return w.round(4).tolist(), tokens


MOUNT = """async ([weights, tokens, id]) => {
  const f = await import('/static/js/figures.js');
  const { figure } = await import('/static/js/export.js');
  document.getElementById(id)?.remove();
  const readout = Object.assign(document.createElement('p'), { id: id + '-readout' });
  const pair = Object.assign(document.createElement('div'), { className: 'pair' });
  pair.append(figure(f.heatmap(weights, tokens, { title: 'one head', readout }), { name: 'a' }),
              figure(f.heatmap(weights, tokens, { title: 'its twin', readout }), { name: 'b' }));
  const two = f.twoColumn(weights, tokens, { title: 'lines', readout });
  const lines = figure(two, { name: 'c', scroll: true });
  const box = Object.assign(document.createElement('div'), { id });
  box.append(readout, pair, lines);
  document.querySelector('#heads-widget .widget-box').append(box);
}"""

# every token label of every head-view svg in a box: its drawn font size and its box on screen
LABELS = """id => [...document.querySelectorAll(`#${id} svg`)].map(svg => {
  const scale = svg.getScreenCTM().a;
  return [...svg.querySelectorAll('text.hv-tok')].filter(t => t.textContent).map(t => {
    const r = t.getBoundingClientRect();
    const px = parseFloat(t.getAttribute('font-size')) * scale;
    return { px, box: [r.left, r.top, r.right, r.bottom] };
  });
})"""


def overlaps(boxes: list[list[float]]) -> list[tuple[int, int]]:
    """Pairs of label boxes that overlap by more than half a pixel both ways."""
    found = []
    for a in range(len(boxes)):
        for b in range(a + 1, len(boxes)):
            (l1, t1, r1, b1), (l2, t2, r2, b2) = boxes[a], boxes[b]
            if min(r1, r2) - max(l1, l2) > 0.5 and min(b1, b2) - max(t1, t2) > 0.5:
                found.append((a, b))
    return found


@pytest.mark.parametrize("n", [64, 128])
def test_labels_are_readable_and_never_overlap(learner, n: int) -> None:
    weights, tokens = synthetic(n)
    box = f"probe-{n}"
    learner.evaluate(MOUNT, [weights, tokens, box])
    per_svg = learner.evaluate(LABELS, box)
    assert len(per_svg) == 3  # two heatmaps and the two-column view
    for labels in per_svg:
        assert labels, "no token labels drawn"
        assert min(lab["px"] for lab in labels) >= 11
        assert overlaps([lab["box"] for lab in labels]) == []
    # the heatmap shows a window of 22 × 22 readable cells, not n × n shrunken ones
    heat = learner.locator(f"#{box} svg.heatmap").first
    assert heat.get_attribute("data-n") == str(n)
    assert heat.locator("rect.hv-cell").count() == 22 * 22
    # the two-column view keeps every token and scrolls instead
    assert learner.locator(f"#{box} svg.two-column text.hv-left").count() == n
    scroller = learner.locator(f"#{box} .hv-scroll")
    inner, outer = scroller.evaluate("e => [e.scrollHeight, e.clientHeight]")
    assert inner > outer
    assert learner.errors == []


def test_heatmap_hover_names_both_tokens_and_the_weight(learner) -> None:
    weights, tokens = synthetic(64, seed=1)
    learner.evaluate(MOUNT, [weights, tokens, "probe-hover"])
    heat = learner.locator("#probe-hover svg.heatmap").first
    i, j = 9, 4
    heat.locator(f'rect[data-i="{i}"][data-j="{j}"]').hover()
    readout = learner.locator("#probe-hover-readout")
    expect(readout).to_have_text(
        f"query {i} “{tokens[i]}” → key {j} “{tokens[j]}”: {weights[i][j]:.4f}"
    )
    on = heat.locator("text.hv-tok.on")
    assert on.count() == 2  # its row's token and its column's token
    assert {on.nth(k).get_attribute("data-k") for k in range(2)} == {str(i), str(j)}
    bands = heat.evaluate(
        "s => [...s.querySelectorAll('rect.hv-band')].map(r => r.getAttribute('visibility'))"
    )
    assert bands == ["visible"] * 3  # row band, column band, the cell's outline
    heat.locator('text.hv-row[data-k="5"]').hover()  # a token: its row and its column
    best = max(range(64), key=lambda k: weights[5][k])
    expect(readout).to_contain_text(f"token 5 “{tokens[5]}”")
    expect(readout).to_contain_text(f"most at {best} “{tokens[best]}”")
    assert learner.errors == []


def test_brush_moves_both_heatmaps_by_pointer_and_keyboard(learner) -> None:
    weights, tokens = synthetic(128, seed=2)
    learner.evaluate(MOUNT, [weights, tokens, "probe-brush"])
    heats = learner.locator("#probe-brush svg.heatmap")
    hit = heats.first.locator(".hv-map-hit")
    hit.scroll_into_view_if_needed()
    bb = hit.bounding_box()
    learner.mouse.click(bb["x"] + bb["width"] - 2, bb["y"] + bb["height"] - 2)
    for k in range(2):  # the twin follows
        expect(heats.nth(k)).to_contain_text("queries 106–127, keys 106–127 of 128")
    cell = heats.nth(1).locator('rect[data-i="127"][data-j="106"]')
    assert cell.get_attribute("fill") == learner.evaluate(
        "async w => (await import('/static/js/colour.js')).viridis(w)", weights[127][106]
    )
    heats.first.focus()  # the keyboard pans the window as the cursor leaves it
    for _ in range(3):
        learner.keyboard.press("Shift+ArrowLeft")
    expect(heats.first).to_contain_text("keys 82–103")
    expect(heats.nth(1)).to_contain_text("keys 82–103")
    assert learner.errors == []


def test_two_column_hover_shows_only_that_tokens_lines(learner) -> None:
    weights, tokens = synthetic(40, seed=3)
    learner.evaluate(MOUNT, [weights, tokens, "probe-two"])
    two = learner.locator("#probe-two svg.two-column")
    shown = """s => [...s.querySelectorAll('line.hv-line')]
        .filter(l => getComputedStyle(l).display !== 'none')
        .map(l => [+l.dataset.i, +l.dataset.j])"""
    everything = two.evaluate(shown)
    assert len(everything) == sum(w >= 0.02 for row in weights for w in row)
    q = 30
    two.locator(f'text.hv-left[data-k="{q}"]').hover()
    lines = two.evaluate(shown)
    assert sorted(j for i, j in lines if i == q) == [
        j for j, w in enumerate(weights[q]) if w >= 0.02
    ]
    assert all(i == q for i, _ in lines)
    best = max(range(40), key=lambda k: weights[q][k])
    expect(learner.locator("#probe-two-readout")).to_contain_text(f"most at {best}")
    value = two.locator("text.hv-value").nth(best)
    assert value.text_content() == f"{weights[q][best]:.2f}"
    key = 12
    two.locator(f'text.hv-right[data-k="{key}"]').hover()
    lines = two.evaluate(shown)
    assert sorted(i for i, _ in lines) == [i for i in range(40) if weights[i][key] >= 0.02]
    assert all(j == key for _, j in lines)
    learner.mouse.move(0, 0)  # the pointer leaves: every line again
    assert len(two.evaluate(shown)) == len(everything)
    two.focus()  # the keyboard walks the queries; Escape shows every line again
    learner.keyboard.press("ArrowDown")
    assert {i for i, _ in two.evaluate(shown)} == {0}
    learner.keyboard.press("ArrowDown")
    assert {i for i, _ in two.evaluate(shown)} == {1}
    learner.keyboard.press("Escape")
    assert len(two.evaluate(shown)) == len(everything)
    assert learner.errors == []


def test_head_widget_draws_the_two_column_view(learner) -> None:
    assert learner.locator("#heads-view svg.two-column").count() == 1
    assert learner.locator("#heads-view path").count() == 0  # the arcs are gone
    left = learner.locator("#heads-view svg.two-column text.hv-left")
    assert left.count() == int(
        learner.locator("#heads-view svg.heatmap").first.get_attribute("data-n")
    )
    left.nth(3).hover()
    expect(learner.locator("#heads-readout")).to_contain_text("token 3")
    assert learner.errors == []


# --- points 4 and 5: in notebooks, and one offline file -----------------------------------------


def offline_page(browser, url: str):
    """A page that records every request but the file itself and any script error."""
    context, pg = watched_page(browser)
    pg.on(
        "request",
        lambda r: (
            r.url in (url,) or r.url.startswith("data:") or pg.errors.append(f"request: {r.url}")
        ),
    )
    pg.goto(url)
    return context, pg


def test_offline_file_from_the_cli_works_from_file_url(browser, tmp_path) -> None:
    """headlab heads --html writes one file; opened from file:// it draws the head view and the
    grid, asks for nothing, and answers hover, clicks and keys."""
    from typer.testing import CliRunner

    from headlab.cli import app

    test_browser._model_name()  # skips (fails under CI) without a model
    text = "The cat sat on the mat. The cat sat on the mat."
    out = tmp_path / "heads.html"
    result = CliRunner().invoke(app, ["heads", "--text", text, "--html", str(out), "--json"])
    assert result.exit_code == 0, result.output
    scores = json.loads(result.stdout)
    n_heads = len(scores["heads"])
    context, pg = offline_page(browser, out.as_uri())
    grid = pg.locator(".hv-grid button[data-head]")
    expect(grid).to_have_count(n_heads)
    heat = pg.locator(".hv-detail svg.heatmap")
    expect(heat).to_have_count(2)
    assert heat.first.get_attribute("data-n") == str(len(scores["tokens"]))
    last = scores["heads"][-1]
    grid.last.click()
    expect(grid.last).to_have_attribute("aria-pressed", "true")
    expect(pg.locator(".hv-about")).to_contain_text(
        f"head {last['layer']}.{last['head']}: {last['label']}"
    )
    pg.locator(".hv-detail svg.two-column text.hv-left").nth(2).hover()
    expect(pg.locator(".hv-readout")).to_contain_text("token 2")
    pg.locator(".hv-controls select").focus()  # the keyboard picks a head too
    pg.keyboard.press("Home")
    first = scores["heads"][0]
    expect(pg.locator(".hv-about")).to_contain_text(f"head {first['layer']}.{first['head']}:")
    assert pg.errors == []
    context.close()


def test_notebook_outputs_render_with_no_network(browser, tmp_path) -> None:
    """A notebook executed by nbclient (an ipykernel) returns HTML outputs for a head view and a
    shapes report; put in a page as a notebook front end puts them, they draw offline."""
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    test_browser._model_name()
    nb = nbformat.v4.new_notebook()
    setup = """from headlab import zoo
from headlab.heads import analyse
from headlab.measure import build_probe
from headlab.show import show
from headlab.shapes import trace_shapes
model, tok = zoo.load("default")
probe = build_probe("random-repeat", tok, 64, model.config.vocab_size)
report = analyse(model, probe)
print(len(report.tokens), len(report.heads))"""
    nb.cells = [
        nbformat.v4.new_code_cell(setup),
        nbformat.v4.new_code_cell("show(report, model='default', grid=True)"),
        nbformat.v4.new_code_cell(
            "show(trace_shapes(d_model=512, n_heads=8, n_kv_heads=2, seq_len=10, batch=2))"
        ),
    ]
    nbclient.NotebookClient(nb, timeout=600, kernel_name="python3").execute()
    n_tokens, n_heads = map(int, nb.cells[0].outputs[0]["text"].split())
    htmls = []
    for cell in nb.cells[1:]:
        outputs = [o for o in cell.outputs if o.get("output_type") == "execute_result"]
        assert len(outputs) == 1, cell.outputs
        data = outputs[0]["data"]
        assert "text/html" in data and 'class="headlab-view"' in data["text/html"]
        htmls.append(data["text/html"])
    page = tmp_path / "notebook.html"
    page.write_text("<!doctype html><meta charset='utf-8'><body>" + "\n".join(htmls), "utf-8")
    context, pg = offline_page(browser, page.as_uri())
    expect(pg.locator(".headlab-view")).to_have_count(2)
    expect(pg.locator(".hv-grid button[data-head]")).to_have_count(n_heads)
    expect(pg.locator(".hv-detail svg.heatmap").first).to_have_attribute("data-n", str(n_tokens))
    diagram = pg.locator(".headlab-view .layer")
    expect(diagram.locator(".dg-row")).to_have_count(9)
    expect(diagram).to_contain_text("Q: B×h×n×d_k = (2, 8, 10, 64)")
    diagram.locator("button", has_text="Next").click()
    expect(pg.locator(".headlab-view tr.current")).to_have_count(3)  # the projections' rows
    expect(pg.locator(".headlab-view pre.dg-code .hl").nth(1)).to_contain_text("self.W_Q(x)")
    assert pg.errors == []
    context.close()


# --- point 6: accessible --------------------------------------------------------------------

OKABE_ITO = {"#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000", "#F0E442"}


def serious(results: dict) -> list[str]:
    """axe-core's serious and critical violations, one line each."""
    return [
        f"{v['impact']} {v['id']}: {v['help']} at {[n['target'] for n in v['nodes'][:3]]}"
        for v in results["violations"]
        if v["impact"] in ("serious", "critical")
    ]


def test_axe_finds_nothing_serious_on_the_page(learner) -> None:
    from axe_playwright_python.sync_playwright import Axe

    learner.wait_for_selector("#params-presets")
    for name in ("one-vs-many", "induction", "prune", "gqa", "head-count"):
        test_browser.reveal(learner, name)
    results = Axe().run(learner).response
    assert results["passes"], "axe ran no checks"
    assert serious(results) == []
    assert learner.errors == []


def test_axe_finds_nothing_serious_in_the_offline_views(browser, tmp_path) -> None:
    from axe_playwright_python.sync_playwright import Axe

    from headlab import show
    from headlab.shapes import trace_shapes

    report = trace_shapes(d_model=256, n_heads=8, n_kv_heads=4, seq_len=6, batch=1)
    path = show.show(report).save(tmp_path / "shapes.html", "shapes")
    context, pg = offline_page(browser, path.as_uri())
    pg.wait_for_selector(".headlab-view .dg-row")
    assert serious(Axe().run(pg).response) == []
    assert pg.errors == []
    context.close()


def tab_order(pg, start: str, stop: str, limit: int = 40) -> list[str]:
    """Ids (or tag.class) of what Tab focuses, from ``start`` until ``stop`` is reached."""
    pg.focus(start)
    seen = []
    for _ in range(limit):
        pg.keyboard.press("Tab")
        here = pg.evaluate(
            "() => { const e = document.activeElement;"
            " return e.id || `${e.tagName.toLowerCase()}.${e.getAttribute('class') || ''}`; }"
        )
        seen.append(here)
        if here == stop:
            break
    return seen


def test_every_control_works_from_the_keyboard(learner) -> None:
    shapes(learner, d_model="512", n_kv_heads="", seq_len="10", batch="2", n_heads="8")
    learner.locator("#layer-diagram svg").focus()
    learner.keyboard.press("Home")  # step 1, where "Next" is enabled
    order = tab_order(learner, "#shapes-preset", "layer-code")
    for control in ("shapes-d_model", "shapes-n_heads", "shapes-bias", "layer-next", "layer-code"):
        assert control in order, order
    assert "svg.layer-diagram readable" in order  # the diagram itself takes the arrow keys
    learner.focus("#layer-next")
    learner.keyboard.press("Enter")
    step = learner.inner_text("#layer-step")
    learner.keyboard.press("Enter")
    assert learner.inner_text("#layer-step") != step
    order = tab_order(learner, "#heads-model", "heads-run")
    for control in ("heads-type", "heads-which", "heads-probe", "heads-text", "heads-run"):
        assert control in order, order
    # the figures: a heatmap, the two-column view and a grid button answer keys
    heat = learner.locator("#heads-view svg.heatmap").first
    heat.focus()
    learner.keyboard.press("ArrowRight")
    before = learner.inner_text("#heads-readout")
    learner.keyboard.press("ArrowUp")
    assert learner.inner_text("#heads-readout") != before
    two = learner.locator("#heads-view svg.two-column")
    learner.mouse.move(0, 0)  # a pointer resting on a token would pick it as the page scrolls
    two.focus()
    learner.keyboard.press("ArrowDown")
    expect(learner.locator("#heads-readout")).to_contain_text("token 0")
    button = learner.locator("#heads-grid button").nth(1)
    button.focus()
    learner.keyboard.press("Enter")
    expect(learner.locator("#heads-grid button").nth(1)).to_have_attribute("aria-pressed", "true")
    code = learner.locator("button[data-code]").first  # the code dialog opens and closes by key
    code.focus()
    learner.keyboard.press("Enter")
    expect(learner.locator("#code-dialog")).to_be_visible()
    learner.keyboard.press("Escape")
    expect(learner.locator("#code-dialog")).to_be_hidden()
    assert learner.errors == []


def test_colour_scales_are_colour_blind_safe(learner) -> None:
    """Weights in viridis (its published end points), heads in Okabe–Ito's eight colours."""
    weights = [[1.0, 0.0], [0.0, 1.0]]
    fills = learner.evaluate(
        """async w => { const f = await import('/static/js/figures.js');
           return [...f.heatmap(w, ['a', 'b']).querySelectorAll('rect.hv-cell')]
             .map(r => r.getAttribute('fill')); }""",
        weights,
    )
    assert fills == ["rgb(253,231,37)", "rgb(68,1,84)", "rgb(68,1,84)", "rgb(253,231,37)"]
    shapes(learner, d_model="512", n_kv_heads="2", seq_len="10", batch="2", n_heads="8")
    heads = learner.locator('#layer-diagram .dg-row[data-step="split"] rect[data-head]')
    colours = {heads.nth(k).get_attribute("fill") for k in range(heads.count())}
    assert colours == OKABE_ITO


# --- point 3: the story first ---------------------------------------------------------------

LIVE = (
    "shapes-widget",
    "cost-compare",
    "params-table",
    "heads-widget",
    "live-train-widget",
    "kv-compare",
    "label-summary",
)


def test_each_section_opens_with_one_claim_then_its_figure(learner) -> None:
    sections = learner.evaluate(
        """() => [...document.querySelectorAll('main > section')].map(sec => {
             const kids = [...sec.children];
             const claim = kids[1];
             const next = kids.slice(2).find(e => !e.matches('.provenance, p.note'));
             return { id: sec.id, first: claim.className, claim: claim.textContent.trim(),
                      next: next ? (next.id || next.className || next.tagName) : '' };
           })"""
    )
    assert len(sections) == 12
    for sec in sections:
        assert sec["first"] == "claim", sec
        claim = " ".join(sec["claim"].split())
        assert claim.endswith(".") and not re.search(r"[.!?;:]\s+[A-Z]", claim[:-1]), claim
        # caveats pair each figure with its own h3; the glossary is a list of words
        if sec["id"] not in ("caveats", "next", "glossary"):
            assert sec["next"] in ("experiment", "live", "math", *LIVE), sec


def test_figures_say_whether_they_are_live_or_stored(learner) -> None:
    from headlab.server.routes.experiments import PAGE_EXPERIMENTS, shipped

    lede = learner.inner_text(".lede")
    assert "stored" in lede and "Every figure" not in lede
    assert "computed now" in learner.inner_text("#server-status")
    for name in LIVE:
        # the marker is the nearest thing before the figure, bar a line on how to use it
        marker = learner.locator(f"#{name}").locator(
            "xpath=preceding-sibling::*[not(contains(@class, 'note'))][1]"
        )
        assert marker.get_attribute("data-provenance") == "live", name
        # (text_content: §9's live tables sit in closed folds, their markers with them)
        assert "computed now by headlab" in marker.text_content()
    files = shipped()
    experiments = learner.locator(".experiment[data-experiment]")
    assert experiments.count() == len(PAGE_EXPERIMENTS)
    for k in range(experiments.count()):
        el = experiments.nth(k)
        name = el.get_attribute("data-experiment")
        test_browser.reveal(learner, name)
        if name not in files:
            expect(el.locator(".missing")).to_contain_text("no shipped results")
            continue
        data = json.loads(files[name].read_text())
        n = len(data["seeds"]) if isinstance(data.get("seeds"), list) else 1
        marker = el.locator('.provenance[data-provenance="stored"]')
        command = f"headlab experiment {name}{' --quick' if data.get('quick') else ''}"
        seeds = f"{n} seed{'s' if n > 1 else ''}"
        expect(marker).to_have_text(f"stored stored run of {command}, {seeds}, {data['date']}")
    assert learner.errors == []


def test_details_fold_and_open_by_click_and_key(learner) -> None:
    test_browser.reveal(learner, "one-vs-many")
    more = learner.locator('details.more[data-more="one-vs-many"]')
    table = more.locator("#one-vs-many-table")
    assert more.get_attribute("open") is None
    expect(table).to_be_hidden()  # seeds, tables and verdicts wait behind the summary
    expect(learner.locator('[data-experiment="one-vs-many"] figure').first).to_be_visible()
    more.locator("summary").click()
    expect(table).to_be_visible()
    expect(more).to_contain_text("seeds")
    more.locator("summary").focus()
    learner.keyboard.press("Enter")  # and closes from the keyboard
    expect(table).to_be_hidden()
    for name in ("induction", "prune", "gqa", "head-count"):  # load every stored run
        test_browser.reveal(learner, name)
    folded = learner.locator("main details.more")
    assert folded.count() >= 8  # every shipped experiment, the widgets' extras, the head types
    assert learner.locator("main details.more[open]").count() == 0
    assert learner.errors == []


def test_first_load_fetches_no_stored_run_below_the_fold(browser, server: str) -> None:
    """A full run's results can weigh megabytes: they load as their section comes near."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    pg = context.new_page()
    runs: list[str] = []
    pg.on(
        "request", lambda r: "/api/experiments/" in r.url and runs.append(r.url.rsplit("/", 1)[1])
    )
    pg.goto(server + "/")
    pg.wait_for_selector("#heads-grid button", timeout=60_000)
    pg.wait_for_load_state("networkidle")
    assert "induction" not in runs and "head-count" not in runs
    with pg.expect_response(lambda r: r.url.endswith("/api/experiments/induction")):
        pg.locator('[data-experiment="induction"]').scroll_into_view_if_needed()
    expect(pg.locator('[data-experiment="induction"] .provenance')).to_contain_text("stored run")
    context.close()
