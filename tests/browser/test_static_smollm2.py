"""SmolLM2 in the static site (`headlab static OUT --model smollm2`), in a real headless
Chromium, every request outside the site blocked: picked in the head viewer, its 4-bit graph
downloads with a progress bar in bytes, is kept by the browser's cache, and gives every head's
scores within 1e-4 of `headlab heads --model smollm2 --json --no-floors` and the same labels
(by the thresholds alone, as the page says), and one layer's attention weights within 1e-4 of
headlab's own run of the model."""

from __future__ import annotations

import itertools
import json
import random
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from playwright.sync_api import expect
from test_static_site import (
    RECORD_SWITCH,
    ROOT,
    _env,
    check_switched,
    drawn_weights,
    open_site,
    run_sentence,
    served,
)

pytestmark = [pytest.mark.browser, pytest.mark.slow]
# the words of the sentences these tests type (no other test has them): a repeat, a comma, a
# number, a rare word and a name, so that most score types have rows to act on
WORDS = "heron lantern drifted over the marsh , and 19 quiet herons drifted ; Ottoline saw"
WORDS += " tram lanterns whisper"


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The site with SmolLM2 added, built by the command line (npm ci first, if needed)."""
    from headlab import zoo

    if not zoo.is_fetched("smollm2"):
        pytest.skip("SmolLM2 is not fetched here: headlab models --fetch smollm2")
    if not (ROOT / "web" / "node_modules" / "onnxruntime-web").is_dir():
        subprocess.run(
            ["npm", "ci", "--no-audit", "--no-fund", "--ignore-scripts"],
            cwd=ROOT / "web",
            check=True,
        )
    out = tmp_path_factory.mktemp("static") / "site"
    cmd = [sys.executable, "-m", "headlab.cli", "static", str(out), "--model", "smollm2"]
    done = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr
    return out


@pytest.fixture(scope="module")
def origin(site: Path) -> Iterator[str]:
    yield from served(site)


@pytest.fixture(scope="module")
def page(browser, origin: str) -> Iterator[object]:
    """The site with SmolLM2 picked in the head viewer (downloaded once, then cached); the
    page records every URL it asks for in ``page.asked``."""
    pg = open_site(browser, origin)
    pg.asked = []
    pg.on("request", lambda r: pg.asked.append(r.url))
    yield pg
    pg.context.close()


def pick_smollm2(page) -> None:
    """Pick SmolLM2 in the head viewer's model menu and wait until its first run is drawn: its
    30 × 9 heads in the grid, the download's line saying it runs here."""
    page.select_option("#heads-model", "smollm2")
    page.wait_for_function(
        """() => document.querySelectorAll("#heads-grid button[data-head]").length === 270
            && /runs in your browser/.test(
                document.querySelector("#model-download-text")?.textContent)""",
        timeout=600_000,
    )


def _texts(count: int, seed: int) -> list[str]:
    rng, words = random.Random(seed), WORDS.split()
    return [" ".join(rng.choice(words) for _ in range(rng.randint(6, 14))) for _ in range(count)]


def test_picked_it_downloads_with_a_bar_then_runs_from_the_cache(browser, origin, site) -> None:
    """Nothing of SmolLM2 is fetched until it is picked; then its files, each under 50 MB, come
    with a progress bar that reaches their total; a second visit reads them from the browser's
    cache; no request leaves the site."""
    config = json.loads((site / "static/offline/smollm2/config.json").read_text())
    total = sum(f["bytes"] for f in config["files"])
    assert all(f["bytes"] < 50_000_000 for f in config["files"]), config["files"]
    assert len(config["files"]) >= 3
    pg = open_site(browser, origin)
    asked: list[str] = []
    pg.on("request", lambda r: asked.append(r.url))
    try:
        assert not [u for u in asked if "/smollm2/" in u]
        said = pg.inner_text("#server-status")  # the page's first line names it, and the rule
        assert "smollm2, downloaded when you pick it" in said and "thresholds alone" in said
        pick_smollm2(pg)
        bar = pg.eval_on_selector(
            "#model-download-bar", "b => [Number(b.max), Number(b.value), b.hidden]"
        )
        assert bar == [total, total, True]  # full, and hidden once the model is ready
        said = pg.inner_text("#model-download-text")
        assert "thresholds alone" in said and "--no-floors" in said
        fetched = {u.rsplit("/", 1)[1] for u in asked if "/smollm2/" in u}
        assert {f["name"] for f in config["files"]} <= fetched
        pg.reload()
        pg.wait_for_selector("#heads-grid button[data-head]", timeout=60_000)
        pick_smollm2(pg)
        assert "from this browser's cache" in pg.inner_text("#model-download-text")
        assert pg.errors == []
    finally:
        pg.context.close()


