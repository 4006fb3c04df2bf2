"""The page at a desktop's 1280 px and a phone's 390 px, in the same headless Chromium as
test_browser.py: controls that look like what they do, messages in the page's own words, every
chart with all its data in view, and sentences that agree with the figures they quote.

One page per width serves the module (the fixture ``reader``); each test sets what it reads and
puts back what it changed.
"""

from __future__ import annotations

import importlib.util
import json
import time
from collections.abc import Iterator
from itertools import pairwise

import pytest
import test_browser
from playwright.sync_api import expect

from conftest import require, watched_page

pytestmark = [pytest.mark.browser, pytest.mark.slow]
expect.set_options(timeout=30_000)
WIDTHS = (1280, 390)
EXPERIMENTS = ("one-vs-many", "induction", "prune", "gqa", "head-count")
HAS_SPACY = importlib.util.find_spec("spacy") is not None


def _syntax_labels_served() -> bool:
    from headlab.server.schemas import HeadsRequest

    return "syntax_labels" in HeadsRequest.model_fields


needs_syntax_labels = pytest.mark.skipif(
    not _syntax_labels_served(), reason="the server does not take syntax_labels yet"
)


@pytest.fixture(scope="module", params=WIDTHS, ids=lambda w: f"{w}px")
def reader(request, browser, server: str) -> Iterator[object]:
    context, pg = watched_page(browser, request.param)
    pg.width = request.param
    pg.set_default_timeout(60_000)
    pg.goto(server + "/")
    pg.wait_for_selector("#shapes-table")
    pg.wait_for_selector("#heads-grid button[data-head]", timeout=60_000)
    yield pg
    context.close()


def heads_answer(pg, action) -> dict:
    """Do ``action`` and return the /api/heads answer it causes (the page's one analysis), once
    the page has drawn it (the label summary is drawn last, as a new element)."""
    pg.evaluate("() => document.getElementById('label-counts')?.setAttribute('data-old', '')")
    with pg.expect_response(lambda r: r.url.endswith("/api/heads"), timeout=300_000) as info:
        action()
    response = info.value
    assert response.ok, response.text()
    pg.wait_for_selector("#label-counts:not([data-old])", state="attached")  # §9 folds it
    return response.json()


def pick_model(pg, name: str) -> dict:
    return heads_answer(pg, lambda: pg.select_option("#heads-model", name))


def on_default(pg) -> None:
    """Back on the model the page opens with (a test that switched models puts it back)."""
    if pg.input_value("#heads-model") != "default":
        pick_model(pg, "default")


# --- the controls ---------------------------------------------------------------------------


def test_hidden_controls_stay_hidden(reader) -> None:
    """A control the page hides is not drawn (the relation menu shows only while the syntactic
    type is picked; a CSS display rule once overrode the hidden attribute)."""
    shown = reader.evaluate(
        "() => [...document.querySelectorAll('[hidden]')]"
        ".filter(e => getComputedStyle(e).display !== 'none').map(e => e.id || e.tagName)"
    )
    assert shown == []
    expect(reader.locator("#heads-relation")).to_be_hidden()
    if HAS_SPACY:
        reader.select_option("#heads-type", "syntactic")
        expect(reader.locator("#heads-relation option").first).to_be_attached(timeout=120_000)
        expect(reader.locator("#heads-relation")).to_be_visible()
    for kind in ("previous-token", "induction", "averaged"):
        reader.select_option("#heads-type", kind)
        expect(reader.locator("#heads-relation")).to_be_hidden()
    assert reader.errors == []


# the effective opacity of an element: its own times its ancestors'
OPACITY = """e => { let o = 1; for (let x = e; x; x = x.parentElement)
  o *= parseFloat(getComputedStyle(x).opacity); return [o, getComputedStyle(e).cursor]; }"""


