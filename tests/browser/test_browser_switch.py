"""Switch heads off and watch, in headless Chromium at a desktop's and a phone's width: the panel
beside the head grid picks heads, runs POST /api/switch-off, and shows the loss on the repeat,
the induction scores, a head's pattern and every next-token guess, intact and switched off. Every
number on it is checked against headlab.heads.switch.switch_off run here in the test process
(and the loss rise against headlab.heads.effects.ablate_heads): switching off the default model's
previous-token head breaks its induction circuit on the built-in repeat.

One page per width serves the module (the fixture ``shown``): it picks the previous-token heads
and runs once.
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
def model_and_probe():
    from headlab import zoo
    from headlab.measure import build_probe

    name = test_browser._model_name()
    if name != "default":
        pytest.skip("the switch-off tests read the default model's circuit")
    model, tokenizer = zoo.load(name)
    c = model.config
    return model, tokenizer, build_probe("repeat", tokenizer, c.max_len, c.vocab_size)


def labelled(pg, label: str) -> list[tuple[int, int]]:
    """The heads the panel's picker shows with ``label`` (the head viewer's labels)."""
    found = []
    for b in pg.locator("#switch-heads button[data-off]").all():
        name, _, shown_label = b.inner_text().strip().partition(" ")
        if shown_label == label:
            layer, head = name.split(".")
            found.append((int(layer), int(head)))
    return sorted(found)


def oracle(model_and_probe, heads, mode="mean"):
    from headlab.heads.switch import switch_off

    model, _, probe = model_and_probe
    return switch_off(model, probe, heads, mode)


@pytest.fixture(scope="module", params=WIDTHS, ids=lambda w: f"{w}px")
def shown(request, browser, server: str, model_and_probe) -> Iterator[tuple[object, dict]]:
    """A page at the width that switched off the previous-token heads on the head viewer's
    first input (the built-in repeat), and the answer it drew."""
    context, pg = watched_page(browser, request.param)
    pg.width = request.param
    pg.goto(server + "/")
    pg.wait_for_selector("#heads-grid button[data-head]", timeout=120_000)
    pg.wait_for_selector("#switch-heads button[data-off]")
    assert pg.locator("#switch-result").inner_text() == ""  # nothing runs before a click
    pg.click("#switch-previous")
    expect(pg.locator('#switch-heads button[aria-pressed="true"]').first).to_be_visible()
    pressed = pg.locator('#switch-heads button[aria-pressed="true"]').all()
    assert [b.get_attribute("data-off") for b in pressed] == [
        f"{l}.{i}" for l, i in labelled(pg, "previous-token")
    ]
    with pg.expect_response(lambda r: r.url.endswith("/api/switch-off")) as info:
        pg.click("#switch-run")
    assert info.value.ok, info.value.text()
    pg.wait_for_selector("#switch-loss")
    yield pg, info.value.json()
    context.close()


def loss_text(v) -> list[str]:
    """A loss line's three numbers as the page writes them: intact, off, the signed rise."""
    sign = "+" if v["rise"] >= 0 else "−"
    return [f"{v['intact']:.2f}", f"{v['off']:.2f}", f"{sign}{abs(v['rise']):.2f}"]


def shown_loss(pg, key: str) -> list[str]:
    row = pg.locator(f'#switch-loss [data-loss="{key}"]')
    return [row.locator(f'[data-run="{r}"]').inner_text() for r in ("intact", "off", "rise")]


