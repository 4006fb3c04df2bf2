"""Labels over many prompts (``headlab heads --prompts``, :func:`headlab.scaling.prompt_table`)
gated by their random-weights floors as one probe's are: a random model gets no type labels,
the trained model keeps its induction heads, the floors against an independent computation, and
``--no-floors`` as thresholds alone."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from conftest import random_model_folders
from headlab import scaling
from headlab.cli import app
from headlab.heads import THRESHOLDS, analyse, label_head
from headlab.heads import baselines as B
from headlab.measure import text_probe

SEEDS = (0, 1, 2)  # what a user would pick; none of them a baseline seed
PROMPTS = [
    "The cat sat on the mat. The cat sat on the mat.",
    "A dog ran, and a dog ran again.",
    "One two three, one two three.",
]
WORDS = "cat dog sun rain tree stone river apple bread horse cloud lamp chair glass door fish"
ONE = scaling.Ranks(0, 1, torch.device("cpu"))
runner = CliRunner()


@pytest.fixture(scope="module")
def checkpoints(default, tmp_path_factory) -> dict[int, str]:
    """The default model's architecture with random weights (seeds 0–2), saved as model folders
    that ``headlab heads --model FOLDER`` loads, with the default model's tokenizer."""
    return random_model_folders(default[0], SEEDS, tmp_path_factory)


def repeated(count: int = 4) -> list[str]:
    """Prompts of 12 random words said twice: where induction heads show."""
    rng, words = random.Random(0), WORDS.split()
    seqs = [" ".join(rng.choice(words) for _ in range(12)) for _ in range(count)]
    return [f"{s} {s}" for s in seqs]


def probes(default, texts: list[str]) -> list[tuple[int, object]]:
    model, tokenizer = default
    return [(i, text_probe(tokenizer, t, model.config.max_len)) for i, t in enumerate(texts)]


def type_labels(rows: list[dict]) -> set[str]:
    return {r["label"] for r in rows} - {"mixed"}


@pytest.mark.parametrize("seed", SEEDS)
def test_a_random_model_over_prompts_gets_no_type_labels(checkpoints, seed, tmp_path) -> None:
    """`headlab heads --prompts FILE` on a random model: every head "mixed" (thresholds alone
    label some, which the floors take away and each head names)."""
    path = tmp_path / "p.txt"
    path.write_text("\n".join(PROMPTS) + "\n", encoding="utf-8")
    args = ["heads", "--model", checkpoints[seed], "--prompts", str(path), "--json"]
    gated = runner.invoke(app, args)
    assert gated.exit_code == 0, gated.output
    body = json.loads(gated.stdout)
    assert type_labels(body["heads"] + body["averaged"]) == set()
    assert body["floors"] == {"seeds": list(B.BASELINE_SEEDS), "k": B.K_SD}
    plain = runner.invoke(app, [*args, "--no-floors"])
    assert plain.exit_code == 0, plain.output
    ungated = json.loads(plain.stdout)
    assert ungated["floors"] is None
    lost = {r["below_floor"] for r in body["heads"] + body["averaged"]} - {None}
    assert lost == type_labels(ungated["heads"] + ungated["averaged"]) and lost


def test_the_trained_model_keeps_its_induction_heads_over_repeated_prompts(default) -> None:
    """Over prompts of repeated random words the default model's heads 1.0, 1.3 and 1.5 are
    induction heads by their induction score alone, 1.2, 1.6 and 1.7 by the share of the attention
    they do not rest on the first token (docs/heads.md), with thresholds alone; and all stay
    so above their floors."""
    mine = probes(default, repeated())
    plain = scaling.prompt_table(default[0], mine, ONE, floors=False)
    gated = scaling.prompt_table(default[0], mine, ONE)
    induction = {(s.layer, s.head) for s in plain.heads if s.label == "induction"}
    by_mass = {(s.layer, s.head) for s in plain.heads if s.scores["induction"] >= 0.5}
    assert by_mass == {(1, 0), (1, 3), (1, 5)}
    assert induction == by_mass | {(1, 2), (1, 6), (1, 7)}
    for s in gated.heads:
        if (s.layer, s.head) in induction:
            assert s.label == "induction" and s.margin is not None and s.margin > 0
    assert gated.heads[0].label == "previous-token"


