"""POST /api/switch-off: the probe run intact and with a set of heads switched off, as the
library's headlab.heads.switch.switch_off answers it (and, for one head, as
headlab.heads.effects.ablate_heads measures it); a head the model lacks, a bad mode or a model
that predicts no next token is a 422 in one sentence."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from conftest import require
from headlab import zoo
from headlab.heads.effects import ablate_heads
from headlab.heads.evidence import loss_rows
from headlab.heads.switch import switch_off
from headlab.measure import build_probe
from headlab.server import create_app

TEXT = "the cat sat on the mat. the cat sat on the mat."


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    require(zoo._default_info().available, "the default model is not built")
    with TestClient(create_app(preload=())) as c:
        yield c


def test_a_set_switched_off_equals_the_library(client: TestClient, default) -> None:
    model, tokenizer = default
    c = model.config
    body = {"model": "default", "text": TEXT, "off": [[1, 3], [0, 0]], "mode": "zero"}
    r = client.post("/api/switch-off", json=body)
    assert r.status_code == 200, r.text
    got = r.json()
    probe = build_probe("text", tokenizer, c.max_len, c.vocab_size, TEXT)
    want = switch_off(model, probe, [(0, 0), (1, 3)], "zero").to_dict(tokenizer.token_strings)
    assert got["tokens"] == probe.labels and got["probe"] == "text"
    assert got["off"] == [[0, 0], [1, 3]] and got["mode"] == "zero"
    assert got["loss"] == want["loss"] and got["repeat_rows"] == want["repeat_rows"]
    for run in ("intact", "switched_off"):
        for key in ("predictions", "losses", "induction", "weights"):
            assert got[run][key] == want[run][key], (run, key)


def test_one_head_is_ablate_heads_for_it(client: TestClient, default, repeat) -> None:
    """The built-in repeat, head 0.0 mean-ablated: the rise of the loss on the repeat is
    ablate_heads' effect over the same rows, and the induction scores are its row."""
    r = client.post("/api/switch-off", json={"off": [[0, 0]]})
    assert r.status_code == 200, r.text
    got = r.json()
    assert got["probe"] == "repeat" and got["tokens"] == repeat.labels
    a = ablate_heads(default[0], repeat, [(0, 0)])
    rows = loss_rows(repeat, causal=True)["induction"]
    assert got["loss"]["repeat"]["rise"] == pytest.approx(float(a.loss_effect(rows)[0]), abs=2e-4)
    flat = [x for row in got["switched_off"]["induction"] for x in row]
    assert flat == pytest.approx(a.induction[0].flatten().tolist(), abs=2e-4)
    assert got["loss"]["repeat"]["rise"] > 2.0  # the previous-token head feeds the induction


@pytest.mark.parametrize(
    ("body", "said"),
    [
        ({"off": [[2, 0]]}, "head 2.0 does not exist; layers 0..1, heads 0..7"),
        ({"off": [[0, -1]]}, "greater than or equal to 0"),
        ({"off": []}, "off"),
        ({"off": [[0, 0]], "mode": "half"}, "mode"),
        ({"off": [[0, 0]], "probe": "repeat", "text": "a b"}, "takes no text"),
        ({}, "off"),
        ({"off": [[0, True]]}, "should be a JSON number, not true"),
        ({"off": [[0, "1"]]}, "should be a JSON number"),
        ({"off": [[0, 4096]]}, "less than or equal to 4095"),
    ],
)
def test_bad_requests_are_422_in_one_sentence(client: TestClient, body, said) -> None:
    r = client.post("/api/switch-off", json=body)
    assert r.status_code == 422, r.text
    assert said in r.json()["detail"] and "Traceback" not in r.text


def test_the_token_limit_keeps_both_runs_patterns_under_the_cap(client: TestClient) -> None:
    """An answer holds two runs' patterns (L · h · n² weights each): the schema states each
    model's limit so that both stay within MAX_WEIGHTS, and the route keeps to it. The default
    model takes its whole context; SmolLM2 (where installed) takes fewer tokens here than in
    /api/heads (121 against 128), and a text one token over is refused."""
    from headlab.server.routes.attention import token_limit
    from headlab.server.settings import MAX_WEIGHTS

    schemas = client.get("/openapi.json").json()["components"]["schemas"]
    limits = schemas["SwitchOffRequest"]["properties"]["text"]["x-max-tokens"]
    heads = schemas["TextRequest"]["properties"]["text"]["x-max-tokens"]
    assert limits.keys() == heads.keys() and limits["default"] == 64
    for name, n in limits.items():
        c = zoo.model_config(name)
        assert 2 * c.n_layers * c.n_heads * n * n <= MAX_WEIGHTS, name
        assert n <= heads[name]
    if "smollm2" not in limits:
        return
    assert limits["smollm2"] < heads["smollm2"]
    model, tokenizer = zoo.load("smollm2")
    assert token_limit(model, 2) == limits["smollm2"]
    words = " ".join(f"w{i}" for i in range(400))
    starts = {len(tokenizer.encode(words[:k])): words[:k] for k in range(1, len(words))}
    over = starts[limits["smollm2"] + 1]
    r = client.post("/api/switch-off", json={"model": "smollm2", "text": over, "off": [[0, 0]]})
    assert r.status_code == 422 and f"at most {limits['smollm2']}" in r.json()["detail"], r.text