def test_the_previous_token_head_off_breaks_induction_as_the_library_says(
    shown, model_and_probe
) -> None:
    """The loss on the repeat rises by nats and the induction heads' scores collapse: each
    number shown is switch_off's for the previous-token heads, and for one such head the rise is
    ablate_heads' effect of it."""
    from headlab.heads.effects import ablate_heads
    from headlab.heads.evidence import loss_rows

    pg, answer = shown
    previous = labelled(pg, "previous-token")
    assert answer["off"] == [list(p) for p in previous] and answer["mode"] == "mean"
    s = oracle(model_and_probe, previous)
    loss = s.losses()
    assert shown_loss(pg, "repeat") == loss_text(loss["repeat"])
    assert shown_loss(pg, "all") == loss_text(loss["all"])
    assert loss["repeat"]["rise"] > 2.0
    said = pg.inner_text('#switch-loss [data-loss="repeat"]')
    assert f"the {loss['repeat']['rows']} positions whose token appeared earlier" in said
    model, _, probe = model_and_probe
    if len(previous) == 1:  # one head: the rise is ablate_heads' effect of it
        a = ablate_heads(model, probe, previous)
        rise = float(a.loss_effect(loss_rows(probe, causal=True)["induction"])[0])
        assert pg.locator('#switch-loss [data-loss="repeat"] [data-run="rise"]').inner_text() == (
            f"+{rise:.2f}"
        )
    induction = labelled(pg, "induction")
    assert induction
    for layer, head in induction:
        cells = pg.locator(f'#switch-induction tr[data-head="{layer}.{head}"] td').all_inner_texts()
        was, now = float(s.intact.induction[layer, head]), float(s.off.induction[layer, head])
        assert cells[2:] == [f"{was:.2f}", f"{now:.2f}"]
        assert now < 0.5 * was
    assert pg.errors == []


def test_the_pattern_shown_is_an_induction_head_that_changed(shown, model_and_probe) -> None:
    """The head drawn first is the induction head (as the head viewer labels it) whose pattern
    moved most; the answer's patterns are the library's, and the two heatmaps are captioned for
    both runs."""
    pg, answer = shown
    previous = labelled(pg, "previous-token")
    s = oracle(model_and_probe, previous)
    moved = (s.off.weights[:, 0] - s.intact.weights[:, 0]).abs().sum(dim=(-1, -2))  # (L, h)
    want = max(labelled(pg, "induction"), key=lambda lh: float(moved[lh]))
    assert pg.input_value("#switch-head") == f"{want[0]}.{want[1]}"
    layer, head = want
    for run, r in (("intact", s.intact), ("switched_off", s.off)):
        assert answer[run]["weights"] == r.weights[:, 0].numpy().round(4).tolist()
    captions = pg.locator("#switch-patterns figcaption").all_inner_texts()
    off = ", ".join(f"{l}.{i}" for l, i in previous)
    assert captions == [f"head {layer}.{head}, intact", f"head {layer}.{head}, with {off} off"]
    assert pg.locator("#switch-patterns svg.heatmap").count() == 2
    # another head is drawn when picked
    pg.select_option("#switch-head", "0.1" if (layer, head) != (0, 1) else "0.2")
    expect(pg.locator("#switch-patterns figcaption").first).not_to_have_text(captions[0])


def test_every_next_token_guess_is_the_librarys(shown, model_and_probe) -> None:
    pg, _ = shown
    _, tokenizer, probe = model_and_probe
    s = oracle(model_and_probe, labelled(pg, "previous-token"))
    rows = pg.locator("#switch-predictions tbody tr")
    assert rows.count() == probe.n
    changed = 0
    for i in range(probe.n):
        cells = rows.nth(i).locator("td").all_inner_texts()
        want = []
        for r in (s.intact, s.off):
            token = tokenizer.token_strings([int(r.top_ids[0, i, 0])])[0]
            want.append(f'"{token}" {float(r.top_probs[0, i, 0]):.2f}')
        assert cells[3:] == want, i
        changed += int(s.intact.top_ids[0, i, 0] != s.off.top_ids[0, i, 0])
    summary = pg.inner_text("#switch-predictions summary")
    assert f"({changed} of {probe.n} changed" in summary
    assert pg.locator("#switch-predictions tbody strong").count() == changed


def test_a_set_zeroed_shows_the_librarys_numbers(shown, model_and_probe) -> None:
    """Two heads picked by hand, zeroed: the losses shown are switch_off's for that set; the
    panel says what switching off means in both modes."""
    pg, _ = shown
    meaning = pg.inner_text("#switch-meaning")
    assert "average output over the whole text" in meaning and "zeros" in meaning
    # the words it leans on link to the page's glossary
    assert pg.locator('#switch-meaning a[href="#term-ablation"]').count() == 1
    assert pg.locator('#switch-loss a[href="#term-nats"]').count() == 1
    pg.click("#switch-clear")
    pg.click('#switch-heads button[data-off="0.3"]')
    pg.click('#switch-heads button[data-off="1.3"]')
    pg.check("#switch-mode-zero")
    with pg.expect_response(lambda r: r.url.endswith("/api/switch-off")) as info:
        pg.click("#switch-run")
    assert info.value.json()["off"] == [[0, 3], [1, 3]]
    s = oracle(model_and_probe, [(0, 3), (1, 3)], "zero")
    expect(pg.locator("#switch-summary")).to_contain_text("with 0.3, 1.3 switched off")
    assert shown_loss(pg, "repeat") == loss_text(s.losses()["repeat"])
    assert shown_loss(pg, "all") == loss_text(s.losses()["all"])
    # back to the module's state for the tests after this one
    pg.click("#switch-previous")
    pg.check("#switch-mode-mean")
    with pg.expect_response(lambda r: r.url.endswith("/api/switch-off")):
        pg.click("#switch-run")
    off = ", ".join(f"{l}.{i}" for l, i in labelled(pg, "previous-token"))
    expect(pg.locator("#switch-summary")).to_contain_text(f"with {off} switched off")
    assert pg.errors == []


