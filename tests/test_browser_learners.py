"""The explainer as a learner meets it, in the same headless Chromium as test_browser.py: the
shape widget's cards say what the API says, the layer diagram follows the sizes, the head view's
labels stay readable, and the page passes axe-core.

One server and one browser serve the whole module; most tests share one loaded page (each sets
the inputs it reads), so the model runs a few times, not once per test.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from playwright.sync_api import expect

import test_browser

pytestmark = [pytest.mark.browser, pytest.mark.slow]
# the same module-scoped fixtures (Chromium with its flags, a server on a free port), one per module
browser = test_browser.browser
server = test_browser.server
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