def test_disabled_controls_look_disabled(reader) -> None:
    """Cancel before a run, Back on the diagram's first step: dimmed, with a cursor that says
    no; their enabled neighbours are not."""
    reader.locator("#layer-diagram svg").focus()
    reader.keyboard.press("Home")
    for disabled, enabled in (("#live-cancel", "#live-train"), ("#layer-back", "#layer-next")):
        expect(reader.locator(disabled)).to_be_disabled()
        opacity, cursor = reader.eval_on_selector(disabled, OPACITY)
        assert opacity <= 0.6 and cursor == "not-allowed", (disabled, opacity, cursor)
        opacity, cursor = reader.eval_on_selector(enabled, OPACITY)
        assert opacity == 1 and cursor == "pointer", (enabled, opacity, cursor)
    assert reader.errors == []


# each menu's widest option, measured in the menu's own font, against the room inside the menu
# (its width less its padding and Chromium's arrow, 20 px)
MENUS = """sel => [...document.querySelectorAll(sel)].filter(s => s.offsetWidth).map(s => {
  const css = getComputedStyle(s);
  const ctx = document.createElement('canvas').getContext('2d');
  ctx.font = `${css.fontWeight} ${css.fontSize} ${css.fontFamily}`;
  const widest = Math.max(...[...s.options].map(o => ctx.measureText(o.textContent).width));
  const room = s.clientWidth - parseFloat(css.paddingLeft) - parseFloat(css.paddingRight) - 20;
  return [s.id, Math.round(widest), Math.round(room)];
})"""


def test_every_menu_shows_its_options_whole(reader) -> None:
    """No menu cuts its options ("previous-token heac", the live panel's "auto (from the
    machin"): each is as wide as its widest option, and that fits the phone's width."""
    menus = reader.evaluate(MENUS, "#heads-form select, #shapes-form select, #live-form select")
    assert len(menus) >= 9 and "live-threads" in [m[0] for m in menus]
    cut = [m for m in menus if m[1] > m[2]]
    assert cut == [], cut
    assert reader.errors == []


def shapes_problem(pg) -> str:
    box = pg.locator("#shapes-output .problems")
    expect(box).to_be_visible()
    return box.inner_text()


@pytest.mark.parametrize("typed", ["", "0", "2.5", "70000"])
def test_a_bad_head_count_is_named_in_words(reader, typed: str) -> None:
    """The page checks the sizes against the limits the server serves (GET /api/shapes/limits)
    and says what is valid; it sends nothing the server would refuse (a cleared box once went
    out as 0 and came back as "n_heads: Input should be greater than or equal to 1")."""
    from headlab.shapes.config import LIMITS

    lo, hi = LIMITS["n_heads"]
    sent: list[dict] = []
    watch = lambda r: r.url.endswith("/api/shapes") and sent.append(r.post_data_json)  # noqa: E731
    reader.on("request", watch)
    try:
        reader.fill("#shapes-n_heads", typed)
        text = shapes_problem(reader)
        # no diagram of the sizes before is left beside the refusal
        expect(reader.locator("#layer-diagram")).to_be_hidden()
        reader.wait_for_timeout(300)  # a request, if any, would have gone by now (debounce: 120 ms)
    finally:
        reader.remove_listener("request", watch)
        reader.fill("#shapes-n_heads", "8")
    assert f"h (query heads) must be a whole number from {lo:,} to {hi:,}" in text, text
    assert "Input should" not in text
    assert [b for b in sent if b.get("n_heads") in (0, None) or b["n_heads"] > hi] == []
    expect(reader.locator("#shapes-table")).to_be_visible()
    assert reader.errors == []


def test_the_servers_refusal_is_put_in_words(reader) -> None:
    """Should the server still refuse a size (its limits changed since the page loaded), the
    page names the field in its own words, not pydantic's."""
    body = {
        "detail": "d_model: Input should be less than or equal to 64",
        "errors": [
            {
                "type": "less_than_equal",
                "loc": ["body", "d_model"],
                "msg": "Input should be less than or equal to 64",
            }
        ],
    }
    reader.route("**/api/shapes", lambda route: route.fulfill(status=422, json=body))
    try:
        reader.fill("#shapes-d_model", "640")
        text = shapes_problem(reader)
    finally:
        reader.unroute("**/api/shapes")
        reader.fill("#shapes-d_model", "512")
    assert "d_model (width)" in text and "64" in text, text
    assert "Input should" not in text
    reader.fill("#shapes-d_model", "512")
    expect(reader.locator("#shapes-table")).to_be_visible()
    # the browser logs the refusal it was served as a failed resource; nothing else may appear
    reader.errors[:] = [e for e in reader.errors if "status of 422" not in e]
    assert reader.errors == []


