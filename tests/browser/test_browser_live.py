"""The "train it yourself" panel in a real headless Chromium: Train starts a run on the server,
the curves grow, the phase change is marked, and the final scores are those of the experiment's
own library call with the same seed and recipe."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import asdict

import pytest
from playwright.sync_api import expect

from conftest import watched_page

pytestmark = [pytest.mark.browser, pytest.mark.slow]
RUN_SECONDS = 900_000  # ms: a whole run on a busy shared machine


@pytest.fixture
def live_page(browser, server: str):
    context, pg = watched_page(browser)
    pg.goto(server + "/")
    pg.wait_for_selector("#live-train")
    yield pg
    context.close()


def _points(page) -> int:
    return int(page.get_attribute("#live-losses", "data-points") or 0)


def wait_points(page, at_least: int) -> int:
    """Poll (from Python: the page's CSP forbids evaluated strings) until the loss chart has
    ``at_least`` evaluation points; returns how many it has."""
    deadline = time.monotonic() + RUN_SECONDS / 1000
    while (n := _points(page)) < at_least:
        assert time.monotonic() < deadline, f"the chart stayed at {n} points"
        page.wait_for_timeout(100)
    return n


def test_train_draws_the_phase_change_and_ends_with_the_librarys_scores(
    live_page, induction_quick
) -> None:
    """The thread picker offers what the server serves; during the run the phase-change window
    is marked provisional, at the end final; the last message names the steps, the wall time
    and the threads (auto's pick, and why), and the final scores are the library's on those
    threads; no colour means two things across the two live charts."""
    import re

    import httpx

    from headlab.experiments import induction as ind

    page = live_page
    base = page.url.rstrip("/")
    knob = httpx.get(base + "/api/live").json()["knobs"]["threads"]
    offered = page.locator("#live-threads option").evaluate_all("os => os.map(o => o.value)")
    assert offered == [str(c["value"]) for c in knob["choices"]] and offered[:3] == [
        "auto",
        "1",
        "2",
    ]
    assert page.input_value("#live-threads") == "auto"
    page.fill("#live-seed", "0")
    page.click("#live-train")
    expect(page.locator("#live-status")).to_contain_text("torch thread", timeout=60_000)
    seen = wait_points(page, 2)
    wait_points(page, seen + 3)  # the curves grow while the run trains
    assert page.locator("#live-scores svg polyline").count() >= 8  # 4 induction + 4 prev-token
    phase = page.locator("#live-phase")
    expect(phase).to_have_attribute("data-state", "provisional", timeout=RUN_SECONDS)
    expect(phase).to_contain_text("Phase change so far: steps ")
    expect(phase).to_contain_text("may still move until the run ends")
    assert page.get_attribute("#live-verdict", "data-final") is None  # still training
    assert page.locator('#live-losses svg rect[fill="#E69F00"]').count() == 1  # window shaded
    page.wait_for_selector("#live-verdict-text", timeout=RUN_SECONDS)
    expect(phase).to_have_attribute("data-state", "final", timeout=60_000)
    assert "may still move" not in phase.inner_text() and "(final)" in phase.inner_text()
    status = page.locator("#live-status")
    expect(status).to_contain_text("finished", timeout=60_000)
    said = re.search(r"finished: (\d+) steps in (\d+\.\d) s on (\d+) torch threads? \((.+?)\)\.",
                     status.inner_text())  # fmt: skip
    assert said, status.inner_text()
    threads = int(said[3])
    assert int(said[1]) == ind.LIVE.steps and float(said[2]) > 0
    # auto's reason, or the server's setting (a test worker fixes it to its share of the cores)
    assert said[4].startswith(("auto: load average ", "set by headlab serve --live-threads"))
    assert threads == int(page.get_attribute("#live-train-widget", "data-threads") or 0)
    assert page.locator("#live-patterns svg.heatmap").count() == 2
    n = ind.LIVE.seq_len  # the whole context in view: every query against every key, no window
    for heat in page.locator("#live-patterns svg.heatmap").all():
        assert heat.get_attribute("data-n") == str(n)
        assert heat.locator("rect[data-i]").count() == n * n
        assert heat.locator(".hv-map").count() == 0
    strokes = page.locator("#live-losses svg g[data-series] polyline, "
                           "#live-scores svg g[data-series] polyline").evaluate_all(
        "ls => ls.map(l => getComputedStyle(l).stroke)")  # fmt: skip
    assert len(strokes) >= 3 + 8 + 1 and len(set(strokes)) == len(strokes), strokes
    shown = json.loads(page.get_attribute("#live-verdict", "data-final"))

    # `headlab experiment induction --quick --seed 0 --threads N`, N the threads the run used
    library, _, _ = induction_quick(threads)  # ind.run(quick=True, seed=0, threads=threads)
    assert library["config"] == asdict(ind.LIVE) and library["threads"] == threads
    assert shown["induction"] == library["final"]["induction"]
    assert shown["prev_token"] == library["final"]["prev_token"]
    assert shown["phase_change"]["window"] == library["phase_change"]["window"]
    assert library["verdict"]["circuit"]
    assert page.inner_text("#live-verdict-text") == library["verdict"]["text"]
    # the wall time to the window's end, as the server measured it for this run
    assert shown["seconds"] > 0
    assert f"over {shown['seconds']:.1f} s after training started" in phase.inner_text()
    assert page.errors == []
    assert not [t for t in threading.enumerate() if t.name.startswith("live-")]


def test_bad_knob_and_cancel_from_the_page(live_page) -> None:
    page = live_page
    page.fill("#live-seed", "-3")
    page.click("#live-train")
    expect(page.locator("#live-status")).to_contain_text("Not started: seed", timeout=30_000)
    page.fill("#live-seed", "5")
    page.select_option("#live-layers", "1")
    page.select_option("#live-threads", "1")
    page.click("#live-train")
    expect(page.locator("#live-status")).to_contain_text("on 1 torch thread (as picked)")
    wait_points(page, 1)
    page.click("#live-cancel")
    status = page.locator("#live-status")
    expect(status).to_contain_text("stopped: cancelled, after ", timeout=60_000)
    expect(status).to_contain_text("steps in ")
    expect(status).to_contain_text(" s on 1 torch thread (as picked).")
    expect(page.locator("#live-train")).to_be_enabled()
    # the one error is the browser's own log line for the refused request
    assert [e for e in page.errors if "status of 422" not in e] == []
