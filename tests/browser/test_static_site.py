"""The static site (`headlab static`) in a real headless Chromium: served by a plain
http.server on 127.0.0.1 with every other request blocked, the default model runs in the browser
(onnxruntime-web) and draws PyTorch's weights; the tokenizer equals Python's; axe finds nothing
serious."""

from __future__ import annotations

import functools
import http.server
import json
import os
import random
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import test_browser
import torch
from playwright.sync_api import expect

pytestmark = [pytest.mark.browser, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]
SENTENCE = "Mary gave the red kite to John, and then Mary gave the red kite to Sue."


def _env() -> dict[str, str]:
    """This checkout's package first (and whatever the caller's PYTHONPATH adds)."""
    path = os.pathsep.join(p for p in (str(ROOT / "src"), os.environ.get("PYTHONPATH")) if p)
    return {**os.environ, "PYTHONPATH": path}


@pytest.fixture(scope="session")
def site(tmp_path_factory) -> Path:
    """The site, built by the same command `make static` runs (npm ci first, if needed)."""
    if not (ROOT / "web" / "node_modules" / "onnxruntime-web").is_dir():
        subprocess.run(
            ["npm", "ci", "--no-audit", "--no-fund", "--ignore-scripts"],
            cwd=ROOT / "web",
            check=True,
        )
    out = tmp_path_factory.mktemp("static") / "site"
    cmd = [sys.executable, "-m", "headlab.cli", "static", str(out)]
    done = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return out


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass


def served(site: Path) -> Iterator[str]:
    """The folder ``site`` served over HTTP on a free port of this machine: its origin."""
    handler = functools.partial(_Quiet, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="session")
def origin(site: Path) -> Iterator[str]:
    yield from served(site)


def open_site(browser, origin: str, width: int = 1280) -> object:
    """A page on the site, ``width`` pixels wide; every request outside ``origin`` is blocked and
    recorded in ``page.errors`` with console and page errors."""
    context = browser.new_context(viewport={"width": width, "height": 900}, accept_downloads=True)
    pg = context.new_page()
    pg.errors = []

    def gate(route) -> None:
        url = route.request.url
        if url.startswith((origin + "/", "data:", "blob:")):
            route.continue_()
        else:
            pg.errors.append(f"request outside the site: {url}")
            route.abort()

    context.route("**/*", gate)
    pg.on("console", lambda m: m.type == "error" and pg.errors.append(f"console: {m.text}"))
    pg.on("pageerror", lambda e: pg.errors.append(f"pageerror: {e}"))
    pg.goto(origin + "/")
    pg.wait_for_selector("#heads-grid button[data-head]", timeout=60_000)
    return pg


@pytest.fixture(scope="session")
def page(browser, origin: str) -> Iterator[object]:
    pg = open_site(browser, origin)
    yield pg
    pg.context.close()


def run_sentence(page, text: str) -> None:
    if page.input_value("#heads-probe") != "text":
        page.select_option("#heads-probe", "text")
    page.fill("#heads-text", text)
    page.eval_on_selector("#heads-status", "e => { e.textContent = ''; }")
    page.click("#heads-run")
    page.wait_for_function(
        "() => { const t = document.querySelector('#heads-status').textContent;"
        " return t !== '' && t !== 'Running the model…'; }"
    )


def drawn_weights(page, layer: int, head: int, tmp_path: Path) -> dict:
    """The weights the head viewer draws for one head: its figure's own JSON export."""
    page.click(f'#heads-grid button[data-head="{layer}.{head}"]')
    fig = page.locator(f'#heads-view figure[data-figure="head-{layer}-{head}"]')
    with page.expect_download() as info:
        fig.locator('button[data-export="json"]').click()
    path = tmp_path / f"{layer}-{head}.json"
    info.value.save_as(path)
    data: dict = json.loads(path.read_text())
    return data