def _cli(text: str) -> dict:
    cmd = [sys.executable, "-m", "headlab.cli", "heads", "--model", "smollm2", "--text", text]
    done = subprocess.run(
        [*cmd, "--json", "--no-floors"], env=_env(), capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr
    answer: dict = json.loads(done.stdout)
    return answer


def near_a_threshold(scores: dict[str, float], margin: float = 0.01) -> bool:
    """Whether a head's label could turn on a rounding: a score of the label's tiers within
    ``margin`` of its threshold, or two passing scores of a tier whose shares of the way to 1
    are within ``margin`` (the labelling rule picks the wider one)."""
    from headlab.heads.labels import THRESHOLDS, TIERS

    for tier in TIERS:
        kinds = [k for k in tier if k in scores]
        if any(abs(scores[k] - THRESHOLDS[k]) <= margin for k in kinds):
            return True
        passing = sorted(
            (scores[k] - THRESHOLDS[k]) / (1 - THRESHOLDS[k])
            for k in kinds
            if scores[k] >= THRESHOLDS[k]
        )
        if any(b - a <= margin for a, b in itertools.pairwise(passing)):
            return True
    return False


def test_scores_and_labels_equal_headlab_heads_no_floors(page) -> None:
    """On sentences no other test types, every head's scores within 1e-4 of the command line's
    (which rounds to 4 places), and every label equal wherever no deciding score is within
    0.01 of its threshold; the answer says it labels by the thresholds alone."""
    pick_smollm2(page)
    near = 0
    for text in _texts(2, seed=4646):
        got = page.evaluate(
            """async (text) => (await fetch("/api/heads", { method: "POST",
                body: JSON.stringify({ model: "smollm2", text }) })).json()""",
            text,
        )
        cli = _cli(text)
        assert got["ids"] == cli["ids"], text
        assert got["floors"] is None and not cli["labels_gated"]
        assert (
            got["label_rule"].startswith("threshold only") and "--no-floors" in got["floors_note"]
        )
        assert len(got["heads"]) == len(cli["heads"]) == 30 * 9
        for mine, theirs in zip(got["heads"], cli["heads"], strict=True):
            where = (text, theirs["layer"], theirs["head"])
            assert (mine["layer"], mine["head"]) == (theirs["layer"], theirs["head"])
            assert mine["scores"].keys() == theirs["scores"].keys(), where
            for kind, value in theirs["scores"].items():
                assert abs(mine["scores"][kind] - value) <= 1e-4, (*where, kind)
            if near_a_threshold(theirs["scores"]):
                near += 1
            else:
                assert mine["label"] == theirs["label"], where
    print(f"heads with a deciding score within 0.01 of its threshold: {near} of {2 * 270}")
    assert page.errors == []


def test_one_layers_attention_equals_headlabs_and_the_grid_groups_gqa(page, tmp_path) -> None:
    """The head viewer's drawn weights (its figures' own JSON) of every head of one layer equal
    headlab's run of SmolLM2 to 1e-4; the grid has 30 × 9 heads and names the 3 K/V groups."""
    from headlab import zoo
    from headlab.measure import run_patterns

    pick_smollm2(page)
    model, tokenizer = zoo.load("smollm2")
    text = _texts(1, seed=4647)[0]
    run_sentence(page, text)
    ids = tokenizer.encode(text)
    want = run_patterns(model, torch.tensor([ids]))[:, 0]  # (L, h, n, n)
    layer = 17
    for head in range(9):  # the grid opens one layer at a time: open this one first
        page.eval_on_selector(
            f'#heads-grid details[data-layer="{layer}"]', "d => { d.open = true; }"
        )
        got = drawn_weights(page, layer, head, tmp_path)
        assert got["tokens"] == tokenizer.token_strings(ids)
        diff = (torch.tensor(got["weights"]) - want[layer, head]).abs().max().item()
        assert diff < 1e-4, (layer, head, diff)
    buttons = page.eval_on_selector_all("#heads-grid button[data-head]", "bs => bs.length")
    groups = page.eval_on_selector_all("#heads-grid .kv-group", "gs => gs.length")
    assert (buttons, groups) == (30 * 9, 30 * 3)
    assert "among 3 query heads" in page.inner_text("#heads-widget")
    assert page.errors == []


def test_a_text_past_the_sites_length_says_the_server_takes_more(page) -> None:
    pick_smollm2(page)
    run_sentence(page, "heron " * 200)
    said = page.inner_text("#heads-status")
    assert "at most 128 in this static site (`headlab serve` takes up to 8192)" in said, said


# the heads each mode switches off (a previous-token head that feeds an induction head, and
# heads of the first and last layers); the sentence is drawn from WORDS with a seed of its own
SWITCH_SETS = {"mean": [(0, 3), (16, 0), (29, 8)], "zero": [(2, 1), (5, 7), (16, 0), (18, 7)]}


def test_switching_smollm2s_heads_off_equals_the_librarys(page, site: Path) -> None:
    """The switch-off panel runs SmolLM2 in the browser (it once said SmolLM2's needs the
    server): its graph (a few MB) reads the 4-bit blocks already downloaded for the head viewer,
    and for a set of heads switched off by their mean and another zeroed it gives what
    headlab.heads.switch.switch_off gives in PyTorch: the same five likeliest next tokens at
    every position, their probabilities and both mean losses within 1e-4, each position's loss
    within 1e-4 of its size, every head's pattern and induction score within 1e-4; the panel
    shows those losses; no weights are fetched again. Its picker's folded layers count the
    heads picked in each, and picking the previous-token heads opens the layers that hold them."""
    from headlab import zoo
    from headlab.heads.switch import switch_off
    from headlab.measure import text_probe

    config = json.loads((site / "static/offline/smollm2/config.json").read_text())
    shards = {f["name"] for f in config["files"]}
    assert config["switch"]["external_data"] and set(config["switch"]["external_data"]) <= shards
    assert config["switch"]["bytes"] < 20_000_000  # the blocks are the head viewer's, not again
    model, tokenizer = zoo.load("smollm2")
    text = " ".join(_texts(2, seed=4648))
    probe = text_probe(tokenizer, text, 128)
    if page.input_value("#heads-model") != "smollm2":  # picked by an earlier test, or not
        pick_smollm2(page)
    run_sentence(page, text)
    page.wait_for_function(
        """() => document.querySelectorAll("#switch-heads button[data-off]").length === 270"""
    )
    page.locator("#switch-box").scroll_into_view_if_needed()
    expect(page.locator("#switch-host-note")).to_have_count(0)
    page.evaluate(RECORD_SWITCH)
    asked = len(page.asked)
    for mode, heads in SWITCH_SETS.items():
        page.click("#switch-clear")
        for layer, head in heads:
            page.eval_on_selector(
                f'#switch-heads button[data-off="{layer}.{head}"]',
                "b => { b.closest('details').open = true; b.click(); }",
            )
        for layer in range(30):  # each layer's line counts its heads picked
            picked = sum(1 for l, _ in heads if l == layer)
            summary = page.inner_text(f'#switch-heads details[data-layer="{layer}"] summary')
            assert summary == (f"layer {layer} · {picked} picked" if picked else f"layer {layer}")
        page.check(f"#switch-mode-{mode}")
        page.click("#switch-run")
        names = ", ".join(f"{l}.{i}" for l, i in heads)
        expect(page.locator("#switch-summary")).to_contain_text(
            f"with {names} switched off", timeout=300_000
        )
        answer = page.evaluate("() => window.switched.at(-1)")
        want = switch_off(model, probe, heads, mode)
        assert answer["model"] == "smollm2" and answer["ids"] == probe.tokens[0].tolist()
        # a position's loss within 1e-4 of its size: a loss of 12.8 nats (a guess of
        # p = 3e-6) was 1.8e-4 (1.4e-5 of it) apart after 30 layers of float32 rounding
        check_switched(page, answer, want, heads, mode, tokenizer, loss_scale=True)
    page.click("#switch-previous")  # the layers holding the heads it picks open
    pressed = page.locator('#switch-heads button[aria-pressed="true"]')
    assert pressed.count() > 0
    assert all(b.is_visible() for b in pressed.all())
    fetched = [u.rsplit("/", 1)[1] for u in page.asked[asked:] if "/smollm2/" in u]
    assert fetched.count(config["switch"]["graph"]) <= 1  # once, and no shard again
    assert not set(fetched) & shards, fetched
    assert page.errors == []
