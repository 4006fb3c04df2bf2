"""A model's one-time figures (the composition scores, the random-weights floors of the probes
the page runs without a text) are computed once, kept on disk and read back: warmed when the
server starts (in the background, never holding the start back) or when a model is fetched, a
later request does none of that work. Work is counted in calls, never timed."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterator
from types import SimpleNamespace

import pytest
import torch
from fastapi.testclient import TestClient

from conftest import require
from headlab import zoo
from headlab.files import one_thread
from headlab.heads import baselines, composition
from headlab.heads.composition import composition_cache_dir, composition_scores
from headlab.model import ModelConfig, Transformer
from headlab.server import create_app, warm

PAGE_REQUESTS = (  # what the page asks first, and with the evidence ticked, on each menu probe
    ("/api/heads", {}),
    ("/api/heads", {"evidence": True}),
    ("/api/heads", {"probe": "random-repeat", "evidence": True}),
    ("/api/circuit", {}),
)


@pytest.fixture
def counted(tmp_path, monkeypatch) -> Iterator[dict[str, int]]:
    """An empty cache folder and nothing kept in memory (as in a new process); the calls that
    compute random-weights floors and composition scores, counted."""
    monkeypatch.setenv("HEADLAB_CACHE", str(tmp_path))
    monkeypatch.setattr(baselines, "_MEMORY", {})
    monkeypatch.setattr(composition, "_KEPT", OrderedDict())
    composition.code_digest()  # once a process: it scores a tiny model, not counted here
    calls = {"floors": 0, "composition": 0}
    runs, scores = baselines.random_weight_runs, composition._composition_scores

    def floors(*args, **kwargs):
        calls["floors"] += 1
        return runs(*args, **kwargs)

    def composed(model):
        calls["composition"] += 1
        return scores(model)

    monkeypatch.setattr(baselines, "random_weight_runs", floors)
    monkeypatch.setattr(composition, "_composition_scores", composed)
    yield calls


def forget_memory(monkeypatch) -> None:
    """What a new process holds: nothing in memory, only what is on disk."""
    monkeypatch.setattr(baselines, "_MEMORY", {})
    monkeypatch.setattr(composition, "_KEPT", OrderedDict())


def ask_as_the_page(client: TestClient) -> None:
    for route, body in PAGE_REQUESTS:
        r = client.post(route, json={"model": "default", **body})
        assert r.status_code == 200, r.text


def small_model() -> Transformer:
    config = ModelConfig(vocab_size=20, d_model=24, n_layers=3, n_heads=4, n_kv_heads=2, max_len=16)
    with torch.random.fork_rng():
        torch.manual_seed(7)
        return Transformer(config).eval()


def test_composition_scores_on_disk_are_read_back_and_checked(counted, monkeypatch) -> None:
    """Kept on disk, the scores are read by a process that never computed them (equal, not
    computed again); an entry whose file changed is computed again, equal to the first; by
    default (a training run's weights change at every evaluation) nothing goes to disk."""
    model = small_model()
    first = composition_scores(model, on_disk=True)
    assert counted["composition"] == 1
    forget_memory(monkeypatch)
    again = composition_scores(model, on_disk=True)
    assert counted["composition"] == 1
    for mode, scores in first.scores.items():
        assert torch.equal(again.scores[mode], scores)
    assert again.baseline == first.baseline and again.pairs == first.pairs

    (entry,) = composition_cache_dir().iterdir()
    data = bytearray((entry / "scores.safetensors").read_bytes())
    data[-1] ^= 0xFF  # a flipped byte in the last score
    (entry / "scores.safetensors").write_bytes(bytes(data))
    forget_memory(monkeypatch)
    damaged = composition_scores(model, on_disk=True)
    assert counted["composition"] == 2
    for mode, scores in first.scores.items():
        assert torch.equal(damaged.scores[mode], scores)

    other = small_model()
    with torch.no_grad():
        other.blocks[0].attn.W_Q.weight.mul_(2.0)
    composition_scores(other)
    assert len(list(composition_cache_dir().iterdir())) == 1


@pytest.fixture
def default_model() -> None:
    require(zoo._default_info().available, "the default model is not built")


def test_a_model_warmed_at_startup_computes_nothing_on_request(
    default_model, counted, tmp_path, monkeypatch
) -> None:
    """On a cold cache the page's first requests, their evidence and the circuit compute the
    floors of three probes and the composition scores (what the counts count); on another
    cold cache, after the server's background warming computed the same, they compute none."""
    with TestClient(create_app(preload=("default",))) as client:
        ask_as_the_page(client)
    assert counted == {"floors": 3, "composition": 1}
    monkeypatch.setenv("HEADLAB_CACHE", str(tmp_path / "another"))
    forget_memory(monkeypatch)
    counted.update(floors=0, composition=0)
    app = create_app(preload=("default",), warm=["default"])
    with TestClient(app) as client:
        assert app.state.warm.join(timeout=600)
        assert app.state.warm.state == {"default": "ready"}
        assert counted == {"floors": 3, "composition": 1}
        ask_as_the_page(client)
    assert counted == {"floors": 3, "composition": 1}


def test_a_model_prepared_when_fetched_is_read_from_disk(default_model, counted, monkeypatch):
    """What ``headlab models --fetch`` prepares is on disk for a later process: a server
    started without warming, holding nothing in memory, computes nothing for the page."""
    from headlab.cli.info import prepare
    from headlab.server.progress import Timings

    prepare("default")
    assert counted == {"floors": 3, "composition": 1}
    model, _ = zoo.load("default")
    with one_thread():  # the thread count prepare measured on, which the times' key records
        kept = Timings().read("default", model.config)
    assert {"floors", "composition"} <= set(kept)  # what the server's plan then quotes
    forget_memory(monkeypatch)
    with TestClient(create_app(preload=())) as client:
        ask_as_the_page(client)
    assert counted == {"floors": 3, "composition": 1}


def test_warming_never_holds_back_the_start(default_model, tmp_path, monkeypatch) -> None:
    """The server answers while a model's warming has not finished (held here until the test
    lets it go); the server's stop then waits for nothing."""
    monkeypatch.setenv("HEADLAB_CACHE", str(tmp_path))
    go, started = threading.Event(), threading.Event()

    def held(model, tokenizer, say=None):
        started.set()
        assert go.wait(timeout=600)
        return {}

    monkeypatch.setattr(warm, "warm_model", held)
    app = create_app(preload=(), warm=["default"])
    try:
        with TestClient(app) as client:
            assert started.wait(timeout=600)
            assert client.get("/api/health").status_code == 200
            assert app.state.warm.state["default"] == "warming"
            go.set()
            assert app.state.warm.join(timeout=600)
    finally:
        go.set()
    assert app.state.warm.state["default"] == "ready"


class FakeStore:
    """A model store that offers one fetched model and one that is not: the catalogue's rows."""

    def __init__(self) -> None:
        self.loads: list[str] = []

    def catalogue(self) -> list[dict]:
        return [
            {"name": "default", "available": True},
            {"name": "gemma3", "available": False},
            {"name": "minilm", "available": True},
        ]

    def loaded_names(self) -> list[str]:
        return ["minilm"]


def test_only_models_already_here_are_warmed_those_held_first() -> None:
    """Warming never downloads: a model the catalogue says is not fetched is not named."""
    assert warm.available_models(FakeStore()) == ["minilm", "default"]


def test_a_model_that_fails_to_warm_says_why_and_the_next_is_warmed(monkeypatch) -> None:
    from headlab.server.progress import Timings

    loaded: list[str] = []

    def load(name):
        loaded.append(name)
        if name == "broken":
            raise ValueError("its files are damaged")
        return SimpleNamespace(config=None), object()

    monkeypatch.setattr(warm.Warmer, "_model", lambda self, name: load(name))
    monkeypatch.setattr(warm, "warm_model", lambda model, tokenizer: {})
    warmer = warm.Warmer(FakeStore(), Timings(), ["broken", "default"])
    warmer.start()
    assert warmer.join(timeout=600)
    assert loaded == ["broken", "default"]
    assert warmer.state == {"broken": "failed: its files are damaged", "default": "ready"}
