"""The KV-cache figures of the shape calculator, folded in §2 until a reader opens them, and the
head grid's local/global marks, in the session's headless Chromium: numbers against ``headlab
shapes --json`` and the positions a real :class:`headlab.model.streaming.SinkCache` keeps; axe
finds nothing serious; screenshots at 1280 and 390 px go to $HEADLAB_SCREENSHOTS when it is set
(for checking by eye)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from playwright.sync_api import expect

from conftest import available_model, needs_gemma3, require, watched_page

pytestmark = [pytest.mark.browser, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def page(browser, server: str) -> Iterator[object]:
    """The page with §2's KV-cache fold opened, as a reader opens it."""
    require(available_model() is not None, "no model available for the page")
    context, pg = watched_page(browser)
    pg.goto(server + "/")
    pg.wait_for_selector("#shapes-table")
    pg.click("#shapes-kv-fold > summary")
    yield pg
    context.close()


def cli_shapes(*args: str) -> dict:
    """``headlab shapes --json`` for the same size, run as a user would."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    cmd = [sys.executable, "-m", "headlab.cli", "shapes", *args, "--json"]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    report: dict = json.loads(done.stdout)
    return report


def sink_cache_keeps(tokens: int, sinks: int, window: int) -> list[int]:
    """The text positions a real SinkCache holds after ``tokens`` tokens, fed one at a time with
    each token's position as its value."""
    from headlab.model.streaming import SinkCache

    cache = SinkCache(1, 1, 1, sinks, window)
    for p in range(tokens):
        v = torch.full((1, 1, 1, 1), float(p))
        cache.append(torch.zeros_like(v), v)
    return [int(x) for x in cache.v[0, 0, : cache.length, 0]]


def shown_positions(page, policy: str) -> list[int]:
    ranges = page.eval_on_selector_all(
        '#kv-policies figure[data-figure="kv-policies"] svg rect[data-range]',
        "rs => rs.map(r => r.dataset.range)",
    )
    rows = page.locator(f'#kv-policies-table tr[data-policy="{policy}"]')
    kept = int(rows.get_attribute("data-kept"))
    which = rows.locator("td").nth(2).inner_text()
    out: list[int] = []
    for part in which.split(", "):
        a, _, b = part.partition("–")
        out += list(range(int(a), int(b or a) + 1))
    assert len(out) == kept and ranges
    return out


def test_gemma3_kv_figures_equal_headlab_shapes_and_a_real_sink_cache(page) -> None:
    page.select_option("#shapes-preset", "gemma-3-270m")
    expect(page.locator("#shapes-d_k")).to_have_value("256")
    expect(page.locator("#shapes-verdict")).to_contain_text("d_k=256")
    want = cli_shapes("--preset", "gemma-3-270m", "--batch", "1")
    kv = want["kv_cache"]
    expect(page.locator("#shapes-kv")).to_contain_text("4× smaller than MHA")
    rows = page.locator("#kv-heads-table tbody tr")
    expect(rows).to_have_count(2)  # MHA and MQA: Gemma 3's one K/V head
    for kind, key in (("MHA", "mha"), ("MQA", "mqa")):
        row = page.locator(f'#kv-heads-table tr[data-kind="{kind}"]')
        assert int(row.get_attribute("data-bytes")) == kv[f"{key}_bytes"]
        assert int(row.get_attribute("data-per-token")) == kv[f"{key}_bytes_per_token"]
    assert kv["mha_bytes"] == 4 * kv["mqa_bytes"] == 4 * kv["bytes"]
    # the streaming picture: Gemma 3's own window, 4 sinks, at its full context
    expect(page.locator("#kv-window")).to_have_value("512")
    full = page.locator('#kv-policies-table tr[data-policy="full"]')
    assert int(full.get_attribute("data-bytes")) == kv["bytes"]
    for policy, kept in (("window", 512), ("sinks", 516)):
        row = page.locator(f'#kv-policies-table tr[data-policy="{policy}"]')
        assert int(row.get_attribute("data-kept")) == kept
        assert int(row.get_attribute("data-bytes")) == kept * kv["sink_bytes_per_token"]
    # as generation runs past a small window, each policy keeps what a real cache keeps
    page.fill("#kv-window", "6")
    page.fill("#kv-sinks", "2")
    for t in (5, 8, 20):
        page.eval_on_selector(
            "#kv-t",
            f"e => {{ e.value = {t}; e.dispatchEvent(new Event('input', {{ bubbles: true }})); }}",
        )
        assert shown_positions(page, "full") == list(range(t))
        assert shown_positions(page, "window") == sink_cache_keeps(t, 0, 6)
        assert shown_positions(page, "sinks") == sink_cache_keeps(t, 2, 6)
    assert page.errors == []


def test_smollm2_sizes_show_gqa_between_mha_and_mqa(page) -> None:
    page.select_option("#shapes-preset", "smollm2-135m")
    expect(page.locator("#kv-heads-table tbody tr")).to_have_count(3)
    kv = cli_shapes("--preset", "smollm2-135m")["kv_cache"]
    got = {
        kind: int(
            page.locator(f'#kv-heads-table tr[data-kind="{kind}"]').get_attribute("data-bytes")
        )
        for kind in ("MHA", "GQA", "MQA")
    }
    assert got == {"MHA": kv["mha_bytes"], "GQA": kv["bytes"], "MQA": kv["mqa_bytes"]}
    assert got["MHA"] == 3 * got["GQA"] == 9 * got["MQA"]


