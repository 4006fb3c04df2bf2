"""Every label gated by its random-weights floor wherever a label is shown: ``headlab heads``
(JSON and table), POST /api/heads and the notebook view, through the one library entry
:func:`headlab.heads.baselines.label_heads`; the floors against an independent computation, and
cached floors against computed ones."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator

import numpy as np
import pytest
import torch
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from conftest import random_model_folders
from headlab import show
from headlab.cli import app
from headlab.heads import THRESHOLDS, analyse, label_head
from headlab.heads import baselines as B
from headlab.measure import build_probe

SEEDS = (0, 1, 2)  # what a user would pick; none of them a baseline seed
PROBES = ("repeat", "random-repeat")
runner = CliRunner()


@pytest.fixture(autouse=True)
def own_cache(tmp_path_factory, monkeypatch) -> None:
    """Each test reads and writes floors in a cache folder of its own, never the user's."""
    monkeypatch.setenv("HEADLAB_CACHE", str(tmp_path_factory.mktemp("cache")))


def probe_of(default, name: str):
    model, tokenizer = default
    return build_probe(name, tokenizer, model.config.max_len, model.config.vocab_size)


@pytest.fixture(scope="module")
def checkpoints(default, tmp_path_factory) -> dict[int, str]:
    """The default model's architecture with random weights (seeds 0–2), saved as model folders
    that ``headlab heads --model FOLDER`` loads, with the default model's tokenizer."""
    return random_model_folders(default[0], SEEDS, tmp_path_factory)


def type_labels(heads: list[dict]) -> set[str]:
    return {h["label"] for h in heads} - {"mixed"}


@pytest.mark.parametrize("probe", PROBES)
@pytest.mark.parametrize("seed", SEEDS)
def test_plain_heads_json_gives_a_random_model_no_type_labels(checkpoints, seed, probe) -> None:
    """`headlab heads --json` with no option: every head of a random model "mixed", each head
    saying which label its threshold alone gave and the floor took away."""
    result = runner.invoke(app, ["heads", "--model", checkpoints[seed], "--probe", probe, "--json"])
    assert result.exit_code == 0, result.output
    body = json.loads(result.stdout)
    assert type_labels(body["heads"] + body["averaged"]) == set()
    assert body["labels_gated"] is True
    # thresholds alone label some of these heads (the defect the floors remove)
    plain = runner.invoke(
        app, ["heads", "--model", checkpoints[seed], "--probe", probe, "--json", "--no-floors"]
    )
    ungated = json.loads(plain.stdout)
    assert ungated["labels_gated"] is False and ungated["floors"] is None
    lost = {h["below_floor"] for h in body["heads"]} - {None}
    assert lost == type_labels(ungated["heads"]) and lost


def test_the_table_says_which_labels_the_floor_took_away(checkpoints) -> None:
    gated = runner.invoke(app, ["heads", "--model", checkpoints[0], "--probe", "random-repeat"])
    assert gated.exit_code == 0, gated.output
    assert "below chance floor)" in gated.stdout and "random-weights floor" in gated.stdout
    plain = runner.invoke(app, ["heads", "--model", checkpoints[0], "--no-floors"])
    assert plain.exit_code == 0, plain.output
    assert "unchecked against chance" in plain.stdout and "below chance floor" not in plain.stdout


def test_no_floors_gives_the_threshold_labels_of_analyse(default) -> None:
    probe = probe_of(default, "repeat")
    result = runner.invoke(app, ["heads", "--json", "--no-floors"])
    assert result.exit_code == 0, result.output
    want = analyse(default[0], probe, keep=())
    got = json.loads(result.stdout)["heads"]
    assert [h["label"] for h in got] == [s.label for s in want.heads]
    assert all(h["floor"] is None and h["below_floor"] is None for h in got)


@pytest.fixture(scope="module")
def client(default) -> Iterator[TestClient]:
    from headlab.server import create_app

    with TestClient(create_app(preload=())) as c:
        yield c


@pytest.mark.parametrize("seed", SEEDS)
def test_the_page_gives_a_random_model_no_type_labels(default, client, seed, monkeypatch) -> None:
    """POST /api/heads without evidence, for a random model in the server's store: no type
    label; with "floors": false the threshold labels, marked unchecked."""
    model, tokenizer = default
    random = B.random_model(model, seed)
    monkeypatch.setattr(client.app.state.models, "get", lambda name: (random, tokenizer))
    for name in PROBES:
        r = client.post("/api/heads", json={"model": "default", "probe": name})
        assert r.status_code == 200, r.text
        body = r.json()
        assert type_labels(body["heads"] + body["averaged"]) == set(), name
        assert body["labels_gated"] is True
    r = client.post("/api/heads", json={"probe": "random-repeat", "floors": False})
    assert r.json()["labels_gated"] is False and type_labels(r.json()["heads"])


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ({"floors": "no"}, "floors"),
        ({"floors": False, "evidence": True}, "floors"),
    ],
)
def test_bad_floors_requests_get_a_422_naming_the_field(client, body, needle) -> None:
    r = client.post("/api/heads", json={"model": "default", **body})
    assert r.status_code == 422 and needle in r.text


def test_evidence_without_floors_is_refused_in_one_line() -> None:
    result = runner.invoke(app, ["heads", "--evidence", "--no-floors"])
    assert result.exit_code == 2 and "--no-floors" in result.output
    assert "Traceback" not in result.output


