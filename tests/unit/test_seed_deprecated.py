"""``seed`` where it changed nothing: analyse, label_heads, evidence, induction_circuit,
series.compare and the prompt-table functions took a seed that no score read (every score is a
function of the model's weights on the probe; a random probe is seeded where it is built). Each
now warns when given one, naming itself, and answers exactly what it answers without; the
library's and the command line's own calls pass none, so nothing they do warns."""

from __future__ import annotations

import json
import warnings
from typing import Any

import pytest
import torch
from typer.testing import CliRunner

from headlab import scaling, series
from headlab.cli import app
from headlab.heads import analyse
from headlab.heads.baselines import label_heads
from headlab.heads.circuit import induction_circuit
from headlab.heads.evidence import evidence

ONE = scaling.Ranks(0, 1, torch.device("cpu"))


def _without_times(d: Any) -> Any:
    """``d`` as JSON text, every "seconds" entry dropped (the one part that differs from run
    to run), tensors and arrays as lists."""

    def drop(x: Any) -> Any:
        if isinstance(x, dict):
            return {k: drop(v) for k, v in x.items() if k != "seconds"}
        return [drop(v) for v in x] if isinstance(x, list | tuple) else x

    return json.dumps(drop(d), sort_keys=True, default=lambda t: t.tolist())


def _calls(model: Any, probe: Any, tmp_path: Any) -> dict[str, Any]:
    """Each function that took a seed: name → call(seed or None) → a comparable answer."""
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("The cat sat on the mat.\nA dog ran in the park.\n", encoding="utf-8")
    members = [("a", model, None), ("b", model, None)]

    def kw(seed: int | None) -> dict[str, int]:
        return {} if seed is None else {"seed": seed}

    return {
        "analyse": lambda s: analyse(model, probe, keep=(), **kw(s)).to_dict(),
        "label_heads": lambda s: label_heads(model, probe, keep=(), **kw(s)).to_dict(),
        "evidence": lambda s: evidence(model, probe, **kw(s)).to_dict(),
        "induction_circuit": lambda s: induction_circuit(model, probe, **kw(s)).to_dict(),
        "compare": lambda s: series.compare(members, probe, **kw(s)).to_dict(),
        "score_prompts": lambda s: scaling.score_prompts(model, [(0, probe)], **kw(s)).sums,
        "prompt_table": lambda s: scaling.prompt_table(
            model, [(0, probe)], ONE, floors=False, **kw(s)
        ).to_dict(),
        "heads_over_prompts": lambda s: scaling.heads_over_prompts(
            "default", prompts, floors=False, **kw(s)
        )[0].to_dict(),
    }


def test_a_seed_warns_naming_the_function_and_changes_nothing(default, repeat, tmp_path):
    model, _ = default
    for name, call in _calls(model, repeat, tmp_path).items():
        with warnings.catch_warnings():
            warnings.simplefilter("error", DeprecationWarning)  # the library passes no seed
            plain = call(None)
        with pytest.warns(DeprecationWarning, match=rf"^{name}\(seed=…\) changes nothing") as w:
            seeded = call(7)
        assert w[0].filename == __file__, (name, w[0].filename)  # points at the caller
        if isinstance(plain, dict):
            assert _without_times(seeded) == _without_times(plain), name
        else:
            assert all(torch.equal(seeded[k], plain[k]) for k in plain), name


@pytest.mark.parametrize(
    "args",
    [
        ["heads"],
        ["heads", "--evidence"],
        ["heads", "--seed", "3", "--probe", "random-repeat"],
        ["circuit", "--seed", "2"],
    ],
)
def test_the_command_line_passes_no_seed_the_library_would_ignore(args, default, monkeypatch):
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        result = CliRunner().invoke(app, [*args, "--model", "default", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["model"] == "default"


def test_the_random_repeat_probe_still_follows_the_seed():
    """What --seed seeds: the random-repeat probe's tokens (one seed, one probe)."""
    runner = CliRunner()
    got = {}
    for seed in (3, 3, 4):
        result = runner.invoke(
            app,
            [
                "heads",
                "--model",
                "default",
                "--probe",
                "random-repeat",
                "--seed",
                str(seed),
                "--json",
                "--no-floors",
            ],
        )
        assert result.exit_code == 0, result.output
        got.setdefault(seed, []).append(json.loads(result.stdout)["ids"])
    assert got[3][0] == got[3][1] and got[3][0] != got[4][0]
