"""The static site's pieces that need no browser: the ONNX export of the default model against
PyTorch (onnxruntime as the outside runtime), and the page's index.html for the site."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from headlab import site, zoo
from headlab.heads import averaged_pattern
from headlab.measure import run_patterns

onnxruntime = pytest.importorskip("onnxruntime", reason="headlab[static] installs onnxruntime")


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> tuple[object, object]:
    model, _ = zoo.load("default")
    path = site.export_onnx(model, tmp_path_factory.mktemp("onnx") / "model.onnx")
    return model, onnxruntime.InferenceSession(str(path))


@pytest.mark.parametrize("n", [2, 9, 64])
def test_onnx_weights_equal_pytorchs_for_any_length(exported, n: int) -> None:
    model, session = exported
    tokens = torch.randint(
        1, model.config.vocab_size, (1, n), generator=torch.Generator().manual_seed(n)
    )
    tokens[0, 0] = 0
    weights, averaged = session.run(None, {"tokens": tokens.numpy()})
    want = run_patterns(model, tokens)[:, 0]  # (L, h, n, n)
    assert weights.shape == tuple(want.shape)
    assert (torch.from_numpy(weights) - want).abs().max() < 1e-5
    assert (torch.from_numpy(averaged) - averaged_pattern(want)).abs().max() < 1e-5


def test_page_html_loads_the_in_browser_api_first_with_relative_paths() -> None:
    html = site.page_html()
    assert '"/static/' not in html
    offline = html.index("static/offline/offline-api.js")
    assert offline < html.index('src="static/js/main.js"')
    assert "WebAssembly" in html


def test_missing_runtime_says_to_run_npm_ci(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="npm ci"):
        site.ort_dist(tmp_path)


def test_random_weight_models_equal_pytorchs(tmp_path: Path) -> None:
    """The floors' models: the same graph with the weights baselines.random_model draws."""
    from headlab.heads.baselines import BASELINE_SEEDS, random_model

    model, _ = zoo.load("default")
    paths = site.export_random(model, tmp_path)
    assert [p.name for p in paths] == [f"random-{s}.onnx" for s in BASELINE_SEEDS]
    tokens = torch.tensor([[0, 5, 9, 5, 9, 33, 7]])
    for seed, path in zip(BASELINE_SEEDS, paths, strict=True):
        weights, _ = onnxruntime.InferenceSession(str(path)).run(None, {"tokens": tokens.numpy()})
        want = run_patterns(random_model(model, seed), tokens)[:, 0]
        assert (torch.from_numpy(weights) - want).abs().max() < 1e-5
        assert (want - run_patterns(model, tokens)[:, 0]).abs().max() > 0.01  # not the trained one


def test_page_html_asks_for_the_runtime_first() -> None:
    html = site.page_html()
    head = html[: html.index("</head>")]
    assert head.index(
        'rel="preload" href="static/offline/ort-wasm-simd-threaded.wasm"'
    ) < head.index("<title>")
    assert html.index('<meta charset="utf-8">') < html.index("modulepreload")
