"""headlab.show: the notebook views and the offline file carry the report's own numbers, bundle
the page's scripts into one, and write whole files or none. (Drawn in a browser by
test_browser_learners.py.)"""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from headlab import show as S
from headlab.shapes import trace_shapes

DATA = re.compile(r'<script type="application/json" id="([\w-]+)-data">(.*?)</script>', re.S)


def embedded(fragment: str) -> dict:
    """The JSON a view carries, read back as a browser would (textContent, then JSON.parse)."""
    match = DATA.search(fragment)
    assert match is not None
    return json.loads(match.group(2))


def decode(blob: dict) -> np.ndarray:
    raw = np.frombuffer(base64.b64decode(blob["b64"]), dtype="<u2")
    return raw.reshape(blob["shape"]) / 65535


def test_weights_survive_the_uint16_encoding_to_four_decimals() -> None:
    rng = np.random.default_rng(0)
    w = rng.dirichlet(np.ones(37), size=(2, 3, 37)).round(4)  # rows of a softmax, as reports round
    back = decode(S.encode_weights(w))
    assert back.shape == w.shape
    assert np.array_equal(back.round(4), w)  # what the views print (toFixed(4)) is the report's
    assert np.abs(back - w).max() <= 0.5 / 65535 + 1e-12


def test_bundle_orders_modules_after_their_imports_and_leaves_no_module_syntax() -> None:
    order = S._module_order("standalone")
    assert order[-1] == "standalone"
    for before, after in [
        ("dom", "figures"),
        ("colour", "figures"),
        ("figures", "headview"),
        ("layer-diagram", "standalone"),
        ("dom", "layer-diagram"),
    ]:
        assert order.index(before) < order.index(after)
    assert "api" in order  # via shapes-widget; it only defines functions, nothing runs
    text = S.bundle()
    assert not re.search(r"^\s*(import|export)\b", text, re.M)
    for name in order:
        assert f'__m["{name}"] = (function () {{' in text
    assert "</script" not in text.lower()


def test_bundle_refuses_a_module_form_it_does_not_know(monkeypatch, tmp_path: Path) -> None:
    (tmp_path / "js").mkdir()
    (tmp_path / "js" / "standalone.js").write_text("export default function f() {}\n")
    monkeypatch.setattr(S, "STATIC", tmp_path)
    with pytest.raises(ValueError, match="cannot bundle 'export default"):
        S._as_function("standalone")


def test_diagram_code_covers_every_name_the_diagram_asks_for() -> None:
    script = (S.STATIC / "js" / "layer-diagram.js").read_text(encoding="utf-8")
    asked = set(re.findall(r'"(headlab\.[\w.]+)"', script))
    code = S.diagram_code()
    assert asked == set(code)
    from headlab.attention import MultiHeadAttention

    forward = code["headlab.attention.MultiHeadAttention.forward"]
    assert forward["path"] == "headlab/attention.py"
    assert forward["source"].lstrip().startswith("def forward")
    lines = Path(S.__file__).parent.joinpath("attention.py").read_text().splitlines()
    assert lines[forward["line"] - 1].strip().startswith("def forward")
    assert MultiHeadAttention.forward.__name__ == "forward"


def test_shapes_view_carries_the_report_and_refuses_a_broken_one() -> None:
    report = trace_shapes(d_model=512, n_heads=8, n_kv_heads=2, seq_len=10, batch=2)
    part = embedded(S.show(report).to_html())["parts"][0]
    assert part["kind"] == "shapes"
    shapes = {st["name"]: st["shape"] for st in part["report"]["stages"]}
    assert shapes["q"] == [2, 8, 10, 64] and shapes["k"] == [2, 2, 10, 64]
    with pytest.raises(ValueError, match=r"does not work: .*divisible"):
        S.show(trace_shapes(d_model=512, n_heads=7, seq_len=10, batch=2))
    with pytest.raises(TypeError, match="draws a HeadReport"):
        S.show(42)