def test_a_long_text_is_measured_in_words(reader) -> None:
    """A text over the server's limit (the schema's maxLength) is refused by the page itself,
    with its length and the limit, and nothing is sent."""
    from headlab.server.schemas import MAX_TEXT_CHARS

    text = ("The cat sat on the mat. " * 200)[: MAX_TEXT_CHARS + 431]
    sent: list[str] = []
    watch = lambda r: r.url.endswith("/api/heads") and sent.append(r.url)  # noqa: E731
    reader.on("request", watch)
    try:
        reader.fill("#heads-text", text)
        reader.click("#heads-run")
        status = reader.locator("#heads-status")
        expect(status).to_contain_text(f"{len(text):,} characters")
        reader.wait_for_timeout(300)
        assert f"the limit is {MAX_TEXT_CHARS:,}" in status.inner_text()
        assert "String should" not in status.inner_text() and sent == []
    finally:
        reader.remove_listener("request", watch)
        reader.fill("#heads-text", "")  # the next tests run the built-in sentence
    heads_answer(reader, lambda: reader.click("#heads-run"))
    assert reader.errors == []


def test_a_failed_or_superseded_run_leaves_no_earlier_answer(reader) -> None:
    """While a run is on its way the head viewer marks the figures drawn as the last input's;
    a run that fails takes them away (figures, grid, head menu, the switch-off panel's heads,
    the label count), an older run's answer arriving after a newer one is not drawn, and a head
    type picked then draws nothing of the input before (a refusal once left the last sentence's
    heads under the new menus)."""
    on_default(reader)
    held: list = []
    reader.route("**/api/heads", lambda route: held.append(route))
    gone = "#heads-view figure, #heads-grid button[data-head], #heads-which option"
    gone += ", #switch-heads button, #label-counts"
    try:
        expect(reader.locator("#heads-view figure").first).to_be_visible()
        reader.select_option("#heads-probe", "random-repeat")  # the first run, held back
        expect(reader.locator("#heads-stale")).to_contain_text("running on this one")
        expect(reader.locator("#heads-results")).to_have_class("stale")
        assert reader.locator("#heads-view figure").count() > 0  # marked, not yet taken away
        reader.select_option("#heads-probe", "repeat")  # the second run: refused
        while len(held) < 2:
            reader.wait_for_timeout(50)
        held[1].fulfill(status=422, json={"detail": "probe: refused by this test"})
        expect(reader.locator("#heads-status")).to_have_text("probe: refused by this test")
        assert reader.locator(gone).count() == 0
        expect(reader.locator("#heads-stale")).to_be_hidden()
        with reader.expect_response(lambda r: r.url.endswith("/api/heads")) as late:
            held[0].continue_()  # the first run's real answer comes after all
        late.value.finished()
        reader.wait_for_timeout(300)  # the page has read it by now: it must draw nothing
        reader.select_option("#heads-type", "induction")
        assert reader.locator(gone).count() == 0
        expect(reader.locator("#heads-status")).to_have_text("probe: refused by this test")
    finally:
        reader.unroute("**/api/heads")
    heads_answer(reader, lambda: reader.select_option("#heads-probe", "text"))
    reader.select_option("#heads-type", "previous-token")
    expect(reader.locator("#heads-stale")).to_be_hidden()
    reader.errors[:] = [e for e in reader.errors if "status of 422" not in e]
    assert reader.errors == []


# --- every chart shows all its data -----------------------------------------------------------