def test_typed_sentence_draws_pytorchs_weights(page, tmp_path: Path) -> None:
    from headlab import zoo
    from headlab.measure import run_patterns

    model, tokenizer = zoo.load("default")
    run_sentence(page, SENTENCE)
    ids = tokenizer.encode(SENTENCE)
    want = run_patterns(model, torch.tensor([ids]))[:, 0]  # (L, h, n, n)
    L, h = want.shape[:2]
    for layer in range(L):
        for head in range(h):
            got = drawn_weights(page, layer, head, tmp_path)
            assert got["tokens"] == tokenizer.token_strings(ids)
            diff = (torch.tensor(got["weights"]) - want[layer, head]).abs().max().item()
            assert diff < 1e-5, (layer, head, diff)
    assert page.errors == []


# new sentences typed into the head viewer: a repeat, punctuation, a rare word, digits
TYPED = [
    "The quiet heron waded, then the quiet heron waited.",
    "Zebras, quokkas and axolotls: 3 rare friends!",
    "one two one two one two",
]


def drawn_labels(page) -> list[str]:
    """Every head's label as the head viewer's layer.head menu lists it ("0.3 induction")."""
    options = page.eval_on_selector_all("#heads-which option", "os => os.map(o => o.textContent)")
    return [o.split(" ", 1)[1] if " " in o else "" for o in options]


def test_typed_sentence_labels_equal_analyse(page) -> None:
    """Type a sentence: the labels drawn equal analyse with the random-weights floors; the
    threshold-only answer ("floors": false) equals analyse without them, scores within 1e-5."""
    from headlab import zoo
    from headlab.heads import analyse
    from headlab.heads.baselines import baselines
    from headlab.measure import text_probe

    model, tokenizer = zoo.load("default")
    for text in TYPED:
        probe = text_probe(tokenizer, text, model.config.max_len)
        gated = analyse(model, probe, floors=baselines(model, probe, shuffled=False).floors())
        run_sentence(page, text)
        assert drawn_labels(page) == [s.label for s in gated.heads], text
        got = page.evaluate(
            """async (text) => (await fetch("/api/heads", { method: "POST",
                body: JSON.stringify({ text, probe: "text", floors: false }) })).json()""",
            text,
        )
        plain = analyse(model, probe)
        assert [r["label"] for r in got["heads"]] == [s.label for s in plain.heads], text
        for row, want in zip(got["heads"], plain.heads, strict=True):
            for kind, value in want.scores.items():
                assert abs(row["scores"][kind] - value) <= 1e-5, (text, kind)
    assert page.errors == []


def _cli_heads(text: str, floors: bool) -> dict:
    """`headlab heads --model default --text TEXT --json` (with --no-floors when not floors)."""
    rule = [] if floors else ["--no-floors"]
    cmd = [sys.executable, "-m", "headlab.cli", "heads", "--model", "default", "--text", text]
    cmd += ["--json", *rule]
    done = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    answer: dict = json.loads(done.stdout)
    return answer


# the words of the sentences the CLI test draws (none of the sentences above): repeats,
# punctuation, digits, rare and unknown words, a clitic, an accent
CLI_WORDS = "kestrel harbour the the lantern mossy , ; ! 42 7 tram glimmered obsidian"
CLI_WORDS += " Ottoline's café under over a quince zugzwang"


