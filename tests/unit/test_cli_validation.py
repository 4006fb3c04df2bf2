"""Issue 18's command-line failures, one by one: a bad --out (item 2) and out-of-range seeds
(item 3) are refused before any work with exit 2 and a sentence; the whole seed range works in
the library; the FLOP convention is stated where people read FLOPs (item 9)."""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from headlab.cli import app
from headlab.cli.common import SEED_MAX
from headlab.training.train import TrainResult

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def work(monkeypatch: pytest.MonkeyPatch) -> list[tuple]:
    """The training and experiment work, replaced by a recorder (see test_cli_fuzz)."""
    from headlab.experiments import registry

    calls: list[tuple] = []

    def recipe(out, *, quick, seed, resume, reporter):
        calls.append(("train", seed))
        return TrainResult(0, False)

    def experiment(*, quick, seeds, seed, out):
        calls.append(("experiment", seed, seeds))
        return {}

    monkeypatch.setattr(registry, "recipes", lambda: {"induction": recipe})
    fake = registry.Experiment("induction", "a recorder", experiment)
    monkeypatch.setattr(registry, "experiments", lambda: {"induction": fake})
    return calls


def _out_cases(tmp: Path) -> dict[str, tuple[str, str]]:
    """--out value → a phrase its refusal must contain."""
    (tmp / "file").write_text("keep me")
    cases = {
        "existing file": (str(tmp / "file"), "is a file, not a directory"),
        "parent is a file": (str(tmp / "file" / "run"), "is a file, so no directory"),
        "unwritable folder": ("/proc/headlab-test/run", "cannot write in /proc"),
        "300-character name": (str(tmp / ("r" * 300)), "300 bytes long"),
        "empty": ("", "is not a path"),
    }
    if os.geteuid() == 0:  # a null device made here: a test never touches the machine's own
        os.mknod(tmp / "null", 0o666 | stat.S_IFCHR, os.makedev(1, 3))
        cases["null device"] = (str(tmp / "null"), "is a device, not a directory")
    if os.geteuid() != 0:  # root writes anywhere: /proc above covers it then
        (tmp / "locked").mkdir()
        (tmp / "locked").chmod(0o555)
        cases["read-only folder"] = (str(tmp / "locked" / "run"), "cannot write in")
    return cases


@pytest.mark.parametrize(
    "command", [["train", "induction", "--quick"], ["experiment", "induction", "--quick"]]
)
def test_a_bad_out_is_refused_before_any_work(work, tmp_path, command) -> None:
    """Issue 18, item 2: each of these made `train` fail in mkdir with a traceback, and
    `experiment` train for 22 s and then lose its results."""
    for kind, (out, phrase) in _out_cases(tmp_path).items():
        before = sorted(p.name for p in tmp_path.iterdir())
        result = CliRunner().invoke(app, [*command, "--out", out])
        text = " ".join(result.output.split())
        assert result.exit_code == 2, (kind, result.output)
        assert phrase in text and "Traceback" not in text, (kind, text)
        assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing half-written
    assert work == []  # no run ever started
    assert (tmp_path / "file").read_text() == "keep me"


def _special_outs(tmp: Path) -> dict[str, tuple[str, str]]:
    """Issue 24: --out folders that are, or hold, what no write may replace (made here)."""
    import socket
    import stat

    os.mkfifo(tmp / "fifo")
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(tmp / "sock"))
    (tmp / "run").mkdir()
    os.mkfifo(tmp / "run" / "results.json")
    cases = {
        "a FIFO": (str(tmp / "fifo"), "is a FIFO, not a directory"),
        "a socket": (str(tmp / "sock"), "is a socket, not a directory"),
        "a folder holding a FIFO": (str(tmp / "run"), "results.json is a FIFO"),
        "/sys": ("/sys/headlab-test", "cannot write in /sys"),
    }
    if os.geteuid() == 0:
        os.mknod(tmp / "null", 0o666 | stat.S_IFCHR, os.makedev(1, 3))
        cases["a device made here"] = (str(tmp / "null"), "is a device, not a directory")
    return cases


@pytest.mark.parametrize(
    "command", [["train", "induction", "--quick"], ["experiment", "induction", "--quick"]]
)
def test_an_out_that_is_or_holds_a_device_or_fifo_is_refused_before_any_work(
    work, tmp_path, command
) -> None:
    import stat

    for kind, (out, phrase) in _special_outs(tmp_path).items():
        result = CliRunner().invoke(app, [*command, "--out", out])
        said = result.output.strip()
        assert result.exit_code == 2, (kind, result.output)
        assert phrase in " ".join(said.split()) and "Traceback" not in said, (kind, said)
    assert work == []
    assert stat.S_ISFIFO((tmp_path / "run" / "results.json").lstat().st_mode)


