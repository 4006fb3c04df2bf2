"""POST /api/heads with "evidence": true: the same cards as the library, labels with their
margins, and a 422 naming the field for a value that is no boolean."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from conftest import require
from headlab import zoo
from headlab.heads.evidence import evidence
from headlab.measure import build_probe
from headlab.server import create_app


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    require(zoo._default_info().available, "the default model is not built")
    with TestClient(create_app(preload=())) as c:
        yield c


def test_evidence_is_opt_in_and_equals_the_librarys(client: TestClient) -> None:
    plain = client.post("/api/heads", json={"model": "default"}).json()
    assert plain.get("evidence") is None
    r = client.post("/api/heads", json={"model": "default", "evidence": True})
    assert r.status_code == 200, r.text
    body = r.json()
    model, tokenizer = zoo.load("default")
    c = model.config
    want = evidence(model, build_probe("repeat", tokenizer, c.max_len, c.vocab_size)).to_dict()
    got = body["evidence"]
    assert [h["evidence"] for h in got["heads"]] == [h["evidence"] for h in want["heads"]]
    assert [h["label"] for h in body["heads"]] == [h["label"] for h in want["heads"]]
    assert got["ablation"]["forwards"] == want["ablation"]["forwards"]
    assert body["weights"] and len(body["heads"]) == c.n_layers * c.n_heads


def test_a_non_boolean_evidence_is_a_422_naming_the_field(client: TestClient) -> None:
    r = client.post("/api/heads", json={"model": "default", "evidence": "yes"})
    assert r.status_code == 422 and "evidence" in r.text


def test_the_schema_documents_the_field(client: TestClient) -> None:
    schema = client.get("/openapi.json").json()["components"]["schemas"]
    assert "random-weight" in schema["HeadsRequest"]["properties"]["evidence"]["description"]
    assert "evidence" in schema["HeadsResponse"]["properties"]


def test_exact_heads_come_back_beside_the_estimate(client: TestClient) -> None:
    r = client.post("/api/heads", json={"model": "default", "evidence": True, "exact": [[0, 0]]})
    assert r.status_code == 200, r.text
    got = r.json()["evidence"]
    assert got["ablation"]["method"] == "attribution" and "exact" in got["heads"][0]["ablation"]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"exact": True}, 'add "evidence": true'),
        ({"evidence": True, "exact": [[0, 9]]}, "layers 0..1 and heads 0..7"),
        ({"evidence": True, "exact": "some"}, "exact"),
    ],
)
def test_a_bad_exact_is_a_422_naming_the_field(client: TestClient, body, message) -> None:
    r = client.post("/api/heads", json={"model": "default", **body})
    detail = r.json()["detail"]
    assert r.status_code == 422 and message in detail and "exact" in detail


def test_floors_that_do_not_fit_are_a_422_with_the_way_out(client, tmp_path, monkeypatch):
    """Where the floors' random copy would not fit in memory, /api/heads and /api/circuit
    answer 422 with both sizes and what to send instead (a 500 before): labels without
    floors, evidence left out (it needs them), and for the circuit no field at all."""
    from headlab.heads import baselines

    monkeypatch.setenv("HEADLAB_CACHE", str(tmp_path))  # no floors kept from earlier runs,
    monkeypatch.setattr(baselines, "_MEMORY", {})  # nor from earlier tests
    monkeypatch.setattr(baselines, "available_memory", lambda: 1)
    sizes = "more than this machine has available (0.0 MiB)"
    cases = [
        ("/api/heads", {}, 'send "floors": false'),
        ("/api/heads", {"evidence": True}, 'leave out "evidence": true'),
        ("/api/circuit", {"seed": 7}, "so it runs only where that much memory is free"),
    ]
    for path, body, way_out in cases:
        r = client.post(path, json={"model": "default", **body})
        assert r.status_code == 422, r.text
        detail = r.json()["detail"]
        assert sizes in detail and way_out in detail and "--no-floors" not in detail, detail
    r = client.post("/api/heads", json={"model": "default", "floors": False})
    assert r.status_code == 200 and r.json()["heads"], r.text