# per visible svg in main: its box, and every text and point that falls outside it or outside
# the viewport; and every figure or diagram box that scrolls sideways
GEOMETRY = """() => {
  const vw = document.documentElement.clientWidth;
  const out = { svgs: 0, outside: [], scrolls: [] };
  for (const svg of document.querySelectorAll('main svg')) {
    const box = svg.getBoundingClientRect();
    if (!box.width || svg.closest('button, .legend')) continue;
    out.svgs += 1;
    const name = svg.getAttribute('aria-label') || svg.closest('figure')?.dataset.figure || '?';
    if (box.left < -0.5 || box.right > vw + 0.5)
      out.outside.push([name, 'svg', box.left, box.right, vw]);
    for (const el of svg.querySelectorAll('text, circle')) {
      const r = el.getBoundingClientRect();
      if (!r.width || getComputedStyle(el).visibility === 'hidden') continue;
      if (r.left < box.left - 0.5 || r.right > box.right + 0.5 || r.top < box.top - 0.5
          || r.bottom > box.bottom + 0.5 || r.right > vw + 0.5 || r.left < -0.5)
        out.outside.push([name, el.textContent || el.tagName, Math.round(r.left),
                          Math.round(r.right), Math.round(box.left), Math.round(box.right)]);
    }
  }
  for (const el of document.querySelectorAll('main figure, main .hv-scroll, main .dg-figure')) {
    if (el.offsetWidth && el.scrollWidth > el.clientWidth + 1)
      out.scrolls.push([el.dataset.figure || el.className, el.scrollWidth, el.clientWidth]);
  }
  return out;
}"""


def open_everything(pg) -> None:
    """Every stored run drawn and every fold opened, so that every chart is on the page."""
    for name in EXPERIMENTS:
        test_browser.reveal(pg, name)
    pg.evaluate("() => document.querySelectorAll('main details').forEach(d => { d.open = true; })")
    pg.wait_for_timeout(300)  # a fold's figures are drawn to its width as it opens


def test_every_chart_shows_all_its_data(reader) -> None:
    """At both widths every chart fits its box and the screen: each tick label and point lies
    inside its svg and the viewport, and no figure scrolls sideways."""
    open_everything(reader)
    found = reader.evaluate(GEOMETRY)
    assert found["svgs"] >= 12, found
    assert found["outside"] == [], found["outside"][:12]
    assert found["scrolls"] == [], found["scrolls"]
    assert reader.errors == []


TABLES = """() => {
  const cue = (t) => getComputedStyle(t, '::after').content;
  const shown = [...document.querySelectorAll('main table')].filter((t) => t.offsetWidth);
  const tables = shown.map((t) => {
    const box = t.closest('.table-wrap');
    return { id: t.id, boxed: !!box, scrolls: !!box && box.scrollWidth > box.clientWidth + 1,
             cue: cue(t), right: (box || t).getBoundingClientRect().right };
  });
  const doc = document.documentElement;
  return { tables, page: doc.scrollWidth, vw: doc.clientWidth };
}"""


def test_tables_fit_the_screen_or_say_that_they_scroll(reader) -> None:
    """At both widths no table runs past the screen; the shape, cost and KV tables fit a phone
    whole, and a table wider than its box (the presets' seven columns) says under it that it
    scrolls sideways; one that fits says nothing."""
    open_everything(reader)
    # the browser re-evaluates a scroll-state container query a frame or more after a table
    # is drawn or a section opens: the page has settled when the cues agree with the boxes
    for _ in range(40):
        found = reader.evaluate(TABLES)
        if all(("scrolls sideways" in t["cue"]) == t["scrolls"] for t in found["tables"]):
            break
        reader.wait_for_timeout(250)
    assert found["page"] <= found["vw"] and len(found["tables"]) >= 6, found
    assert [t["id"] for t in found["tables"] if not t["boxed"]] == []
    assert [t for t in found["tables"] if t["right"] > found["vw"] + 0.5] == []
    fits = {t["id"] for t in found["tables"] if not t["scrolls"]}
    assert {"shapes-table", "shapes-param-table", "cost-table", "kv-table"} <= fits, found
    said = {t["id"]: "scrolls sideways" in t["cue"] for t in found["tables"]}
    assert said == {t["id"]: t["scrolls"] for t in found["tables"]}, found


