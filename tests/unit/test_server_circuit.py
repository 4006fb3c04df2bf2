"""POST /api/circuit: the induction circuit ``headlab circuit --json`` prints (the library's
:func:`headlab.heads.circuit.induction_circuit`, run here), and a 422 naming the field for an
ablation mode the server does not know."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from conftest import require
from headlab import zoo
from headlab.heads.circuit import induction_circuit
from headlab.measure import build_probe
from headlab.server import create_app


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    require(zoo._default_info().available, "the default model is not built")
    with TestClient(create_app(preload=())) as c:
        yield c


def test_circuit_equals_the_librarys(client: TestClient) -> None:
    r = client.post("/api/circuit", json={"model": "default"})
    assert r.status_code == 200, r.text
    got = r.json()
    model, tokenizer = zoo.load("default")
    c = model.config
    probe = build_probe("random-repeat", tokenizer, c.max_len, c.vocab_size, seed=0)
    want = induction_circuit(model, probe, "mean").to_dict()
    assert got["model"] == "default"
    assert got["edges"] == want["edges"] and got["edges"]
    assert got["previous"] == want["previous"] and got["induction"] == want["induction"]
    assert got["k_floor"] == want["k_floor"] and got["ablation"] == "mean"


def test_an_unknown_ablation_is_a_422_naming_the_field(client: TestClient) -> None:
    r = client.post("/api/circuit", json={"model": "default", "ablation": "resample"})
    assert r.status_code == 422 and "ablation" in r.text
    r = client.post("/api/circuit", json={"model": "default", "seed": -1})
    assert r.status_code == 422 and "seed" in r.text
