"""`--verify`: a rebuild is bit-identical where the machine allows and within tolerance anywhere.

The comparisons run on the shipped files themselves and on copies altered the way a rebuild on
another CPU alters them (last bits of every figure, head indices moved), or the way a broken
recipe would (a figure out of tolerance, a head type gone).
"""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from headlab.cli import app
from headlab.experiments import registry, results_path
from headlab.verify import (
    CARD_TOLERANCES,
    CLAIMED_TYPES,
    verify_card,
    verify_induction,
)
from headlab.zoo import WEIGHTS_DIR

runner = CliRunner()


@pytest.fixture(scope="module")
def card() -> dict:
    return json.loads((WEIGHTS_DIR / "card.json").read_text())


@pytest.fixture(scope="module")
def induction() -> dict:
    return json.loads(results_path("induction").read_text())


def moved(card: dict) -> dict:
    """The card as another CPU might rebuild it: other bits, every figure nudged, heads at other
    indices (each label moved to the next head of its layer), labels kept."""
    other = copy.deepcopy(card)
    for entry in other["files"].values():
        entry["sha256"] = "0" * 64
    for name, tol in CARD_TOLERANCES.items():
        other["figures"][name] += 0.5 * tol
    for probe, heads in other["heads"].items():
        n_heads = 1 + max(h[1] for h in heads)
        other["heads"][probe] = [[l, (i + 1) % n_heads, label, off] for l, i, label, off in heads]
    return other


def test_the_shipped_card_against_itself_is_bit_identical(card: dict) -> None:
    v = verify_card(card, copy.deepcopy(card))
    assert v.identical and v.ok
    assert v.verdict() == "verdict: the default model is bit-identical to the shipped one"


def test_a_rebuild_with_other_bits_and_moved_heads_passes_within_tolerance(card: dict) -> None:
    v = verify_card(card, moved(card))
    assert not v.identical and v.ok
    assert set(v.differing) == {"config.json", "model.safetensors", "tokenizer.json"}
    assert {c.name for c in v.checks} >= set(CARD_TOLERANCES)
    shipped_types = {h[2] for heads in card["heads"].values() for h in heads}
    assert any(t in shipped_types for t in CLAIMED_TYPES)  # there is something to check
    assert "reproduced within tolerance" in v.verdict()


def test_a_figure_out_of_tolerance_fails_by_name(card: dict) -> None:
    other = moved(card)
    other["figures"]["val_loss"] = card["figures"]["val_loss"] + 2 * CARD_TOLERANCES["val_loss"]
    v = verify_card(card, other)
    assert not v.ok
    assert [c.name for c in v.checks if not c.ok] == ["val_loss"]
    assert "NOT reproduced" in v.verdict() and "val_loss" in v.verdict()


def test_a_missing_head_type_fails(card: dict) -> None:
    probe, heads = next(
        (p, hs) for p, hs in card["heads"].items() if any(h[2] in CLAIMED_TYPES for h in hs)
    )
    gone = next(h[2] for h in heads if h[2] in CLAIMED_TYPES)
    other = moved(card)
    other["heads"][probe] = [[*h[:2], "mixed", h[3]] if h[2] == gone else h for h in heads]
    v = verify_card(card, other)
    assert [c.name for c in v.checks if not c.ok] == [f"{gone} head on {probe}"]


def test_induction_results_against_themselves_are_identical(induction: dict) -> None:
    rerun = copy.deepcopy(induction)
    for record in rerun["history"]:  # wall times are never reproducible; they do not count
        for key in ("wall", "elapsed"):
            if key in record:
                record[key] += 1.0
    v = verify_induction(induction, rerun)
    assert v.identical and v.ok


def test_induction_results_with_a_shifted_phase_change_pass_or_fail_by_the_rule(
    induction: dict,
) -> None:
    rerun = copy.deepcopy(induction)
    rerun["history"] = rerun["history"][:-1]
    for s in rerun["seeds"]:
        s["phase_change_step"] = round(s["phase_change_step"] * 1.1)
    assert verify_induction(induction, rerun).ok
    rerun["seeds"][1]["phase_change_step"] = induction["seeds"][1]["phase_change_step"] * 2
    rerun["seeds"][2]["induction_heads"] = []
    v = verify_induction(induction, rerun)
    failed = [c.name for c in v.checks if not c.ok]
    assert failed == ["seed 1 phase-change step", "seed 2 induction head"]


def test_verify_options_are_refused_where_they_mean_nothing() -> None:
    for args in (
        ["train", "induction", "--verify"],
        ["train", "default", "--quick", "--verify"],
        ["experiment", "prune", "--verify"],
        ["experiment", "induction", "--quick", "--verify"],
    ):
        result = runner.invoke(app, args)
        assert result.exit_code == 2, args
        assert "--verify" in result.stderr and "Traceback" not in result.output


def test_train_default_verify_reports_the_rebuild(monkeypatch, tmp_path: Path) -> None:
    """The CLI path end to end, with training replaced by copying a finished run's files:
    the shipped files give the bit-identical verdict and exit 0; a changed figure exits 1."""

    def fake_run(out: Path, **options) -> _Done:
        shutil.copytree(WEIGHTS_DIR, Path(out) / "model", dirs_exist_ok=True)
        return _Done()

    monkeypatch.setattr(registry, "recipes", lambda: {"default": fake_run})
    out = tmp_path / "run"
    result = runner.invoke(app, ["train", "default", "--verify", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "bit-identical" in result.stdout
    card = json.loads((out / "model" / "card.json").read_text())
    card["figures"]["random_second_copy_loss"] += 1.0
    (out / "model" / "card.json").write_text(json.dumps(card))
    config = out / "model" / "config.json"  # other bytes: the hashes no longer match
    config.write_text(config.read_text() + "\n")
    monkeypatch.setattr(registry, "recipes", lambda: {"default": lambda out, **options: _Done()})
    result = runner.invoke(app, ["train", "default", "--verify", "--out", str(out)])
    assert result.exit_code == 1
    assert "NOT reproduced" in result.stdout and "random_second_copy_loss" in result.stdout


class _Done:
    """What a finished recipe returns, as far as the CLI reads it."""

    interrupted = False
    step = 1
    wall_seconds = 0.0