def ticks(pg, figure: str) -> list[str]:
    svg = pg.locator(f'figure[data-figure="{figure}"] svg')
    return svg.evaluate("s => [...s.querySelectorAll('text.x-tick')].map(t => t.textContent)")


def test_the_head_count_and_gqa_charts_reach_their_last_point(reader) -> None:
    """The head-count chart's point is h = 1 … 32 (16 and 32 are the point of it); the GQA
    chart's last context is 4096: each tick is drawn, inside the screen."""
    from headlab.server.routes.experiments import shipped

    files = shipped()
    charts = (("head-count", "head-count-loss", "h"), ("gqa", "gqa-decode", "context"))
    for name, figure, key in charts:
        require(name in files, f"no stored {name} run")
        data = json.loads(files[name].read_text())
        rows = data["summary"] if name == "head-count" else data["decode"]
        want = sorted({str(row[key]) for row in rows}, key=int)
        test_browser.reveal(reader, name)
        assert ticks(reader, figure) == want
        last = reader.locator(f'figure[data-figure="{figure}"] text.x-tick').last
        box = last.bounding_box()
        assert box and box["x"] + box["width"] <= reader.width, (name, box)
    assert reader.errors == []


# --- the layer diagram -------------------------------------------------------------------------


# the layer diagram's svg as one reading: it is redrawn (a new svg) when a report arrives and
# when its holder's width changes, so its box, its cut labels and its words are read together
DIAGRAM = """() => { const s = document.querySelector('#layer-diagram svg');
  if (!s) return null;
  const b = s.getBoundingClientRect(), texts = [...s.querySelectorAll('text')];
  const cut = texts.filter(t => { const r = t.getBoundingClientRect();
    return r.width && (r.right > b.right + 0.5 || r.left < b.left - 0.5); });
  return { left: b.left, right: b.right, cut: cut.map(t => t.textContent),
           words: texts.map(t => t.textContent).join(' ') }; }"""


def settled_diagram(page, timeout_s: float = 30.0) -> dict:
    """The diagram's reading once two readings 200 ms apart agree (no redraw in between)."""
    deadline = time.monotonic() + timeout_s
    last = None
    while True:
        now = page.evaluate(DIAGRAM)
        if now is not None and now == last:
            return now
        assert time.monotonic() < deadline, f"the layer diagram kept changing: {now}"
        last = now
        page.wait_for_timeout(200)


def test_diagram_labels_are_whole_words(reader) -> None:
    """The layer diagram fits the width it is given: no label runs past its svg ("numbers
    eac"), and every row's shape line is whole."""
    reader.fill("#shapes-d_model", "512")
    reader.fill("#shapes-n_heads", "8")
    expect(reader.locator("#layer-diagram")).to_contain_text("(2, 8, 10, 64)")
    drawn = settled_diagram(reader)
    assert drawn["left"] >= 0 and drawn["right"] <= reader.width, drawn
    assert drawn["cut"] == []
    assert "d_model numbers each" in drawn["words"]
    assert "(2, 8, 10, 64)" in drawn["words"]
    assert reader.errors == []


# --- sentences that agree with their figures ---------------------------------------------------


def signed(k: int) -> str:
    return f"−{-k}" if k < 0 else f"+{k}" if k > 0 else "0"


def pick_type(pg, kind: str) -> str:
    pg.select_option("#heads-type", "previous-token" if kind != "previous-token" else "induction")
    pg.select_option("#heads-type", kind)
    return pg.inner_text("#heads-status")


def row_of(answer: dict, best: dict) -> dict:
    return next(
        r for r in answer["heads"] if (r["layer"], r["head"]) == (best["layer"], best["head"])
    )


