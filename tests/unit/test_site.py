"""The static site's pieces that need no browser: the ONNX export of the default model and its
scores (torch.onnx.export with dynamo=True) against PyTorch and analyse (onnxruntime as the
outside runtime), and the page's index.html for the site."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
import torch

from headlab import site, zoo
from headlab.heads import analyse, averaged_pattern
from headlab.heads.baselines import BASELINE_SEEDS, random_model
from headlab.heads.labels import REST_OF_LABEL
from headlab.measure import run_patterns, text_probe, word_zipf

onnxruntime = pytest.importorskip("onnxruntime", reason="headlab[static] installs onnxruntime")


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> tuple[object, list[object]]:
    """The default model and the sessions of its graph and of its random-weights copies."""
    pytest.importorskip("onnxscript", reason="headlab[static] exports with torch.onnx (dynamo)")
    model, _ = zoo.load("default")
    folder = tmp_path_factory.mktemp("onnx")
    paths = site.export_onnx(model, folder / "model.onnx", BASELINE_SEEDS)
    assert [p.name for p in paths] == ["model.onnx", *(f"random-{s}.onnx" for s in BASELINE_SEEDS)]
    # one thread: the same order of every sum on any machine (the content score at a cell one
    # row nearly holds alone is a ratio of two tiny numbers, and a busy machine's thread split
    # once moved it 1.3e-4)
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    return model, [onnxruntime.InferenceSession(str(p), options) for p in paths]


def feeds(probe) -> dict[str, np.ndarray]:
    """The graph's inputs for a text probe, as the site's scripts make them."""
    zipf = word_zipf(probe.words[0])
    index = probe.word_index[0].tolist()
    return {
        "tokens": probe.tokens.numpy(),
        "delimiters": probe.delimiters.bool().numpy(),
        "fixed": (~probe.movable).numpy(),
        "word_index": probe.word_index.numpy(),
        "zipf": np.array([[zipf[w] if w >= 0 else np.nan for w in index]], dtype=np.float32),
    }


def id_feeds(tokens: torch.Tensor) -> dict[str, np.ndarray]:
    """Inputs for bare token ids (1, n): no delimiter, no fixed key, no word."""
    shape = tuple(tokens.shape)
    flags = np.zeros(shape, dtype=bool)
    words, zipf = np.full(shape, -1), np.full(shape, np.nan, np.float32)
    return {
        "tokens": tokens.numpy(),
        "delimiters": flags,
        "fixed": flags,
        "word_index": words,
        "zipf": zipf,
    }


@pytest.mark.parametrize("n", [2, 9, 64])
def test_onnx_weights_equal_pytorchs_for_any_length(exported, n: int) -> None:
    model, (session, *_) = exported
    tokens = torch.randint(
        1, model.config.vocab_size, (1, n), generator=torch.Generator().manual_seed(n)
    )
    tokens[0, 0] = 0
    weights, averaged, *_ = session.run(None, id_feeds(tokens))
    want = run_patterns(model, tokens)[:, 0]  # (L, h, n, n)
    assert weights.shape == tuple(want.shape)
    assert (torch.from_numpy(weights) - want).abs().max() < 1e-5
    assert (torch.from_numpy(averaged) - averaged_pattern(want)).abs().max() < 1e-5


# the seeded texts' words: repeats, punctuation, a digit, rare words, a clitic
WORDS = (
    "the cat sat on mat and then a quixotic zephyr , . ! ? 3 Mary gave kite to John "
    "bewildered xylophonist ocelot's red blue"
)


def _texts(seed: int, count: int, tokenizer, max_len: int) -> list[str]:
    """``count`` seeded texts of every length from one word to the model's limit."""
    rng, texts = random.Random(seed), []
    while len(texts) < count:
        text = " ".join(rng.choice(WORDS.split()) for _ in range(rng.randint(1, 60)))
        if len(tokenizer.encode(text)) <= max_len:
            texts.append(text)
    return ["x", *texts]  # "x": two tokens, the start token and one