@pytest.mark.parametrize("seed", SEEDS)
def test_the_notebook_view_gives_a_random_model_no_type_labels(default, seed) -> None:
    model, _ = default
    probe = probe_of(default, "random-repeat")
    view = show.heads_view(B.random_model(model, seed), probe, name="random")
    assert type_labels(view.parts[0]["report"]["heads"]) == set()
    assert "random-weights floor" in repr(view)
    plain = show.heads_view(B.random_model(model, seed), probe, floors=False)
    assert type_labels(plain.parts[0]["report"]["heads"])
    assert "unchecked against chance" in repr(plain)


@pytest.mark.parametrize("probe", PROBES)
def test_the_trained_model_keeps_its_induction_and_previous_token_labels(default, probe) -> None:
    report = B.label_heads(default[0], probe_of(default, probe), keep=())
    labels = {(s.layer, s.head): s.label for s in report.heads}
    assert labels[(0, 0)] == "previous-token"
    assert all(labels[(1, h)] == "induction" for h in (0, 3, 5))
    for s in report.heads:
        if s.label in ("previous-token", "induction"):
            assert s.margin is not None and s.margin > 0 and not s.below_floor


def by_hand(model, probe, averaged: bool = False) -> dict[int, dict[str, float]]:
    """layer → type → mean + K_SD · sd over the layer's heads of the three random models,
    each analysed here, with NumPy's sample sd; with ``averaged`` over the layer's averaged
    head of each."""
    runs = [analyse(B.random_model(model, s), probe, keep=()) for s in B.BASELINE_SEEDS]
    out: dict[int, dict[str, float]] = {}
    for layer in range(model.config.n_layers):
        for kind in runs[0].heads[0].scores:
            rows = [r.averaged if averaged else r.heads for r in runs]
            values = [s.scores[kind] for heads in rows for s in heads if s.layer == layer]
            out.setdefault(layer, {})[kind] = float(
                np.mean(values) + B.K_SD * np.std(values, ddof=1)
            )
    return out


@pytest.mark.parametrize("probe", PROBES)
def test_the_floors_equal_an_independent_computation(default, probe) -> None:
    """The report's floors, and each head's floor and margin, against mean + K_SD · sd taken by
    hand from the random models analysed one by one."""
    model, _ = default
    p = probe_of(default, probe)
    want = by_hand(model, p)
    report = B.label_heads(model, p, keep=())
    assert report.floors is not None
    for layer, floors in want.items():
        for kind, value in floors.items():
            assert report.floors[layer][kind] == pytest.approx(value, abs=1e-5), (layer, kind)
    for s in report.heads:
        if s.floor is not None:
            kind = next(
                k for k, v in want[s.layer].items() if v == pytest.approx(s.floor, abs=1e-5)
            )
            assert s.margin == pytest.approx(s.scores[kind] - s.floor, abs=1e-6)
    averaged = by_hand(model, p, averaged=True)
    for s in report.averaged:  # each layer's averaged head against the random averaged heads
        ruled = {k: v for k, v in s.scores.items() if k in THRESHOLDS}
        assert s.label == label_head(ruled, s.offset, averaged[s.layer]), s.layer


def test_cached_floors_equal_computed_ones(default, monkeypatch) -> None:
    """Computed without the cache, then through it (written to disk), then read back from disk
    with the process's memory emptied and computing forbidden: the same float32 values."""
    model, _ = default
    p = probe_of(default, "random-repeat")
    computed = B.random_spreads(model, p, cache=False)
    monkeypatch.setattr(B, "_MEMORY", {})
    first = B.random_spreads(model, p)
    assert len(list(B.floors_cache_dir().glob("*.json"))) == 1
    monkeypatch.setattr(B, "_MEMORY", {})

    def forbidden(*args, **kwargs):
        raise AssertionError("the floors were computed again")

    monkeypatch.setattr(B, "random_weight_runs", forbidden)
    from_disk = B.random_spreads(model, p)
    from_memory = B.random_spreads(model, p)
    for got in (first, from_disk, from_memory):
        for part, want in zip(got, computed, strict=True):  # the heads', the averaged heads'
            assert part.keys() == want.keys()
            assert all(torch.equal(part[k], want[k]) for k in want)


def test_the_cache_key_follows_the_architecture_and_the_probe_not_the_weights(default) -> None:
    model, _ = default
    p, q = probe_of(default, "repeat"), probe_of(default, "random-repeat")
    key = B.floors_key(model, p, B.BASELINE_SEEDS, True)
    assert key == B.floors_key(B.random_model(model, 5), p, B.BASELINE_SEEDS, True)
    assert key != B.floors_key(model, q, B.BASELINE_SEEDS, True)
    assert key != B.floors_key(model, p, B.BASELINE_SEEDS, False)
    wider = copy.deepcopy(model).to(torch.float64)
    assert key != B.floors_key(wider, p, B.BASELINE_SEEDS, True)


def test_compare_gives_random_checkpoints_no_type_labels(default) -> None:
    """`headlab compare`'s series labels each checkpoint as `headlab heads` does."""
    from headlab import series

    model, tokenizer = default
    members = [(f"random{s}", B.random_model(model, s), tokenizer) for s in SEEDS]
    compared = series.compare(members, probe_of(default, "random-repeat"))
    assert {label for row in compared.labels() for label in row} == {"mixed"}