def test_a_good_out_reaches_the_work(work, tmp_path) -> None:
    for out in (tmp_path / "new" / "deeper", tmp_path):
        assert CliRunner().invoke(app, ["train", "induction", "--out", str(out)]).exit_code == 0
    assert work == [("train", 0), ("train", 0)]


@pytest.mark.parametrize(
    "args",
    [
        ["train", "induction", "--seed", str(2**64)],
        ["train", "default", "--seed", str(2**63)],
        ["experiment", "induction", "--seed", str(2**64)],
        ["experiment", "induction", "--seeds", str(10**30)],
        ["experiment", "induction", "--seeds", "0"],
        ["experiment", "induction", "--seed", str(SEED_MAX), "--seeds", "2"],
        ["heads", "--seed", "18446744073709551616"],
        ["heads", "--seed", "-1"],
        ["shapes", "--batch", str(2**64)],
        ["shapes", "--seq", "0"],
        ["serve", "--port", "65536"],
    ],
)
def test_an_integer_out_of_range_is_refused_with_its_range(work, tmp_path, args) -> None:
    """Issue 18, item 3: seeds of 2**64 gave `Overflow when unpacking long long` tracebacks,
    and `--seeds 10**30` started. Every integer option now has a range, checked first."""
    result = CliRunner().invoke(
        app, [*args, "--out", str(tmp_path)] if args[0] in ("train", "experiment") else args
    )
    text = " ".join(result.output.split())
    assert result.exit_code == 2 and "Traceback" not in text
    option = next(a for a in args if a.startswith("--"))
    assert option in text and re.search(r"less than|greater than|past 2\*\*63-1", text), text
    assert "Overflow" not in text
    assert work == []


def test_the_largest_seed_is_accepted_and_works_in_the_library(work, tmp_path) -> None:
    """2**63-1 passes the CLI, and the seeds derived from it (seed + 1, seed + 1,000,003,
    seed · 1000 + r) still seed torch."""
    from test_train import _config, batches, make_model

    from headlab import measure, zoo
    from headlab.ablation import random_order
    from headlab.training.train import TrainConfig, train

    ok = CliRunner().invoke(
        app, ["train", "induction", "--seed", str(SEED_MAX), "--out", str(tmp_path)]
    )
    assert ok.exit_code == 0 and work == [("train", SEED_MAX)]
    result = train(make_model(0), _config(steps=3, seed=SEED_MAX), batches)
    assert result.step == 3
    torch.Generator().manual_seed(SEED_MAX + 1_000_003)
    assert len(random_order(2, 4, (SEED_MAX * 1000 + 1) % 2**64)) == 8
    with pytest.raises(ValueError, match=r"seed must be in 0\.\.2\*\*64-1"):
        TrainConfig(seed=2**64)
    _, tokenizer = zoo.load("default")
    probe = measure.random_repeat_probe(tokenizer, 1024, 64, seed=SEED_MAX)
    assert probe.tokens.shape[-1] <= 64


# --- item 9: the FLOP convention, where FLOPs are shown -------------------------------------------


def test_the_flop_convention_is_stated_everywhere_flops_are_shown() -> None:
    runner = CliRunner()
    out = " ".join(runner.invoke(app, ["shapes"]).output.split())
    assert "a multiply-add counts 2; bias, scale and softmax are not counted" in out
    helptext = " ".join(runner.invoke(app, ["shapes", "--help"]).output.split())
    assert "multiply-add counts 2" in helptext and "softmax are not counted" in helptext
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert "a multiply-add as 2" in readme and "softmax are not counted" in readme
    page = (ROOT / "src/headlab/server/static/index.html").read_text()
    assert 'id="flop-convention"' in " ".join(page.split())
    assert "a multiply-add as 2" in " ".join(page.split())
    heads_doc = " ".join((ROOT / "docs/heads.md").read_text().split())
    for option in ('error_measure="mul"', "exclude_bos=False", "exclude_current_token=False"):
        assert option in heads_doc


def test_the_stated_convention_is_what_torch_counts() -> None:
    """The sentence is true: the report's FLOPs equal torch.utils.flop_counter's (which counts a
    multiply-add as 2 and no element-wise op) for a layer with biases."""
    from torch.utils.flop_counter import FlopCounterMode

    from headlab.attention import MultiHeadAttention
    from headlab.shapes import trace_shapes

    layer, x = MultiHeadAttention(64, 4, bias=True), torch.randn(2, 5, 64)
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        layer(x, impl="explicit")
    assert trace_shapes(64, 4, 5, 2, bias=True).flops["total"] == counter.get_total_flops()