@pytest.mark.parametrize("model", ["default", "minilm"])
def test_a_positional_pick_states_its_offset(reader, model: str) -> None:
    """The positional pick says where the head looks (the shipped model's head 0.4: "attends 2
    tokens back (offset −2)"); when the best positional score belongs to a head labelled
    previous-token (MiniLM's 0.2 at offset −1), it says why instead of contradicting itself."""
    available = [o.get_attribute("value") for o in reader.locator("#heads-model option").all()]
    require(model in available, f"{model} is not available here")
    try:
        answer = pick_model(reader, model)
        best = answer["best"]["positional"]
        offset = row_of(answer, best)["offset"]
        status = pick_type(reader, "positional")
    finally:
        on_default(reader)
    assert f"offset {signed(offset)}" in status, status
    if best["labelled"]:
        k = abs(offset)
        way = "back" if offset < 0 else "ahead"
        assert f"attends {k} token{'s' if k > 1 else ''} {way}" in status, status
    else:
        assert f"labelled {best['label']}" in status and "fixed offset is" in status, status
    assert reader.errors == []


@pytest.mark.parametrize("model", ["default", "smollm2"])
def test_a_head_rests_only_where_its_figure_says_so(reader, model: str) -> None:
    """ "Where it has nothing to do it rests on the first token (0.00)" came with a figure that
    says the opposite: the sentence is there only when the rest figure reaches the sink share
    the answer uses (its sinks.threshold)."""
    available = [o.get_attribute("value") for o in reader.locator("#heads-model option").all()]
    require(model in available, f"{model} is not available here")
    statuses = {}
    try:
        answer = pick_model(reader, model)
        for kind in ("induction", "content"):
            best = answer["best"].get(kind)
            if best and best["labelled"] and row_of(answer, best)["rest"] is not None:
                statuses[kind] = (row_of(answer, best)["rest"], pick_type(reader, kind))
    finally:
        on_default(reader)
    # both models have a labelled induction head, the default model a content head too
    # (SmolLM2's heads that read content rest on the first token more than that: none passes)
    assert "induction" in statuses and (model != "default" or "content" in statuses), statuses
    threshold = answer["sinks"]["threshold"]
    for kind, (rest, status) in statuses.items():
        if rest >= threshold:
            assert f"{rest:.2f}" in status and ("rests" in status or "goes to" in status), status
        else:
            assert "rests" not in status and f"({rest:.2f})" not in status, (kind, rest, status)
    assert reader.errors == []


def test_a_sentence_typed_twice_shows_an_induction_head_that_rests(reader) -> None:
    """A teacher's own sentence typed twice on the shipped model: the best induction head is
    labelled induction (it was "sink": it rests on the start token as much as it copies), and
    the status line gives both of its figures, the share of all its attention on
    the copy and the share of what it does not rest on the first token."""
    require(test_browser._model_name() == "default", "the default model is not built")
    on_default(reader)
    text = "He forgot his umbrella at the station and got wet."
    try:
        reader.fill("#heads-text", f"{text} {text}")
        answer = heads_answer(reader, lambda: reader.click("#heads-run"))
        best = answer["best"]["induction"]
        row = row_of(answer, best)
        assert best["labelled"] and best["passes_threshold"] and row["label"] == "induction"
        assert row["scores"]["induction"] < 0.5 <= row["scores"]["induction_active"]
        status = pick_type(reader, "induction")
        assert status.startswith(f"Best induction head: {best['layer']}.{best['head']}"), status
        assert f"{row['scores']['induction']:.2f} of its attention goes to the token" in status
        assert f"{row['scores']['induction_active']:.2f} of what it does not rest" in status
        grid = reader.locator("#heads-grid button[data-head]", has_text="induction")
        assert grid.count() >= 1
    finally:
        reader.fill("#heads-text", "")  # the next tests run the built-in sentence
        heads_answer(reader, lambda: reader.click("#heads-run"))
    assert reader.errors == []


@pytest.mark.skipif(not HAS_SPACY, reason="spaCy: pip install 'headlab[syntax]'")
def test_a_syntactic_head_is_best_only_when_it_beats_the_offset(reader) -> None:
    """A relation whose best head follows fewer arcs than a fixed offset has no "best head":
    the page says no head beats the offset (it said "Best pobj head … 56.4% against 67.9%")."""
    on_default(reader)
    reader.select_option("#heads-type", "syntactic")
    expect(reader.locator("#heads-relation option").first).to_be_attached(timeout=120_000)
    answer = heads_answer(reader, lambda: reader.click("#heads-run"))
    rows = answer["syntax"]["relations"]
    for row in rows:
        reader.select_option("#heads-relation", row["relation"])
        status = reader.inner_text("#heads-status")
        beats = row["accuracy"] > row["baseline_accuracy"]
        assert (f"Best {row['relation']} head" in status) == beats, (row, status)
        if not beats:
            assert f"No head follows {row['relation']} arcs better than a fixed offset" in status
        assert f"({signed(row['baseline_offset'])})" in status
    assert any(r["accuracy"] <= r["baseline_accuracy"] for r in rows)  # the case that contradicted
    reader.select_option("#heads-type", "previous-token")
    assert reader.errors == []