def test_the_panel_fits_the_viewport(shown) -> None:
    pg, _ = shown
    for sel in ("#switch-box", "#switch-heads", "#switch-loss", "#switch-induction"):
        el = pg.locator(sel).first
        el.scroll_into_view_if_needed()
        box = el.bounding_box()
        assert box is not None, sel
        assert box["x"] >= 0 and box["x"] + box["width"] <= pg.width + 0.5, (sel, box, pg.width)
    for fig in pg.locator("#switch-patterns figure").all():
        fig.scroll_into_view_if_needed()
        box = fig.bounding_box()
        assert box["x"] >= 0 and box["x"] + box["width"] <= pg.width + 0.5, (box, pg.width)
    assert pg.evaluate("document.documentElement.scrollWidth") <= pg.width


def test_axe_finds_nothing_serious_in_the_panel(shown) -> None:
    from axe_playwright_python.sync_playwright import Axe
    from test_browser_learners import serious

    pg, _ = shown
    results = Axe().run(pg, context="#switch-box").response
    assert results["passes"], "axe ran no checks"
    assert serious(results) == []


def test_a_new_input_clears_the_last_result(shown) -> None:
    """Never a stale answer: once the head viewer runs on another text, the panel's result for
    the old one is gone until it runs again (this test runs last: it leaves the panel empty)."""
    pg, _ = shown
    pg.fill("#heads-text", "One two three. One two three.")
    with pg.expect_response(lambda r: r.url.endswith("/api/heads")):
        pg.click("#heads-run")
    expect(pg.locator("#switch-loss")).to_have_count(0)
    with pg.expect_response(lambda r: r.url.endswith("/api/switch-off")) as info:
        pg.click("#switch-run")
    body = info.value.request.post_data_json
    assert body["probe"] == "text" and body["text"] == "One two three. One two three."
    expect(pg.locator("#switch-summary")).to_contain_text(" switched off (each replaced")
    assert pg.errors == []


def test_random_tokens_repeated_count_every_sequence(shown, model_and_probe) -> None:
    """On the head viewer's random tokens repeated (four sequences), the losses shown are the
    library's over all of them, and the panel says the tables show the first (runs last)."""
    from headlab.measure import build_probe

    pg, _ = shown
    model, tokenizer, _ = model_and_probe
    with pg.expect_response(lambda r: r.url.endswith("/api/heads")):
        pg.select_option("#heads-probe", "random-repeat")
    expect(pg.locator("#switch-loss")).to_have_count(0)
    pg.click("#switch-previous")
    previous = labelled(pg, "previous-token")
    with pg.expect_response(lambda r: r.url.endswith("/api/switch-off")):
        pg.click("#switch-run")
    c = model.config
    probe = build_probe("random-repeat", tokenizer, c.max_len, c.vocab_size, seed=0)
    s = oracle((model, tokenizer, probe), previous)
    loss = s.losses()
    expect(pg.locator("#switch-sequences")).to_have_text(
        f"The losses are over all {probe.tokens.shape[0]} of the input's sequences; the tables "
        "below show the first."
    )
    assert shown_loss(pg, "repeat") == loss_text(loss["repeat"])
    assert shown_loss(pg, "all") == loss_text(loss["all"])
    said = pg.inner_text('#switch-loss [data-loss="repeat"]')
    assert f"the {loss['repeat']['rows']} positions" in said
    assert pg.locator("#switch-predictions tbody tr").count() == probe.n
    assert pg.errors == []