def test_scores_and_labels_equal_headlab_heads_json(page) -> None:
    """On seeded sentences no other test types, the page's scores and labels equal
    `headlab heads --json`'s (the command line's own run of the library), gated by the
    random-weights floors and with --no-floors, the floors too: the browser's numbers come
    from the exported graphs of the same definition."""
    from headlab import zoo

    model, tokenizer = zoo.load("default")
    rng, words, texts = random.Random(4404), CLI_WORDS.split(), []
    while len(texts) < 5:  # sentences that fit the model's 64 tokens
        text = " ".join(rng.choice(words) for _ in range(rng.randint(3, 24)))
        if len(tokenizer.encode(text)) <= model.config.max_len:
            texts.append(text)
    for text in texts:
        answers = page.evaluate(
            """async (text) => Promise.all([true, false].map(async (floors) => (await fetch(
                "/api/heads", { method: "POST", body: JSON.stringify({ text, floors }) }))
                .json()))""",
            text,
        )
        for got, floors in zip(answers, (True, False), strict=True):
            cli = _cli_heads(text, floors)
            assert got["ids"] == cli["ids"], text
            for mine, theirs in zip(got["heads"], cli["heads"], strict=True):
                where = (text, floors, theirs["layer"], theirs["head"])
                assert (mine["layer"], mine["head"]) == (theirs["layer"], theirs["head"])
                assert mine["label"] == theirs["label"], where
                assert mine["offset"] == theirs["offset"], where
                assert mine["scores"].keys() == theirs["scores"].keys(), where
                for kind, value in theirs["scores"].items():  # the CLI rounds to 4 places
                    assert abs(mine["scores"][kind] - value) <= 5e-5 + 1e-5, (*where, kind)
            if floors:
                assert cli["labels_gated"] and got["floors"], text
                for layer, row in cli["floors"].items():
                    for kind, value in row.items():
                        assert abs(got["floors"][layer][kind] - value) <= 5e-5 + 1e-5, text
            else:
                assert not cli["labels_gated"] and got["floors"] is None, text
    bad = page.evaluate(
        """async () => { const r = await fetch("/api/heads", { method: "POST",
            body: JSON.stringify({ text: "a b", floors: "yes" }) });
            return [r.status, (await r.json()).detail]; }"""
    )
    assert bad[0] == 422 and bad[1].startswith("floors: must be true")
    assert page.errors == []


def _random_text(rng: random.Random) -> str:
    pieces = [
        "the",
        " cat",
        "Mary",
        "  ",
        "\n",
        "'s",
        "'ll",
        "é",
        "日本",
        "🙂",
        "123",
        "4.5",
        ",",
        "!?",
        "<|endoftext|>",
        " ",
        "\t",
        "don't",
        "ÀÉ",
        "x" * 7,
        "—",
        "\u00a0",
        "Zürich",
    ]
    return "".join(rng.choice(pieces) for _ in range(rng.randint(1, 12)))


def test_tokenizer_equals_pythons(page) -> None:
    from headlab import zoo

    _, tokenizer = zoo.load("default")
    rng = random.Random(0)
    texts = [
        SENTENCE,
        "Hello world",
        " leading",
        "trailing  ",
        *(_random_text(rng) for _ in range(300)),
    ]
    got = page.evaluate(
        """async (texts) => {
            const { Tokenizer } = await import("./static/offline/tokenizer.js");
            const json = await (await fetch("./static/offline/tokenizer.json")).json();
            const t = new Tokenizer(json);
            return texts.map((x) => { const ids = t.encode(x); return [ids, t.labels(ids)]; });
        }""",
        texts,
    )
    for text, (ids, labels) in zip(texts, got, strict=True):
        assert ids == tokenizer.encode(text), text
        assert labels == tokenizer.token_strings(ids), text


def test_too_long_text_says_what_the_server_says(page) -> None:
    from headlab import zoo
    from headlab.measure import build_probe

    model, tokenizer = zoo.load("default")
    text = "word " * 80
    with pytest.raises(ValueError) as said:
        build_probe("text", tokenizer, model.config.max_len, model.config.vocab_size, text)
    run_sentence(page, text)
    assert page.inner_text("#heads-status") == str(said.value)


def test_axe_finds_nothing_serious(page) -> None:
    from axe_playwright_python.sync_playwright import Axe
    from test_browser_learners import serious

    results = Axe().run(page).response
    assert results["passes"], "axe ran no checks"
    assert serious(results) == []


