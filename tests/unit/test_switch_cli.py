"""`headlab heads --off L.H,...`: the two runs side by side, equal to headlab.heads.switch and,
for one head, to headlab.heads.effects.ablate_heads; every misuse is one sentence and exit 2."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from headlab.cli import app
from headlab.heads.effects import ablate_heads
from headlab.heads.evidence import loss_rows
from headlab.heads.switch import switch_off
from headlab.measure import build_probe

runner = CliRunner()
TEXT = "the cat sat on the mat. the cat sat on the mat."


def run(*args: str):
    return runner.invoke(app, ["heads", *args])


def test_json_is_the_library_and_ablate_heads_for_one_head(default, repeat):
    """--off 0.0 --json: the losses, induction scores and predictions are switch_off's; the
    loss rise on the repeat is ablate_heads' effect of head 0.0 over the same rows."""
    model, tokenizer = default
    result = run("--off", "0.0", "--json")
    assert result.exit_code == 0, result.output
    got = json.loads(result.stdout)
    want = switch_off(model, repeat, [(0, 0)]).to_dict(tokenizer.token_strings)
    assert got["tokens"] == repeat.labels and got["probe"] == "repeat"
    assert got["off"] == [[0, 0]] and got["mode"] == "mean"
    assert got["loss"] == want["loss"]
    for run_name in ("intact", "switched_off"):
        assert got[run_name]["predictions"] == want[run_name]["predictions"]
        assert got[run_name]["induction"] == want[run_name]["induction"]
        assert got[run_name]["losses"] == want[run_name]["losses"]
    a = ablate_heads(model, repeat, [(0, 0)])
    rows = loss_rows(repeat, causal=True)["induction"]
    assert got["loss"]["repeat"]["rise"] == pytest.approx(float(a.loss_effect(rows)[0]), abs=2e-4)
    flat = [x for row in got["switched_off"]["induction"] for x in row]
    assert flat == pytest.approx(a.induction[0].flatten().tolist(), abs=2e-4)


def test_the_table_says_the_losses_and_draws_the_shown_head_in_both_runs(default):
    """A set of two heads, zeroed, on a text: the loss lines carry the library's numbers, and
    --show 1.3 draws head 1.3 intact and with the heads off."""
    model, tokenizer = default
    c = model.config
    result = run("--off", "1.3,0.0", "--ablation", "zero", "--text", TEXT, "--show", "1.3")
    assert result.exit_code == 0, result.output
    probe = build_probe("text", tokenizer, c.max_len, c.vocab_size, TEXT)
    loss = switch_off(model, probe, [(0, 0), (1, 3)], "zero").losses()
    out = result.stdout
    assert "switched off: 0.0, 1.3 (zero: each one's output replaced by zeros)" in out
    r = loss["repeat"]
    assert f"loss on the repeat (11 predictions): {r['intact']:.2f} → {r['off']:.2f}" in out
    assert "head 1.3, intact" in out and "head 1.3, with 0.0, 1.3 off" in out


def test_several_sequences_are_counted_and_the_table_says_which_it_shows(default):
    model, tokenizer = default
    c = model.config
    result = run("--off", "0.0", "--probe", "random-repeat", "--seed", "3")
    assert result.exit_code == 0, result.output
    probe = build_probe("random-repeat", tokenizer, c.max_len, c.vocab_size, seed=3)
    loss = switch_off(model, probe, [(0, 0)]).losses()
    r = loss["repeat"]
    out = " ".join(result.stdout.split())
    said = f"loss on the repeat ({r['rows']} predictions): {r['intact']:.2f} → {r['off']:.2f}"
    assert said in out
    assert f"the table shows the first of the probe's {probe.tokens.shape[0]} sequences" in out


def test_a_text_that_repeats_nothing_says_so():
    result = run("--off", "0.0", "--text", "Birds fly south in winter.")
    assert result.exit_code == 0, result.output
    assert "the text repeats no token, so there is no repeat to predict" in result.stdout


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--off", "2.0"], "--off 2.0: this model has layers 0..1 and heads 0..7"),
        (["--off", "0.8"], "--off 0.8: this model has layers 0..1 and heads 0..7"),
        (["--off", "0.0", "--show", "0.9"], "--show 0.9: this model has layers 0..1"),
        (["--off", "x"], "--off takes LAYER.HEAD,... e.g. 0.0,1.3; got 'x'"),
        (["--off", "0.0.1"], "--off takes LAYER.HEAD"),
        (["--off", ""], "--off takes LAYER.HEAD"),
        (["--off", "0.0", "--ablation", "half"], "--ablation 'half': valid modes are mean, zero"),
        (["--off", "0.0", "--evidence"], "leave out --evidence"),
        (["--off", "0.0", "--syntax"], "leave out --syntax"),
        (["--off", "0.0", "--prompts", "p.txt"], "leave out --prompts"),
        (["--off", "0.0", "--html", "x.html"], "leave out --html"),
        (["--off", "0.0", "--probe", "needle"], "the needle probe is not one"),
        (["--off", "0.0", "--show", "1.avg"], "draws one head in both runs; give LAYER.HEAD"),
        (["--off", "0.0", "--probe", "repeat", "--text", "a b"], "probe 'repeat' takes no text"),
    ],
)
def test_misuse_is_one_sentence_and_exit_2(args, said):
    result = run(*args)
    assert result.exit_code == 2, result.output
    assert said in " ".join(result.stderr.split())
    assert "Traceback" not in result.output
    assert len(result.stderr.strip().splitlines()) == 1
