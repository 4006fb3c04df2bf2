"""While the evidence is computed the head widget's status line names the step under way, the
seconds so far and the time expected, at a desktop's and a phone's width, in the same headless
Chromium as test_browser.py. The server (this process's, conftest.server) is held inside the
composition step until the page has shown it, so what is checked never depends on timing."""

from __future__ import annotations

import threading

import pytest
from playwright.sync_api import expect

from conftest import watched_page

pytestmark = [pytest.mark.browser, pytest.mark.slow]


@pytest.mark.parametrize("width", [1280, 390])
def test_the_status_names_the_step_under_way(browser, server: str, monkeypatch, width) -> None:
    from headlab.heads import evidence

    go, reached = threading.Event(), threading.Event()
    real = evidence.composition_scores

    def held(model, on_disk=False):
        reached.set()
        go.wait(timeout=600)
        return real(model, on_disk=on_disk)

    monkeypatch.setattr(evidence, "composition_scores", held)
    context, pg = watched_page(browser, width)
    try:
        pg.set_default_timeout(300_000)
        pg.goto(server + "/")
        pg.wait_for_selector("#heads-grid button[data-head]")
        pg.locator("#heads-evidence").check()
        status = pg.locator("#heads-status")
        expect(status).to_contain_text("composition scores", timeout=300_000)
        assert reached.is_set()
        text = status.text_content() or ""
        assert "so far" in text and "expected about" in text, text
        assert "a few seconds" not in (pg.locator("#heads-form").text_content() or "")
        go.set()
        pg.wait_for_selector("#evidence-card")
        expect(status).not_to_contain_text("composition scores")
        assert pg.errors == []
    finally:
        go.set()
        context.close()