def _random_size(rng: random.Random) -> dict:
    """A size within the API's limits: small ones (often indivisible), and now and then huge."""
    from headlab.shapes import LIMITS

    def pick(name: str) -> int:
        lo, hi = LIMITS[name]
        return rng.choice(
            [rng.randint(lo, min(hi, 64)), rng.randint(lo, min(hi, 4096)), rng.randint(lo, hi)]
        )

    body = {name: pick(name) for name in ("d_model", "n_heads", "seq_len", "batch")}
    body["n_kv_heads"] = rng.choice([None, pick("n_kv_heads"), rng.randint(1, 8)])
    body["cache_len"] = rng.choice([0, 0, pick("cache_len")])
    body["bias"] = rng.random() < 0.5
    body["dtype"] = rng.choice(["float32", "float16", "bfloat16", "float64", "bf16", "fp16"])
    if rng.random() < 0.5:  # a divisible width, so that most reports are valid and complete
        body["d_model"] = min(body["n_heads"] * rng.randint(1, 64), LIMITS["d_model"][1])
        if body["n_kv_heads"] is not None and rng.random() < 0.7:
            body["n_kv_heads"] = rng.choice([h for h in range(1, 9) if body["n_heads"] % h == 0])
    return body


def _with_head_width(rng: random.Random) -> dict:
    """A size with a given head width d_k: small, up to 512, or anywhere in the API's range."""
    from headlab.shapes import LIMITS

    lo, hi = LIMITS["d_k"]
    d_k = rng.choice([rng.randint(lo, 16), rng.randint(lo, 512), rng.randint(lo, hi)])
    return {**_random_size(rng), "d_k": d_k}


