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
    want = {k: v for k, v in fields.items() if k in ("n_heads", "seq_len", "batch")}
    if "n_heads" in want:  # the table's query row shows h once the answer is drawn
        q = pg.locator('#shapes-table tr[data-stage="q"] td.shape').nth(1)
        expect(q).to_contain_text(f", {want['n_heads']}, ")


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
