"""What fell apart on a phone's 390 px, in headless Chromium on the served page: the head viewer's
evidence box, whose label (a sentence with links to the glossary) was laid out as a flex row, one
narrow column per text node and link."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from conftest import available_model, require, watched_page

pytestmark = [pytest.mark.browser, pytest.mark.slow]

# the label's height in lines, and the fewest lines its words take in the label's width: its
# words measured on one line (a copy that does not wrap), and that line's height
LINES = """(label) => {
  const copy = label.cloneNode(true);
  copy.removeAttribute("for");
  copy.querySelectorAll("[id]").forEach((e) => e.removeAttribute("id"));
  Object.assign(copy.style, { position: "absolute", display: "inline-block", whiteSpace: "nowrap",
    visibility: "hidden", width: "auto", maxWidth: "none" });
  label.parentElement.append(copy);
  const one = copy.getBoundingClientRect();
  copy.remove();
  const box = label.getBoundingClientRect();
  return { lines: box.height / one.height, fewest: Math.ceil(one.width / box.width),
           width: box.width, words: label.textContent.length };
}"""


@pytest.mark.parametrize("width", [390])
def test_the_evidence_label_wraps_as_one_sentence(browser, server: str, width: int) -> None:
    """The evidence box's label runs as one sentence that wraps across the label's width: it
    takes at most one line more than its words need at that width (laid out in columns it took
    4.8 lines where its words needed 2), and it fits the screen."""
    require(available_model() is not None, "no model available for the page")
    context, pg = watched_page(browser, width)
    try:
        pg.goto(server + "/")
        label = pg.locator('label[for="heads-evidence"]')
        expect(label).to_be_visible(timeout=60_000)
        label.scroll_into_view_if_needed()
        got = label.evaluate(LINES)
        assert got["words"] > 60 and got["fewest"] >= 2, got  # a sentence that must wrap
        assert got["lines"] <= got["fewest"] + 1, got
        box = label.bounding_box()
        assert box["x"] >= 0 and box["x"] + box["width"] <= width + 0.5, box
        assert pg.errors == []
    finally:
        context.close()