@pytest.mark.parametrize("which", [None, *BASELINE_SEEDS])
def test_onnx_scores_equal_analyse_for_any_text(exported, which: int | None) -> None:
    """Every head's scores, offsets and rests from the graph equal analyse's (the trained
    model's and each random-weights copy's), on texts of 2 to 64 tokens."""
    model, sessions = exported
    _, tokenizer = zoo.load("default")
    k = 0 if which is None else 1 + BASELINE_SEEDS.index(which)
    scored = model if which is None else random_model(model, which)
    names = site.SiteGraph(model).score_names
    rest_names = site.SiteGraph(model).rest_names
    h = model.config.n_heads
    lengths = set()
    for text in _texts(44 + k, 6, tokenizer, model.config.max_len):
        probe = text_probe(tokenizer, text, model.config.max_len)
        lengths.add(probe.n)
        out = dict(zip(site.GRAPH_OUTPUTS, sessions[k].run(None, feeds(probe)), strict=True))
        report = analyse(scored, probe, keep=())
        for s in [*report.heads, *report.averaged]:
            col = s.layer * (h + 1) + (h if s.head < 0 else s.head)
            got = {name: float(out["scores"][t, col]) for t, name in enumerate(names)}
            assert got.keys() == s.scores.keys()
            for name, value in s.scores.items():
                assert abs(got[name] - value) <= 1e-5, (text, s.layer, s.head, name)
            assert int(out["offsets"][col]) == s.offset, (text, s.layer, s.head)
            if s.rest is not None:
                kind = REST_OF_LABEL[s.label]
                assert abs(float(out["rests"][rest_names.index(kind), col]) - s.rest) <= 1e-5
    assert 2 in lengths and max(lengths) > 30


def test_page_html_loads_the_in_browser_api_first_with_relative_paths() -> None:
    html = site.page_html()
    assert '"/static/' not in html
    offline = html.index("static/offline/offline-api.js")
    assert offline < html.index('src="static/js/main.js"')
    assert "WebAssembly" in html


def test_missing_runtime_says_to_run_npm_ci(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="npm ci"):
        site.ort_dist(tmp_path)


def test_random_weight_models_equal_pytorchs(exported) -> None:
    """The floors' models: the same graph with the weights baselines.random_model draws."""
    model, (_, *randoms) = exported
    tokens = torch.tensor([[0, 5, 9, 5, 9, 33, 7]])
    for seed, session in zip(BASELINE_SEEDS, randoms, strict=True):
        weights, *_ = session.run(None, id_feeds(tokens))
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


def test_the_manifest_lists_what_the_site_runs_and_names_the_rest() -> None:
    """The manifest the site's stored health answer carries: the default model, the two probes
    a text makes, every head type whose best head the exported graph scores (its score one of
    the graph's rows) and the averaged head, the POST routes offline-api.js answers; and one
    line naming every model and probe the server lists beyond them, which need the server."""
    from fastapi.testclient import TestClient

    from headlab.heads.labels import BEST_TYPES
    from headlab.heads.scores import ScoreGraph
    from headlab.server.app import create_app

    model, _ = zoo.load("default")
    with TestClient(create_app()) as client:
        answers = {f"api/{r}.json": client.get(f"/api/{r}").json() for r in ("health", "models")}
        answers["api/probes.json"] = client.get("/api/probes").json()
    health = site.with_manifest(answers, model)["api/health.json"]
    assert {k: v for k, v in health.items() if k != site.MANIFEST} == answers["api/health.json"]
    runs = health[site.MANIFEST]
    listed_models = [m["name"] for m in answers["api/models.json"]]
    listed_probes = {p["name"]: p["description"] for p in answers["api/probes.json"]}
    assert runs["models"] == ["default"] and set(runs["probes"]) == {"repeat", "text"}
    assert set(runs["probes"]) <= set(listed_probes) and "default" in listed_models
    graph = ScoreGraph(bool(model.config.causal)).score_names
    assert runs["head_types"] == [t for t, score in BEST_TYPES.items() if score in graph] + [
        "averaged"
    ]
    assert "syntactic" not in runs["head_types"] and "induction" in runs["head_types"]
    assert runs["routes"] == ["attention", "heads", "shapes", "switch-off"]
    note = runs["note"]
    assert "`headlab serve`" in note and "\n" not in note
    left = [name for name in listed_models if name not in runs["models"]]
    assert left and runs["left_out"]["models"] == left
    assert all(name in note for name in left), note
    for name, description in listed_probes.items():
        shown = description.split(" (")[0]  # as the page's menu names it
        assert (shown in note) == (name not in runs["probes"]), name
    with pytest.raises(ValueError, match="health"):
        site.with_manifest({"api/models.json": []}, model)