def _as_doubles(value: object) -> object:
    """Python's JSON as the browser's numbers hold it: integers are doubles there."""
    if isinstance(value, dict):
        return {k: _as_doubles(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_as_doubles(v) for v in value]
    if isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    return value


def test_shapes_widget_equals_headlab_shapes(page) -> None:
    from headlab.server.schemas import ShapesRequest
    from headlab.shapes import trace_shapes

    rng = random.Random(0)
    bodies = [{"d_model": 100, "n_heads": 6}, {"d_model": 96, "n_heads": 6, "n_kv_heads": 4}]
    bodies += [_random_size(rng) for _ in range(600)]
    # a given head width d_k, which need not be d_model / h (Gemma 3: 256 at 640 / 4)
    gemma3 = {"d_model": 640, "n_heads": 4, "n_kv_heads": 1, "d_k": 256, "bias": False}
    bodies += [gemma3, {**gemma3, "d_k": 1}] + [_with_head_width(rng) for _ in range(520)]
    got = page.evaluate(
        """async (bodies) => {
            const { shapesReport } = await import("./static/offline/shapes.js");
            const statement = await (await fetch("./static/offline/shape-statement.json")).json();
            return bodies.map((b) => shapesReport(statement, b));
        }""",
        bodies,
    )
    valid = 0
    for body, report in zip(bodies, got, strict=True):
        want = trace_shapes(**ShapesRequest(**body).model_dump())  # the API's defaults
        assert _as_doubles(report) == _as_doubles(
            {**want.to_dict(), **want.config.head_counts(), "source": "table"}
        ), body
        valid += want.valid
    assert 100 < valid < len(bodies)  # both kinds were checked
    assert sum(r["valid"] and r["config"]["d_k"] is not None for r in got) > 100
    assert "is not divisible by n_heads=6" in got[0]["problems"][0]


# what a section shows while its figures are on their way
PENDING = ("Loading…", "loads as you scroll to it")


@pytest.mark.parametrize("width", [1280, 390])
def test_every_section_opens_without_an_error_and_6_and_9_show_the_numbers(
    browser, origin: str, width: int
) -> None:
    """Each section of the page scrolled to, at a desktop's width and a phone's: none says
    "Could not load" or shows an error, and the two tables no test opened before show the
    traced layer's numbers: §6 every preset's attention parameters, §9 the GQA presets' KV
    cache at their full context (the site's port once refused the page's ``d_k: null`` there)."""
    from headlab.shapes import PRESETS

    pg = open_site(browser, origin, width)
    try:
        sections = pg.eval_on_selector_all("section[id]", "ss => ss.map((s) => s.id)")
        assert len(sections) >= 11, sections
        for sid in sections:
            section = pg.locator(f"section#{sid}")
            section.scroll_into_view_if_needed()
            for stored in section.locator("[data-experiment]").all():  # each loads when near
                stored.scroll_into_view_if_needed()
            pg.wait_for_function(
                """([sid, pending]) => {
                    const text = document.getElementById(sid).innerText;
                    return !pending.some((p) => text.includes(p));
                }""",
                arg=[sid, list(PENDING)],
                timeout=60_000,
            )
        for sid in sections:
            shown = pg.eval_on_selector(
                f"section#{sid}",
                """(s) => ({ text: s.innerText, errors: [...s.querySelectorAll(
                    ".error, .problems, [role=alert]")].map((e) => e.textContent) })""",
            )
            assert "Could not" not in shown["text"], (width, sid, shown["text"][:2000])
            assert shown["errors"] == [], (width, sid)
        params = pg.eval_on_selector_all(
            "#params-presets tbody tr",
            "rows => rows.map((r) => [r.dataset.preset, r.cells[4].textContent])",
        )
        assert [name for name, _ in params] == list(PRESETS)
        for name, shown_total in params:
            assert shown_total == f"{PRESETS[name].report(seq_len=1).params['total']:,}", name
        kv = pg.eval_on_selector_all(
            "#kv-table tbody tr", "rows => rows.map((r) => [...r.cells].map((c) => c.textContent))"
        )
        gqa = [p for p in PRESETS.values() if p.n_kv_heads and p.n_kv_heads < p.n_heads]
        assert [row[0] for row in kv] == [p.title for p in gqa]
        for row, preset in zip(kv, gqa, strict=True):
            cache = preset.report(dtype="bfloat16").kv_cache  # B = 1, the model's context
            want = pg.evaluate(
                """async ([ours, mha]) => { const { fmtBytes } = await import("./static/js/dom.js");
                    return [fmtBytes(ours), fmtBytes(mha)]; }""",
                [cache["bytes"], cache["mha_bytes"]],
            )
            assert row[2:4] == want, preset.name
        assert pg.errors == []
    finally:
        pg.context.close()


def test_from_a_file_it_says_to_serve_the_folder(browser, site: Path) -> None:
    """Chromium runs no module, fetch or XHR from file://, so the page cannot compute there:
    it says so, and names the command that serves the folder."""
    context = browser.new_context()
    pg = context.new_page()
    pg.goto((site / "index.html").as_uri())
    pg.wait_for_function(
        "() => document.querySelector('#server-status').textContent.includes('file://')"
    )
    assert "python -m http.server" in pg.inner_text("#server-status")
    context.close()


# the controls of what the static site cannot run, each with the line that says so instead
SERVER_ONLY = {
    "live/induction": ("#live-form, #live-train", "#live-host-note"),
    "retrieval/needle": ("#needle-run, #needle-depth", "#needle-host-note"),
    "circuit": ("#heads-evidence", None),  # the evidence (the circuit with it): the note names it
}


def status_after(page, action) -> str:
    """Do ``action`` (which starts a run of the head viewer) and return the status line it ends
    with."""
    page.eval_on_selector("#heads-status", "e => { e.textContent = ''; }")
    action()
    page.wait_for_function(
        "() => { const t = document.querySelector('#heads-status').textContent;"
        " return t !== '' && t !== 'Running the model…'; }"
    )
    return str(page.inner_text("#heads-status"))


@pytest.mark.parametrize("width", [1280, 390])
def test_every_menu_offers_only_what_the_site_runs(
    browser, origin: str, site: Path, width: int
) -> None:
    """Of every model and probe the server listed when the site was built (its stored GET
    answers), the head viewer's menus offer exactly those the site answers when asked (a POST
    /api/heads in the page), every head type offered has a head of that type in the site's
    answer, and one line under the menus names each model and input left out and says that
    `headlab serve` runs them. The live panel, the switch-off panel, the needle and the
    evidence box, whose routes the site refuses, offer no control but a line saying so."""
    listed_models = [m["name"] for m in json.loads((site / "api/models.json").read_text())]
    listed_probes = json.loads((site / "api/probes.json").read_text())
    pg = open_site(browser, origin, width)
    try:
        ask = """async (body) => { const r = await fetch("/api/heads", { method: "POST",
            body: JSON.stringify(body) }); return [r.status, await r.json()]; }"""
        runs_model = {m: pg.evaluate(ask, {"model": m})[0] == 200 for m in listed_models}
        runs_probe = {}
        for p in listed_probes:
            body = {"probe": p["name"], **({"text": "a b a b"} if p["takes_text"] else {})}
            runs_probe[p["name"]] = pg.evaluate(ask, body)[0] == 200
        menu = "sel => [...document.querySelector(sel).options].map((o) => o.value)"
        assert pg.evaluate(menu, "#heads-model") == [m for m in listed_models if runs_model[m]]
        offered = pg.evaluate(menu, "#heads-probe")
        assert offered == [p["name"] for p in listed_probes if runs_probe[p["name"]]]
        assert "default" in runs_model and runs_model["default"] and len(offered) >= 2
        left = [m for m in listed_models if not runs_model[m]]
        # a probe as its menu names it: its description up to the first parenthesis
        left += [
            p["description"].split(" (")[0] for p in listed_probes if not runs_probe[p["name"]]
        ]
        assert left, "the site runs everything the server lists: nothing to check"
        note = pg.locator("#heads-host-note")
        expect(note).to_be_visible()
        said = note.inner_text()
        assert "`headlab serve`" in said and "\n" not in said, said
        assert all(name in said for name in left), (left, said)

        status, answer = pg.evaluate(ask, {"probe": "repeat"})
        assert status == 200
        for kind in pg.evaluate(menu, "#heads-type"):
            assert kind == "averaged" or kind in answer["best"], kind
            said = status_after(pg, lambda k=kind: pg.select_option("#heads-type", k))
            assert f"No {kind} score" not in said and "not available" not in said, (kind, said)
        for gone in ("syntactic", "retrieval"):
            assert gone not in answer["best"] and gone not in pg.evaluate(menu, "#heads-type")

        pg.evaluate(
            "() => document.querySelectorAll('main details').forEach(d => { d.open = true; })"
        )
        test_browser.reveal(pg, "retrieval")
        for route, (controls, line) in SERVER_ONLY.items():
            refused = pg.evaluate(
                """async (route) => (await fetch(`/api/${route}`, { method: "POST",
                    body: JSON.stringify({ model: "default" }) })).status""",
                route,
            )
            assert refused >= 500, (route, refused)  # the site does not run it ...
            assert pg.locator(controls).filter(visible=True).count() == 0, route  # ... nor offer it
            if line:
                expect(pg.locator(line)).to_contain_text("`headlab serve`")
        assert pg.errors == []
    finally:
        pg.context.close()


def drawn_tokens(page, tmp_path: Path) -> list[str]:
    """The tokens of the head viewer's drawn figure (its JSON export), head 0.0's."""
    return list(drawn_weights(page, 0, 0, tmp_path)["tokens"])


@pytest.mark.parametrize("width", [1280, 390])
def test_no_answer_shown_belongs_to_another_input(
    browser, origin: str, tmp_path: Path, width: int
) -> None:
    """The head viewer never shows an answer under another input than its own: a text typed
    and not yet run marks the figures drawn as the last input's; a run the site refuses (a
    text longer than the model's context) takes them away, and a head type picked after it
    draws nothing (a refusal once left the sentence before it on screen, under the new menus);
    the next run draws its own text's tokens, as Python's tokenizer splits it."""
    from headlab import zoo

    _, tokenizer = zoo.load("default")
    first, second = "The red kite flew, then the red kite fell.", "Sue saw Ann and Sue saw Bo."
    pg = open_site(browser, origin, width)
    try:
        stale, results = pg.locator("#heads-stale"), pg.locator("#heads-results")
        run_sentence(pg, first)
        assert drawn_tokens(pg, tmp_path) == tokenizer.token_strings(tokenizer.encode(first))
        expect(stale).to_be_hidden()
        pg.fill("#heads-text", second)  # typed, not run: the figures are the first text's
        expect(stale).to_be_visible()
        expect(stale).to_contain_text("not of this one")
        expect(results).to_have_class("stale")

        run_sentence(pg, "word " * 80)  # longer than the model's 64 tokens: refused
        assert "shorten it" in pg.inner_text("#heads-status")
        pg.select_option("#heads-type", "induction")
        assert pg.locator("#heads-view figure, #heads-grid button[data-head]").count() == 0
        assert pg.locator("#heads-which option, #label-counts").count() == 0
        expect(stale).to_be_hidden()
        assert "shorten it" in pg.inner_text("#heads-status")

        run_sentence(pg, second)
        assert drawn_tokens(pg, tmp_path) == tokenizer.token_strings(tokenizer.encode(second))
        expect(stale).to_be_hidden()
        expect(results).not_to_have_class("stale")
        assert pg.errors == []
    finally:
        pg.context.close()


# a sentence only this test types, and the heads it switches off in each mode
SWITCH_SENTENCE = "The green lantern swung at dusk; the green lantern swung at dawn."
SWITCH_SETS = {"mean": [(0, 2), (0, 5), (1, 1)], "zero": [(0, 0), (0, 7), (1, 4), (1, 6)]}
# records each answer the panel gets from the site's in-browser API (it is no network response)
RECORD_SWITCH = """() => { const f = window.fetch; window.switched = [];
    window.fetch = async (input, init) => { const r = await f(input, init);
      if (String(input).startsWith("/api/switch-off")) window.switched.push(await r.clone().json());
      return r; }; }"""


def _near(got: object, want: torch.Tensor) -> float:
    return float((torch.tensor(got, dtype=torch.float64) - want.double()).abs().max())


def check_switched(
    pg, answer: dict, want, heads, mode: str, tokenizer, loss_scale: bool = False
) -> None:
    """The panel's answer (``answer``, recorded by :data:`RECORD_SWITCH`) is ``want``
    (headlab.heads.switch.switch_off's): the heads and mode, both runs' five likeliest next
    tokens (the same ids and strings, probabilities within 1e-4), every position's loss, the
    mean losses on the repeat and on every position (within 1e-4; a loss of no rows is none in
    both), every pattern and induction score within 1e-4; the panel shows both mean losses.
    ``loss_scale``: each position's loss within 1e-4 of its size (at least 1 nat) instead."""
    assert answer["mode"] == mode and answer["off"] == [list(p) for p in heads]
    for key, loss in want.losses().items():
        got = answer["loss"][key]
        if loss is None:
            assert got is None, key
            continue
        assert got["rows"] == loss["rows"], key
        for part in ("intact", "off", "rise"):
            assert abs(got[part] - loss[part]) < 1e-4, (mode, key, part)
        row = pg.locator(f'#switch-loss [data-loss="{key}"]')
        shown = [row.locator(f'[data-run="{r}"]').inner_text() for r in ("intact", "off")]
        assert shown == [f"{got['intact']:.2f}", f"{got['off']:.2f}"]
    for name, run in (("intact", want.intact), ("switched_off", want.off)):
        got = answer[name]
        ids = [[p["id"] for p in row] for row in got["predictions"]]
        assert ids == run.top_ids[0].tolist(), (mode, name)
        probs = [[p["p"] for p in row] for row in got["predictions"]]
        assert _near(probs, run.top_probs[0]) < 1e-4, (mode, name)
        tokens = [[p["token"] for p in row] for row in got["predictions"]]
        assert tokens == [tokenizer.token_strings(row) for row in ids]
        losses = run.losses[0]
        scale = losses.abs().clamp(min=1) if loss_scale else torch.ones_like(losses)
        off = (torch.tensor(got["losses"]) - losses).abs()
        assert (off < 1e-4 * scale).all(), (mode, name, float(off.max()))
        assert _near(got["weights"], run.weights[:, 0]) < 1e-4, (mode, name)
        assert _near(got["induction"], run.induction) < 1e-4, (mode, name)


@pytest.mark.parametrize("width", [1280, 390])
def test_switching_heads_off_equals_the_librarys(
    browser, origin: str, tmp_path: Path, width: int
) -> None:
    """The switch-off panel runs in the static site (it once only said it needs the server):
    on a typed sentence, a set of heads switched off by their mean and another zeroed give
    the answer headlab.heads.switch.switch_off gives in PyTorch within 1e-4: every position's
    five likeliest next tokens and their probabilities, every loss and the means on the repeat
    and on every position, every head's pattern and induction score. The panel shows those
    numbers: the loss lines, each position's likeliest guess, the two heatmaps' data."""
    from headlab import zoo
    from headlab.heads.switch import switch_off
    from headlab.measure import text_probe

    model, tokenizer = zoo.load("default")
    probe = text_probe(tokenizer, SWITCH_SENTENCE, model.config.max_len)
    pg = open_site(browser, origin, width)
    try:
        run_sentence(pg, SWITCH_SENTENCE)
        expect(pg.locator("#switch-host-note")).to_have_count(0)
        pg.locator("#switch-box").scroll_into_view_if_needed()
        pg.evaluate(RECORD_SWITCH)
        for mode, heads in SWITCH_SETS.items():
            pg.click("#switch-clear")
            for layer, head in heads:
                pg.click(f'#switch-heads button[data-off="{layer}.{head}"]')
            pg.check(f"#switch-mode-{mode}")
            pg.click("#switch-run")
            names = ", ".join(f"{l}.{i}" for l, i in heads)
            expect(pg.locator("#switch-summary")).to_contain_text(
                f"with {names} switched off", timeout=60_000
            )
            answer = pg.evaluate("() => window.switched.at(-1)")
            want = switch_off(model, probe, heads, mode)
            assert answer["tokens"] == tokenizer.token_strings(probe.tokens[0].tolist())
            assert all(want.losses().values())  # the sentence repeats: both losses exist
            check_switched(pg, answer, want, heads, mode, tokenizer)
            rows = pg.locator("#switch-predictions tbody tr")
            assert rows.count() == probe.n
            for i in (0, probe.n // 2, probe.n - 1):
                cells = rows.nth(i).locator("td").all_inner_texts()
                guesses = [
                    f'"{tokenizer.token_strings([int(r.top_ids[0, i, 0])])[0]}"'
                    for r in (want.intact, want.off)
                ]
                assert [c.split('" ')[0] + '"' for c in cells[3:]] == guesses, i
            layer, head = map(int, pg.input_value("#switch-head").split("."))
            for side, run in (("intact", want.intact), ("off", want.off)):
                fig = pg.locator(
                    f'#switch-patterns figure[data-figure="switch-{layer}-{head}-{side}"]'
                )
                with pg.expect_download() as info:
                    fig.locator('button[data-export="json"]').click()
                path = tmp_path / f"{mode}-{side}.json"
                info.value.save_as(path)
                drawn = json.loads(path.read_text())["weights"]
                assert _near(drawn, run.weights[layer, 0, head]) < 1e-4, (mode, side)
        assert pg.evaluate("document.documentElement.scrollWidth") <= width
        assert pg.errors == []
    finally:
        pg.context.close()


def test_the_calculators_models_are_named_as_this_pages(page) -> None:
    """The shape calculator's preset menu names the model this page runs as the page's (it said
    "models on this server", which a static site has none of); any other model the server
    listed at build time is named as `headlab serve`'s."""
    page.wait_for_selector("#shapes-preset optgroup[label*='on this page']", state="attached")
    groups = page.eval_on_selector_all(
        "#shapes-preset optgroup",
        "gs => gs.map((g) => [g.label, [...g.children].map((o) => o.value)])",
    )
    labels = [label for label, _ in groups]
    assert not any("server" in label for label in labels), labels
    here = [values for label, values in groups if "on this page" in label]
    assert here == [["model:default"]], groups
    others = [values for label, values in groups if "`headlab serve`" in label]
    assert all("model:default" not in values for values in others), groups
