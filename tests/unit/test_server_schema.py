"""What the OpenAPI schema says a request may be is what the server takes (issue 43): the rules
across fields of POST /api/heads and each model's token limit are in the schema, checked here
by an outside JSON Schema validator against the server's answers; and a JSON integer too long
for Python to read is a 422 naming the field, as other bad numbers are, not a 400."""

from __future__ import annotations

from collections.abc import Iterator

import jsonschema
import pytest
from fastapi.testclient import TestClient

from conftest import require
from headlab import zoo
from headlab.server import create_app


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    require(zoo._default_info().available, "the default model is not built")
    with TestClient(create_app(preload=())) as c:
        yield c


def _schema(client: TestClient, name: str) -> dict:
    return client.get("/openapi.json").json()["components"]["schemas"][name]


@pytest.mark.parametrize(
    ("body", "said"),
    [
        ({"exact": True}, 'add "evidence": true'),
        ({"exact": [[0, 0]], "evidence": False}, 'add "evidence": true'),
        ({"evidence": True, "floors": False}, "random-weights floor"),
        ({"evidence": True, "probe": "needle"}, "tested by masking"),
    ],
)
def test_what_evidence_needs_is_in_the_schema(client: TestClient, body: dict, said: str) -> None:
    """Each body broke a rule the handler enforced and the schema did not state (schemathesis
    ST202: a schema-valid request refused): the schema now refuses it as the server does."""
    schema = _schema(client, "HeadsRequest")
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft202012Validator(schema).validate(body)
    r = client.post("/api/heads", json={"model": "default", **body})
    assert r.status_code == 422 and said in r.json()["detail"], r.text


@pytest.mark.parametrize(
    "body", [{"exact": None}, {"floors": False}, {"evidence": False, "floors": False}]
)
def test_bodies_within_the_evidence_rules_are_valid_and_taken(client, body: dict) -> None:
    jsonschema.Draft202012Validator(_schema(client, "HeadsRequest")).validate(body)
    r = client.post("/api/heads", json={"model": "default", **body})
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("route", ["/api/attention", "/api/heads"])
def test_the_schema_states_each_models_token_limit(client: TestClient, route: str) -> None:
    """The default model takes 64 tokens (its context, the start token included); the schema
    said only "at most 2,000 characters". A text of exactly the stated limit is answered, one
    token more is refused."""
    name = "HeadsRequest" if route == "/api/heads" else "TextRequest"
    limits = _schema(client, name)["properties"]["text"]["x-max-tokens"]
    _, tokenizer = zoo.load("default")
    assert limits["default"] == 64 == zoo.model_config("default").max_len
    words = " ".join(f"w{i}" for i in range(200))
    starts = {len(tokenizer.encode(words[:k])): words[:k] for k in range(1, len(words))}
    fits, over = starts[limits["default"]], starts[limits["default"] + 1]
    assert client.post(route, json={"model": "default", "text": fits}).status_code == 200
    r = client.post(route, json={"model": "default", "text": over})
    assert r.status_code == 422 and f"at most {limits['default']}" in r.json()["detail"]


DIGITS = "9" * 5000  # more than Python reads as an int (sys.get_int_max_str_digits(): 4,300)


@pytest.mark.parametrize(
    ("route", "body", "field"),
    [
        ("/api/shapes", '{"d_model": ' + DIGITS + "}", "d_model"),
        ("/api/circuit", '{"seed": -' + DIGITS + "}", "seed"),
        ("/api/heads", '{"evidence": true, "exact": [[' + DIGITS + ", 0]]}", "body"),
    ],
)
def test_a_5000_digit_integer_is_a_422_naming_the_field(client, route, body, field) -> None:
    """It was a 400 "There was an error parsing the body", where 10**40 is a 422 naming the
    field and its limit."""
    r = client.post(route, content=body, headers={"content-type": "application/json"})
    assert r.status_code == 422, r.text
    detail = r.json()["detail"]
    assert detail.startswith(f"{field}: a number of more than 4,300 digits cannot be read")
    assert "/docs lists each field's least and greatest value" in detail


def test_5000_digits_inside_a_string_are_a_string(client: TestClient) -> None:
    """Only a number is refused for its digits: the same digits as a string are the field's to
    judge (here the model name's pattern)."""
    body = '{"model": "' + DIGITS + '"}'
    r = client.post("/api/circuit", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 422 and r.json()["detail"].startswith("model: String should match")