def by_hand(model, mine, averaged: bool = False) -> dict[int, dict[str, float]]:
    """layer → type → mean + K_SD · sd (NumPy, ddof 1) over the layer's heads and the random
    models, each head's score averaged over the prompts here, each prompt analysed on its own;
    with ``averaged`` the layers' averaged heads."""
    per_model = []
    for s in B.BASELINE_SEEDS:
        random_model = B.random_model(model, s)
        reports = [analyse(random_model, p, keep=()) for _, p in mine]
        rows = [r.averaged if averaged else r.heads for r in reports]
        per_model.append(
            [
                {k: np.mean([r[j].scores[k] for r in rows]) for k in rows[0][j].scores}
                | {"layer": rows[0][j].layer}
                for j in range(len(rows[0]))
            ]
        )
    out: dict[int, dict[str, float]] = {}
    for layer in range(model.config.n_layers):
        heads = [h for m in per_model for h in m if h["layer"] == layer]
        for kind in set(heads[0]) - {"layer"}:
            values = [h[kind] for h in heads]
            out.setdefault(layer, {})[kind] = float(
                np.mean(values) + B.K_SD * np.std(values, ddof=1)
            )
    return out


def test_the_floors_equal_an_independent_computation(default) -> None:
    """The table's floors, each head's floor and margin, and the averaged heads' labels against
    mean + K_SD · sd taken by hand from the random models' prompts scored one by one."""
    model = default[0]
    mine = probes(default, PROMPTS)
    table = scaling.prompt_table(model, mine, ONE)
    want = by_hand(model, mine)
    assert table.floors is not None and set(table.floors) == set(want)
    for layer, floors in want.items():
        for kind, value in floors.items():
            assert table.floors[layer][kind] == pytest.approx(value, abs=1e-5), (layer, kind)
    for s in table.heads:
        if s.floor is not None:
            kind = next(
                k for k, v in want[s.layer].items() if v == pytest.approx(s.floor, abs=1e-5)
            )
            assert s.margin == pytest.approx(s.scores[kind] - s.floor, abs=1e-6)
        ruled = {k: v for k, v in s.scores.items() if k in THRESHOLDS}
        assert s.label == label_head(ruled, s.offset, want[s.layer]), (s.layer, s.head)
    averaged = by_hand(model, mine, averaged=True)
    for s in table.averaged:
        ruled = {k: v for k, v in s.scores.items() if k in THRESHOLDS}
        assert s.label == label_head(ruled, s.offset, averaged[s.layer]), s.layer


def test_no_floors_is_the_threshold_table_and_the_legend_says_which(tmp_path, monkeypatch) -> None:
    """--no-floors: the means labelled by thresholds alone, no floor on any head, and the
    terminal legend says so; the default legend names the floors. The CSV carries the floors."""
    monkeypatch.chdir(tmp_path)
    Path("p.txt").write_text("\n".join(repeated(2)) + "\n", encoding="utf-8")
    plain = runner.invoke(app, ["heads", "--prompts", "p.txt", "--no-floors", "--json"])
    assert plain.exit_code == 0, plain.output
    body = json.loads(plain.stdout)
    for row in body["heads"] + body["averaged"]:
        ruled = {k: v for k, v in row["scores"].items() if k in THRESHOLDS}
        assert row["label"] == label_head(ruled, row["offset"])
        assert row["floor"] is None and row["margin"] is None and row["below_floor"] is None
    text = runner.invoke(app, ["heads", "--prompts", "p.txt", "--no-floors"])
    assert "unchecked against chance" in text.stdout
    gated = runner.invoke(app, ["heads", "--prompts", "p.txt", "--out", "t.csv"])
    assert gated.exit_code == 0, gated.output
    lines = Path("t.csv").read_text().splitlines()
    assert lines[0].endswith(",floor,margin,below_floor")
    assert all(line.split(",")[-3] for line in lines[1:])  # every head has a floor
    shown = runner.invoke(app, ["heads", "--prompts", "p.txt"])
    assert "random-weights floor" in shown.stdout