def test_section_three_says_what_its_table_shows(reader) -> None:
    """The FLOPs of 1 and 8 heads are equal in the table beside it: the section says "the
    same", not "about", "nearly all" or "barely moves"."""
    rows = reader.locator("#cost-table tbody tr")
    expect(rows).to_have_count(2)
    flops = [rows.nth(k).locator("td").nth(3).inner_text() for k in range(2)]
    params = [rows.nth(k).locator("td").nth(2).inner_text() for k in range(2)]
    section = " ".join(reader.inner_text("#many-heads").split())
    if flops[0] == flops[1]:
        assert "the same FLOPs" in section
        for word in (" about ", "nearly all", "barely"):
            assert word not in section, word
    if params[0] == params[1]:
        assert "The same parameters" in section
    assert reader.errors == []


# --- stored charts explained where they look wrong -----------------------------------------


def stored(name: str) -> dict:
    from headlab.server.routes.experiments import shipped

    files = shipped()
    require(name in files, f"no stored {name} run")
    return json.loads(files[name].read_text())


def test_the_prune_chart_says_why_its_lines_cross(reader) -> None:
    """The shipped model's pruning curve falls as its 14th head goes and runs above the random
    orders' mean from 9 to 13 heads: the caption names both, from the stored numbers, and why
    (importance is the size of a slope, whatever its sign, measured once)."""
    data = stored("prune")
    m = next(m for m in data["models"] if m["model"] == data["models"][0]["model"])
    curve, random = m["importance_curve"]["losses"], m["random_mean_losses"]
    removed = m["importance_curve"]["removed"] or list(range(len(curve)))
    falls = [(curve[k - 1] - curve[k], k) for k in range(1, len(curve))]
    fall, at = max(falls)
    above = [k for k in range(1, len(curve)) if curve[k] > random[k]]
    runs: list[list[int]] = []
    for k in above:
        runs.append([*runs.pop(), k] if runs and runs[-1][-1] == k - 1 else [k])
    longest = max(runs, key=len)
    test_browser.reveal(reader, "prune")
    note = reader.locator(f'[data-note="prune-{m["model"]}"]')
    expect(note).to_be_visible()
    text = note.inner_text()
    # the shipped run is the case the caption explains: both features are in its numbers
    assert fall >= 0.05 * curve[0] and len(longest) >= 2, (fall, curve[0], runs)
    assert f"from {curve[at - 1]:.3g} to {curve[at]:.3g}" in text, text
    assert m["importance_curve"]["order"][removed[at] - 1] in text
    assert f"From {removed[longest[0]]} to {removed[longest[-1]]} heads removed" in text
    assert "whatever the slope's sign" in text
    assert reader.errors == []


def test_the_gqa_chart_names_its_outlier(reader) -> None:
    """A variant that decodes faster with a longer cache (the stored run's h_kv = 1 at 2048,
    ×3.33) is named as a disturbance of the timing, with the medians it rests on."""
    data = stored("gqa")
    odd = []
    for k in {row["n_kv_heads"] for row in data["decode"]}:
        mine = sorted(
            (r for r in data["decode"] if r["n_kv_heads"] == k), key=lambda r: r["context"]
        )
        odd += [(k, a, b) for a, b in pairwise(mine) if b["tokens_per_s"] > a["tokens_per_s"]]
    test_browser.reveal(reader, "gqa")
    note = reader.locator('[data-note="gqa-decode"]')
    if not odd:
        expect(note).to_have_count(0)
        return
    text = note.inner_text()
    for k, a, b in odd:
        assert f"h_kv = {k} decoded faster with {b['context']} cached positions" in text
        assert (
            f"({b['tokens_per_s']:.1f} tokens/s" in text
            and f"{a['context']} ({a['tokens_per_s']:.1f})" in text
        )
    assert f"median of {data['config']['repeats']} timings" in text
    assert reader.errors == []


