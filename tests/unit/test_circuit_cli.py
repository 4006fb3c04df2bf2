"""`headlab circuit`, `headlab heads --evidence` and the notebook views of both: JSON that
matches the library's answer, one-line errors, and SVG/HTML drawn from the data."""

from __future__ import annotations

import json
import re

import pytest
from typer.testing import CliRunner

from conftest import require
from headlab import zoo
from headlab.cli import app
from headlab.show import circuit_view, evidence_view

runner = CliRunner()


@pytest.fixture(scope="module")
def built():
    require(zoo._default_info().available, "the default model is not built")


@pytest.fixture(scope="module")
def circuit_json(built):
    result = runner.invoke(app, ["circuit", "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_circuit_json_has_the_default_models_circuit(circuit_json):
    d = circuit_json
    assert d["model"] == "default" and d["ablation"] == "mean"
    assert [p["head"] for p in d["previous"]] == [[0, 0]]
    induction = {tuple(p["head"]) for p in d["induction"]}
    assert {tuple(e["to"]) for e in d["edges"] if e["drawn"]} == induction
    assert d["forwards"] == 2 and set(d["seconds"]) == {"labels", "composition", "ablation"}


def test_circuit_text_names_every_edge(built):
    result = runner.invoke(app, ["circuit", "--ablation", "zero"])
    assert result.exit_code == 0, result.output
    text = " ".join(result.stdout.split())
    assert "0.0 → 1.0: K-composition" in text and "(drawn)" in text


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["circuit", "--ablation", "resample"], "valid modes are mean, zero"),
        (["heads", "--evidence", "--ablation", "half"], "valid modes are mean, zero"),
        (["heads", "--evidence", "--prompts", "p.txt"], "leave it out with --prompts"),
        (["heads", "--exact", "all"], "add --evidence"),
        (["heads", "--evidence", "--exact", "1-2"], "--exact takes all or LAYER.HEAD"),
        (["heads", "--evidence", "--exact", "0.9"], "layers 0..1 and heads 0..7"),
    ],
)
def test_bad_evidence_options_exit_2_with_one_line(args, message):
    result = runner.invoke(app, args)
    assert result.exit_code == 2
    assert message in " ".join(result.stderr.split()) and "Traceback" not in result.output


def test_heads_evidence_json_carries_every_card(built):
    result = runner.invoke(app, ["heads", "--evidence", "--json"])
    assert result.exit_code == 0, result.output
    d = json.loads(result.stdout)
    cards = d["evidence"]["heads"]
    assert [(c["layer"], c["head"], c["label"]) for c in cards] == [
        (h["layer"], h["head"], h["label"]) for h in d["heads"]
    ]
    for card in cards:
        assert card["evidence"] and {"baselines", "ablation", "compositions"} <= set(card)
    assert d["evidence"]["ablation"]["forwards"] == 3
    assert d["evidence"]["ablation"]["method"] == "exact"  # cheaper than the estimate here


def test_heads_evidence_exact_heads_stand_beside_the_estimate(built):
    result = runner.invoke(app, ["heads", "--evidence", "--json", "--exact", "0.0,1.3"])
    assert result.exit_code == 0, result.output
    d = json.loads(result.stdout)["evidence"]
    assert d["ablation"]["method"] == "attribution" and d["exact_ablation"]["method"] == "exact"
    cards = {(c["layer"], c["head"]): c for c in d["heads"]}
    assert "exact" in cards[(0, 0)]["ablation"] and "exact" in cards[(1, 3)]["ablation"]


@pytest.mark.parametrize("exact", [None, "0.0,1.3"])
def test_heads_evidence_says_how_its_ablation_effects_were_measured(built, exact):
    """The last line says what the JSON says: every head ablated exactly, in its forward
    passes, or every head estimated by attribution patching (forward and backward passes), the
    heads asked for then ablated exactly; never "ablated" for an estimate."""
    args = ["heads", "--evidence"] + ([] if exact is None else ["--exact", exact])
    d = json.loads(runner.invoke(app, [*args, "--json"]).stdout)["evidence"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    line = " ".join(result.stdout.split()).split("labels ≥ mean + 3 sd; ")[1]
    a, checked = d["ablation"], d["exact_ablation"]
    stages = ", ".join(rf"{stage} \d+\.\d\d" for stage in d["seconds"])
    assert re.search(rf"; seconds: {stages}$", line), line
    if exact is None:
        assert a["method"] == "exact" and checked is None
        assert line.startswith(
            f"{a['heads']} heads ablated exactly (mean) in {a['forwards']} forward passes "
            f"({a['model_passes']} whole-model forward equivalents)"
        )
    else:
        assert a["method"] == "attribution" and checked["method"] == "exact"
        assert line.startswith(
            f"{a['heads']} heads' ablation effects (mean) estimated by attribution patching "
            f"from {a['forwards']} forward and {a['backwards']} backward passes "
            f"({a['model_passes']} whole-model forward equivalents), then {checked['heads']} "
            f"of them ablated exactly in {checked['forwards']} forward passes "
            f"({checked['model_passes']} whole-model forward equivalents)"
        )


def test_the_circuit_view_draws_each_node_and_edge():
    d = {
        "previous": [{"head": [0, 2], "score": 0.9}],
        "induction": [{"head": [1, 1], "score": 0.8}, {"head": [2, 0], "score": 0.7}],
        "edges": [
            {"from": [0, 2], "to": [1, 1], "k_composition": 0.3, "drawn": True},
            {"from": [0, 2], "to": [2, 0], "k_composition": 0.12, "drawn": False},
        ],
        "k_floor": 0.1,
        "ablation": "mean",
    }
    html = circuit_view(d, model="m<1>")._repr_html_()
    assert html.count("<circle") == 3 and html.count("<line") == 2
    assert html.count("stroke-dasharray") == 1  # the edge ablation did not confirm
    assert "m&lt;1&gt;" in html and "m<1>" not in html


def test_the_evidence_view_escapes_each_sentence():
    d = {"heads": [{"layer": 0, "head": 1, "label": "mixed", "evidence": "a < b & c"}]}
    html = evidence_view(d)._repr_html_()
    assert "<td>0.1</td><td>mixed</td><td>a &lt; b &amp; c</td>" in html


def test_floors_that_do_not_fit_name_the_way_out_for_each_command(built, tmp_path, monkeypatch):
    """Where the floors' random copy would not fit in memory, each command that needs them
    exits 2 with one line giving both sizes and its own way out: plain `heads` runs with
    --no-floors, `heads --evidence` cannot (it needs the floors), and `circuit` labels its
    heads above the floors, so it names no flag that would only fail next."""
    from headlab.heads import baselines

    monkeypatch.setenv("HEADLAB_CACHE", str(tmp_path))  # no floors kept from earlier runs,
    monkeypatch.setattr(baselines, "_MEMORY", {})  # nor from earlier tests
    monkeypatch.setattr(baselines, "available_memory", lambda: 1)
    sizes = "more than this machine has available (0.0 MiB)"
    cases = {
        ("heads",): "score it without them (--no-floors",
        ("heads", "--evidence"): "--evidence needs them; leave it out and add --no-floors",
        ("circuit",): "so it runs only where that much memory is free",
    }
    for args, way_out in cases.items():
        result = runner.invoke(app, [*args, "--model", "default"])
        said = " ".join(result.stderr.split())
        assert result.exit_code == 2 and "Traceback" not in result.output, result.output
        assert sizes in said and way_out in said, said
        assert ("--no-floors" in said) == (args[0] == "heads"), said
    assert runner.invoke(app, ["heads", "--model", "default", "--no-floors"]).exit_code == 0
