"""Head roles across checkpoints, on checkpoints headlab's own training loop writes.

The induction experiment's live recipe (a 2-layer attention-only model on repeated random ids) is
trained for 300 steps with a checkpoint every 100; its induction heads form between steps 200 and
300. The experiment measures each head's induction score on its own held-out probe at every
checkpoint; the series, loading the checkpoints back from disk and scoring them on a probe of its
own, must find the same heads turning into induction heads between the same two checkpoints.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from headlab import series
from headlab.experiments.induction import LIVE, held_out, make_model, metrics, train_config
from headlab.files import one_thread
from headlab.training.tasks import RepeatTask
from headlab.training.train import train

SRC = Path(__file__).parents[2] / "src"


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """The trained run folder and the experiment's own evaluation at each checkpoint."""
    out = tmp_path_factory.mktemp("induction-run")
    cfg = LIVE
    task = RepeatTask(cfg.vocab_size, cfg.seq_len, cfg.min_span, cfg.max_span)
    config = replace(
        train_config(cfg, 0),
        steps=300,
        checkpoint_every=100,
        keep_checkpoints=3,
        eval_every=100,
        log_every=100,
    )
    data = held_out(cfg, 0)
    with one_thread():
        result = train(
            make_model(cfg, 2, seed=0),
            config,
            lambda g: task.batch(cfg.batch_size, g),
            evaluate=lambda m, step: metrics(m, data)[0],
            out_dir=out,
        )
    evals = {r["step"]: r for r in result.records("eval")}
    return out, evals, data.ceiling


def induction_heads(record: dict, ceiling: float) -> set[tuple[int, int]]:
    """The experiment's rule: an induction score of at least half the ideal head's."""
    return {
        (l, h)
        for l, layer in enumerate(record["induction"])
        for h, v in enumerate(layer)
        if v >= 0.5 * ceiling
    }


@pytest.fixture(scope="module")
def compared(run):
    out, _, _ = run
    members = series.load_series([str(out)])
    return series.compare(members, series.series_probe(members, "random-repeat"), content=False)


def test_induction_heads_appear_between_two_checkpoints(run, compared):
    _, evals, ceiling = run
    assert [n.rsplit("@", 1)[1] for n in compared.names] == [
        "step-000100",
        "step-000200",
        "step-000300",
    ]
    before, after = induction_heads(evals[200], ceiling), induction_heads(evals[300], ceiling)
    assert not before and after  # the experiment's own measurement: formed in between
    labels = compared.labels()
    found = [
        {compared.heads[i] for i, label in enumerate(row) if label == "induction"} for row in labels
    ]
    assert found[0] == found[1] == set() and found[2] == after
    assert after <= set(compared.changed())
    scores = compared.scores("induction")  # (C, L, h)
    assert scores.shape == (3, 2, 4)
    for layer, head in after:
        assert scores[2, layer, head] >= 0.5 > scores[1, layer, head]


def test_the_cli_prints_the_series_as_json_and_draws_the_figure(run, compared, tmp_path):
    out, _, _ = run
    steps = [str(out / "checkpoints" / s) for s in ("step-000100", "step-000300")]
    png = tmp_path / "series.png"
    env = os.environ | {"PYTHONPATH": str(SRC)}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "headlab.cli",
            "compare",
            "--model",
            steps[0],
            "--model",
            steps[1],
            "--json",
            "--png",
            str(png),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    body = json.loads(done.stdout)
    assert body["checkpoints"] == steps and body["probe"] == "random-repeat"
    mine = {(d["layer"], d["head"]): d["labels"] for d in body["heads"]}
    library = compared.labels()
    for i, head in enumerate(compared.heads):
        assert mine[head] == [library[0][i], library[2][i]]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    from matplotlib.image import imread

    height, width = imread(png).shape[:2]
    assert width > 300 and height > 200


def test_the_table_marks_the_heads_that_change(run):
    from typer.testing import CliRunner

    from headlab.cli import app

    out, evals, ceiling = run
    result = CliRunner().invoke(app, ["compare", "--model", str(out)])
    assert result.exit_code == 0, result.output
    rows = {line.split()[0]: line for line in result.stdout.splitlines() if line.strip()}
    for layer, head in induction_heads(evals[300], ceiling):
        assert rows[f"{layer}.{head}"].rstrip().endswith("yes")
        assert "induction" in rows[f"{layer}.{head}"]


def test_a_notebook_view_draws_the_table_and_the_figure(compared):
    from headlab.show import show

    page = show(compared)._repr_html_()
    assert page.count("<tr>") == 1 + 8 and "data:image/png;base64," in page
    assert page.count(">changed<") == len(compared.changed())


def test_different_architectures_and_short_series_are_refused(run, tmp_path):
    from typer.testing import CliRunner

    from headlab.cli import app

    out, _, _ = run
    step = str(out / "checkpoints" / "step-000100")
    other = make_model(replace(LIVE, n_heads=2), 2, seed=0).save(tmp_path / "two-heads")
    members = series.load_series([step, str(other)])
    with pytest.raises(ValueError, match=r"has n_heads=2 but .* has n_heads=4"):
        series.compare(members, series.series_probe(members, "random-repeat"))
    with pytest.raises(ValueError, match="at least 2 checkpoints"):
        series.compare(members[:1], series.series_probe(members, "random-repeat"))
    result = CliRunner().invoke(app, ["compare", "--model", step, "--model", str(other)])
    assert result.exit_code == 2 and "one architecture" in result.stderr
    assert "Traceback" not in result.output
    result = CliRunner().invoke(
        app, ["compare", "--model", step, "--model", step, "--probe", "repeat"]
    )
    assert result.exit_code == 2 and "has no tokenizer" in result.stderr
