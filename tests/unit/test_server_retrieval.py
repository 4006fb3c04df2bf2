"""POST /api/retrieval/needle: one needle run live, against the library's own scoring of the same
probe, and bad input refused with the field named; the page lists the long-context runs."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from fastapi.testclient import TestClient

from conftest import require
from headlab import zoo
from headlab.heads import retrieval as r
from headlab.server import create_app
from headlab.server.routes.experiments import PAGE_EXPERIMENTS


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    with TestClient(create_app(preload=())) as c:
        yield c


def test_the_needle_answer_is_the_probe_scored_directly(client: TestClient) -> None:
    """The route's top heads and answer equal :func:`headlab.heads.retrieval.answer` and the
    score's rule applied to the same probe (default model: its positions size the probe)."""
    require(zoo._default_info().available, "the default model is not built")
    got = client.post("/api/retrieval/needle", json={"model": "default", "depth": 0.25, "seed": 3})
    assert got.status_code == 200, got.text
    body = got.json()
    model, tokenizer = zoo.load("default")
    length = model.config.max_len - 2 * r.DIGITS
    probe = r.build_needle(tokenizer, r.haystack(tokenizer), length, 0.25, 3, r.SHORT_QUESTION)
    generated, tops = r.answer(model, [probe])
    scores = r.retrieval_scores(tops, generated, [probe])[0]  # (L, h)
    assert body["length"] == length and body["answered"] == torch.equal(generated[0], probe.answer)
    assert body["generated"] == tokenizer.decode(generated[0].tolist()).strip()
    flat = scores.flatten()
    positive = sorted(((float(v), i) for i, v in enumerate(flat) if v > 0), reverse=True)
    assert [t["score"] for t in body["top_heads"]] == [round(v, 4) for v, _ in positive[:8]]
    assert body["above_threshold"] == int((scores >= 0.1).sum())
    assert body["heads"] == scores.numel()


@pytest.mark.parametrize(
    ("payload", "field"),
    [({"depth": 1.5}, "depth"), ({"seed": "1"}, "seed"), ({"seed": -1}, "seed"),
     ({"model": "../x"}, "model"), ({"depths": 0.5}, "depths")],
)  # fmt: skip
def test_bad_needle_requests_name_the_field(client: TestClient, payload: dict, field: str) -> None:
    got = client.post("/api/retrieval/needle", json=payload)
    assert got.status_code == 422
    assert field in got.json()["detail"]


def test_an_unknown_model_is_a_404_listing_the_offered_ones(client: TestClient) -> None:
    got = client.post("/api/retrieval/needle", json={"model": "nope"})
    assert got.status_code == 404 and "available models" in got.json()["detail"]


def test_the_page_has_the_long_context_sections(client: TestClient) -> None:
    assert {"retrieval", "sinks"} <= set(PAGE_EXPERIMENTS)
    page = client.get("/").text
    for name in ("retrieval", "sinks"):
        assert f'data-experiment="{name}"' in page
    assert client.get("/api/experiments").json()["missing"] == []