def test_each_fragment_has_its_own_ids() -> None:
    view = S.show(trace_shapes(d_model=64, n_heads=4, seq_len=3, batch=1))
    a, b = DATA.search(view.to_html()), DATA.search(view.to_html())
    assert a is not None and b is not None and a.group(1) != b.group(1)


@pytest.fixture(scope="module")
def report():
    from conftest import require
    from headlab import zoo
    from headlab.heads import analyse
    from headlab.measure import build_probe

    require(any(m.name == "default" and m.available for m in zoo.list_models()), "no default model")
    model, tokenizer = zoo.load("default")
    cfg = model.config
    return analyse(model, build_probe("repeat", tokenizer, cfg.max_len, cfg.vocab_size))


def test_head_view_carries_every_pattern_of_the_report(report) -> None:
    part = embedded(S.show(report, model="default", grid=True).to_html())["parts"][0]
    body = part["report"]
    assert (part["kind"], part["grid"], body["model"]) == ("heads", True, "default")
    assert body["tokens"] == report.tokens
    assert np.abs(decode(body["weights"]) - report.patterns.numpy()).max() < 1e-4
    assert np.abs(decode(body["averaged_weights"]) - report.averaged_patterns.numpy()).max() < 1e-4
    assert [(r["layer"], r["head"], r["label"]) for r in body["heads"]] == [
        (s.layer, s.head, s.label) for s in report.heads
    ]


def test_write_html_is_whole_or_absent(tmp_path: Path, monkeypatch) -> None:
    view = S.show(trace_shapes(d_model=64, n_heads=4, seq_len=3, batch=1))
    path = view.save(tmp_path / "v.html", "a <title>")
    text = path.read_text()
    assert text.startswith("<!doctype html>") and "<title>a &lt;title&gt;</title>" in text
    assert "http://" not in text.replace("http://www.w3.org/2000/svg", "")
    assert "https://" not in text and "src=" not in text  # nothing to fetch

    def broken(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(S.os, "replace", broken)
    with pytest.raises(OSError):
        view.save(tmp_path / "w.html")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["v.html"]  # no w.html, no temp file
    with pytest.raises(ValueError, match="does not exist"):
        S.write_html(tmp_path / "no" / "x.html", "x")


def test_cli_html_rejects_what_it_cannot_write(tmp_path: Path) -> None:
    from headlab.cli import app

    runner = CliRunner()
    result = runner.invoke(app, ["heads", "--html", str(tmp_path / "missing" / "x.html")])
    assert result.exit_code == 2
    # the message is one unbroken line: the path can be copied from the terminal
    assert f"the folder {tmp_path / 'missing'} does not exist" in result.output
    prompts = tmp_path / "p.txt"
    prompts.write_text("one\ntwo\n")
    result = runner.invoke(app, ["heads", "--prompts", str(prompts), "--html", "x.html"])
    assert result.exit_code == 2
    assert "--prompts averages scores only" in result.output


def test_a_view_says_what_it_is_in_a_few_lines_of_plain_text(report) -> None:
    """A view printed in a terminal, or saved as a notebook's text/plain, was 185,577 characters
    (the whole dataclass, weights and all): now a few lines naming the model, the probe, the
    heads' labels counted, and how to see more; the HTML form still carries everything."""
    from collections import Counter

    view = S.show(report, model="default", grid=True)
    text = repr(view)
    assert len(text) <= 1000 and len(text.splitlines()) <= 8, text
    assert str(view) == text
    assert "default" in text and "repeat probe" in text and f"{len(report.tokens)} tokens" in text
    for label, count in Counter(s.label for s in report.heads).items():
        assert f"{label} {count}" in text, (label, text)
    assert ".save(" in text and "notebook" in text  # how to see the rest
    assert len(view.to_html()) > 100 * len(text)  # the drawing keeps the data
    both = view + S.show(trace_shapes(d_model=512, n_heads=8, seq_len=10, batch=2))
    text = repr(both)
    assert len(text) <= 1000 and "shapes" in text and "d_model 512" in text, text