def test_kv_figures_axe_clean_and_drawn_at_both_widths(page) -> None:
    from axe_playwright_python.sync_playwright import Axe
    from test_browser_learners import serious

    page.select_option("#shapes-preset", "gemma-3-270m")
    page.wait_for_selector("#kv-policies-table")
    results = Axe().run(page, context="#shapes-widget").response
    assert results["passes"] and serious(results) == []
    folder = os.environ.get("HEADLAB_SCREENSHOTS")
    for width in (1280, 390):
        page.set_viewport_size({"width": width, "height": 900})
        page.wait_for_timeout(300)  # the figures redraw to the new width
        box = page.locator("#kv-figures")
        fits = page.evaluate(
            "() => [...document.querySelectorAll('#kv-figures svg')].every("
            "s => s.getBoundingClientRect().right <= document.documentElement.clientWidth + 1)"
        )
        assert fits, f"a KV figure runs past the screen at {width} px"
        if folder:
            box.screenshot(path=str(Path(folder) / f"kv-figures-{width}.png"))
    assert page.errors == []


@pytest.mark.gemma3
def test_gemma3_head_grid_marks_local_and_global_layers(page) -> None:
    needs_gemma3()
    page.reload()
    page.wait_for_selector("#heads-grid button[data-head]", timeout=60_000)
    page.select_option("#heads-model", "gemma3")
    layers = page.locator("#heads-grid details.grid-layer")
    expect(layers).to_have_count(18, timeout=180_000)
    kinds = [layers.nth(i).get_attribute("data-kind") for i in range(18)]
    assert kinds == ["global" if i % 6 == 5 else "local" for i in range(18)]
    expect(layers.nth(0).locator(".layer-kind")).to_have_text("local: window 512")
    expect(layers.nth(5).locator(".layer-kind")).to_have_text("global: every key")
    expect(page.locator("#heads-kv-note")).to_contain_text("multi-query attention")
    assert layers.first.locator(".kv-group").count() == 1
    folder = os.environ.get("HEADLAB_SCREENSHOTS")
    if folder:
        page.locator("#heads-grid").screenshot(path=str(Path(folder) / "gemma3-grid-1280.png"))
    assert page.errors == []


# what §2 shows of the KV cache only once its fold is opened
KV_PARTS = ("#shapes-kv", "#shapes-cache_len", "#kv-figures", "#kv-heads-table", "#kv-policies")


def shown_in_section_two(pg) -> str:
    """§2's visible text but the layer's code, whose forward takes a cache argument."""
    text = str(pg.locator("section#shapes").inner_text())
    for code in pg.locator("section#shapes pre").all():
        text = text.replace(code.inner_text(), "")
    return text


@pytest.mark.parametrize("width", [1280, 390])
def test_section_two_folds_the_kv_cache_until_it_is_opened(
    browser, server: str, width: int
) -> None:
    """§2 open shows the layer and its shapes only: no word of the KV cache, no figure or size of
    it is visible, but one closed fold whose summary says what it holds and that §9 explains it.
    Opened, it shows the cache's bytes, the tokens-already-cached size (which still reaches the
    calculator), both figures drawn to the screen's width and the link that opens §9's fold;
    §9's link back opens this fold."""
    require(available_model() is not None, "no model available for the page")
    context, pg = watched_page(browser, width)
    try:
        pg.goto(server + "/")
        pg.wait_for_selector("#shapes-table")
        fold = pg.locator("#shapes-kv-fold")
        expect(fold).not_to_have_attribute("open", "")
        summary = fold.locator("summary").inner_text()
        assert "generating" in summary and "§9" in summary, summary  # no link: it is a control
        seen = shown_in_section_two(pg).replace(summary, "")
        assert "KV" not in seen and "cache" not in seen.lower(), seen
        for part in KV_PARTS:
            expect(pg.locator(part).first).to_be_hidden()

        pg.click("#shapes-kv-fold > summary")
        expect(fold).to_have_attribute("open", "")
        for part in KV_PARTS:
            expect(pg.locator(part).first).to_be_visible()
        expect(pg.locator("#shapes-kv")).to_contain_text("KV cache for B·s tokens")
        assert "KV cache" in shown_in_section_two(pg).replace(summary, "")
        pg.wait_for_function(
            "() => [...document.querySelectorAll('#kv-figures svg')].every((s) => "
            "s.getBoundingClientRect().width > 0 && "
            "s.getBoundingClientRect().right <= document.documentElement.clientWidth + 1)"
        )
        with pg.expect_response(lambda r: r.url.endswith("/api/shapes")) as info:
            pg.fill("#shapes-cache_len", "5")
        assert info.value.request.post_data_json["cache_len"] == 5
        expect(pg.locator('#shapes-table tr[data-stage="k_all"]')).to_have_count(1)

        pg.evaluate(
            "document.querySelectorAll('#caveats details').forEach((d) => { d.open = false; })"
        )
        pg.locator("#kv-figures a[href='#kv-cache']:not(.term)").click()
        expect(pg.locator("#kv-fold")).to_have_attribute("open", "")
        pg.evaluate("() => { document.getElementById('shapes-kv-fold').open = false; }")
        pg.locator("#kv-fold a[href='#shapes-kv-fold']").click()
        expect(fold).to_have_attribute("open", "")
        assert pg.evaluate("document.documentElement.scrollWidth") <= width
        assert pg.errors == []
    finally:
        context.close()
