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


def test_only_the_last_few_circuits_are_kept(client: TestClient, monkeypatch) -> None:
    """Every seed's circuit was kept for as long as the server ran (2**31 seeds, each seconds
    of CPU): only the last CIRCUITS_KEPT asked are. One asked again is answered from memory; one
    pushed out is computed again."""
    from headlab.heads import circuit
    from headlab.server.app import CIRCUITS_KEPT

    computed: list[int] = []

    class Found:  # what induction_circuit returns, told apart by the order it was computed in
        def __init__(self, number: int) -> None:
            self.number = number

        def to_dict(self) -> dict:
            empty: dict = {"previous": [], "induction": [], "edges": [], "seconds": {}}
            return {**empty, "k_floor": float(self.number), "ablation": "mean", "forwards": 0}

    def counted(model, probe, ablation) -> Found:
        computed.append(len(computed))
        return Found(computed[-1])

    monkeypatch.setattr(circuit, "induction_circuit", counted)
    seeds = [1000 + i for i in range(CIRCUITS_KEPT + 2)]

    def ask(seed: int) -> float:
        r = client.post("/api/circuit", json={"model": "default", "seed": seed})
        assert r.status_code == 200, r.text
        return r.json()["k_floor"]

    assert [ask(s) for s in seeds] == list(range(len(seeds)))  # each new seed: computed
    assert len(client.app.state.circuits.keys()) == CIRCUITS_KEPT  # type: ignore[attr-defined]
    assert ask(seeds[-1]) == len(seeds) - 1  # the last one: kept
    assert ask(seeds[0]) == len(seeds)  # the first: pushed out, computed again
    assert len(computed) == len(seeds) + 1