# --- what the tokens are ---------------------------------------------------------------------


def test_byte_tokens_are_explained_once(reader) -> None:
    """Byte-level BPE shows "—" as three letters (â Ģ Ķ): a note beside the tokens says they are
    bytes, and which, from the tokenizer's own pieces and Python's UTF-8."""
    from headlab import zoo

    test_browser._model_name()
    _, tokenizer = zoo.load("default")
    text = "Tea — “quoted” twice. Tea — “quoted” twice."
    reader.fill("#heads-text", text)
    heads_answer(reader, lambda: reader.click("#heads-run"))
    note = reader.locator("#heads-tokens")
    expect(note).to_be_visible()
    said = note.inner_text()
    dash = " ".join(f"{b:02X}" for b in "—".encode())
    assert f"the bytes {dash}: “—”" in said or f"the bytes {dash}: “ —”" in said, said
    dash_pieces = [
        p for p in tokenizer.token_strings(tokenizer.encode("—")) if p != "<|endoftext|>"
    ]
    assert len(dash_pieces) > 1 and "".join(dash_pieces) != "—"  # the case: bytes, not a letter
    assert " ".join(f"“{p}”" for p in dash_pieces) in said, said
    assert "byte-level BPE" in said and "Ġ" in said
    reader.fill("#heads-text", "")
    heads_answer(reader, lambda: reader.click("#heads-run"))
    assert reader.errors == []


# --- labels that do not depend on what was asked before -----------------------------------------


def grid_labels(pg) -> dict[str, str]:
    return dict(
        pg.eval_on_selector_all(
            "#heads-grid button[data-head]",
            "bs => bs.map(b => [b.dataset.head, b.querySelector('.head-name').textContent])",
        )
    )


@pytest.mark.skipif(not HAS_SPACY, reason="spaCy: pip install 'headlab[syntax]'")
@needs_syntax_labels
@pytest.mark.parametrize("width", WIDTHS)
def test_labels_do_not_depend_on_a_syntactic_pick(browser, server: str, width: int) -> None:
    """Picking the syntactic type asks for the syntactic scores (shown beside the labels);
    every label stays what it was. Only "label heads by syntax too" lets the syntactic score
    into the labels, and unticking it brings the labels back. A fresh page: its first pick of
    the type is the one that asks."""
    context = browser.new_context(viewport={"width": width, "height": 900})
    pg = context.new_page()
    errors: list[str] = []
    pg.on("pageerror", lambda e: errors.append(str(e)))
    pg.goto(server + "/")
    pg.wait_for_selector("#label-counts", state="attached", timeout=60_000)
    before = grid_labels(pg)
    bodies: list[dict] = []
    pg.on("request", lambda r: r.url.endswith("/api/heads") and bodies.append(r.post_data_json))
    answer = heads_answer(pg, lambda: pg.select_option("#heads-type", "syntactic"))
    assert bodies[-1].get("syntax") is True and "syntax_labels" not in bodies[-1]
    assert answer["syntax"] is not None and not answer.get("syntax_labels")
    assert grid_labels(pg) == before
    ruled = heads_answer(pg, lambda: pg.check("#heads-syntax-labels"))
    assert bodies[-1].get("syntax_labels") is True and ruled["syntax_labels"] is True
    shown = grid_labels(pg)
    assert shown == {
        f"{r['layer']}.{r['head']}": f"{r['layer']}.{r['head']} {r['label']}"
        for r in ruled["heads"]
    }
    expect(pg.locator("#heads-status")).to_contain_text("take the syntactic score into")
    heads_answer(pg, lambda: pg.uncheck("#heads-syntax-labels"))
    assert grid_labels(pg) == before
    assert errors == []
    context.close()
