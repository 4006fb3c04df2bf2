"""The command line under fuzzing (issue 18): hypothesis draws every command's options, valid,
at their edges and garbage, and runs them through typer's runner. Whatever the input: no
traceback reaches the user, the exit status is 0 or 2, and an exit 2 says what was wrong.

The work behind `train`, `experiment` and `serve` (minutes of training, a server that never
returns) is replaced by a recorder: what is checked there is that the input is validated before
any work, and that only valid input reaches the work. `shapes`, `heads`, `models`, `info` and the
top level run for real. Each run is tallied by command and exit status and printed (``-s``).

Issue 43: every command with its stdout on a full disk (/dev/full) and on a closed pipe, every
--model given a name longer than a file name may be and every kind of malformed model folder,
and every option that writes (a file or a folder) pointed at a path under a file, a folder or a
file, a read-only folder and the empty string: each ends in exit 1 or 2 and one line.

Issue 24: file inputs of every kind (a FIFO, a socket, a folder, a device made with mknod here,
/proc/self/mem, a sparse 64 MiB, binary, JSON nested 100,000 deep) reach every option that reads
a file, and every writer (--html, heads --out, the --out folders) is pointed at every kind of
target; each is refused with exit 2 in one line. A run that blocks (a FIFO opened) fails after a
minute instead of hanging CI. No test touches the machine's own device nodes.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import stat
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from conftest import IN_CI
from headlab.cli import app
from headlab.cli.common import SEED_MAX, SEEDS_MAX
from headlab.cli.support import out_dir_problem
from headlab.training.train import TrainResult

TALLY: Counter[tuple[str, int]] = Counter()
COMMANDS = (
    "info",
    "serve",
    "shapes",
    "models",
    "heads",
    "syntax",
    "circuit",
    "compare",
    "generate",
    "train",
    "experiment",
    "static",
)


def fuzz(runs: int) -> settings:
    """Hypothesis settings for ``runs`` CLI runs."""
    return settings(
        max_examples=runs,
        deadline=None,
        derandomize=IN_CI,  # CI replays the same runs; a local run explores new ones
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )


# what an exit-2 message looks like: our "error: ..." or click's usage error box; `headlab`
# alone shows its usage (click's exit 2 for no command)
SENTENCE = re.compile(r"error:|Error|Invalid value|No such (option|command)|Missing", re.I)
BARE_USAGE = "Usage: headlab [OPTIONS] COMMAND"


@contextmanager
def _in(directory: str) -> Iterator[None]:
    before = os.getcwd()
    os.chdir(directory)
    try:
        yield
    finally:
        os.chdir(before)


def run(*args: str):
    """Invoke the CLI and check the properties every run must have; a run blocked for a
    minute (a FIFO opened for reading) fails instead of hanging."""
    signal.signal(signal.SIGALRM, _blocked)
    signal.alarm(60)
    try:
        result = CliRunner().invoke(app, list(args))
    finally:
        signal.alarm(0)
    known = args and (args[0] in COMMANDS or args[0].startswith("-"))
    TALLY[(args[0] if known else "(none)" if not args else "(junk)", result.exit_code)] += 1
    shown = f"headlab {' '.join(map(repr, args))}\n{result.output}"
    assert "Traceback" not in result.output, shown
    assert result.exception is None or isinstance(result.exception, SystemExit), (
        f"{shown}\n{result.exception!r}"
    )
    assert result.exit_code in (0, 2), shown
    if result.exit_code == 2:
        assert SENTENCE.search(result.output) or (not args and BARE_USAGE in result.output), shown
    return result


def _blocked(signum: int, frame: object) -> None:
    raise TimeoutError("the command blocked for a minute: a FIFO or device was opened")


def refused(*args: str) -> str:
    """Run the CLI on input it must refuse: exit 2, one line on stderr, no traceback."""
    result = run(*args)
    said = result.stderr.strip()
    shown = f"headlab {' '.join(map(repr, args))}\n{result.output}"
    assert result.exit_code == 2 and "\n" not in said and said.startswith("error:"), shown
    return said


def _nodes(tmp: Path, suffix: str = "") -> dict[str, Path]:
    """What is not a regular file, made in ``tmp`` (never the machine's own nodes): a FIFO, a
    socket, a folder, and (as root) a character device like /dev/null; names end in ``suffix``."""
    tmp.mkdir(exist_ok=True)
    kinds = {"fifo": "fifo", "socket": "socket", "dir": "folder", "device": "null"}
    nodes = {kind: tmp / f"{name}{suffix}" for kind, name in kinds.items()}
    os.mkfifo(nodes["fifo"])
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(nodes["socket"]))
    nodes["dir"].mkdir()
    if os.geteuid() == 0:
        os.mknod(nodes["device"], 0o666 | stat.S_IFCHR, os.makedev(1, 3))  # as /dev/null
    else:
        del nodes["device"]  # mknod needs root
    return nodes


@pytest.fixture(scope="module", autouse=True)
def _report() -> Iterator[None]:
    yield
    print(f"\nCLI fuzz: {sum(TALLY.values())} runs; by command and exit status:")
    for (command, code), n in sorted(TALLY.items()):
        print(f"  {command}: exit {code} x{n}")


# --- value strategies ------------------------------------------------------------------------

# argv can hold any text but NUL
text = st.text(st.characters(blacklist_characters="\x00"), max_size=12)
edge_ints = st.sampled_from([0, 1, -1, 2, 63, 64, 65, 2**31, 2**63 - 1, 2**63, 2**64, 10**30])
int_like = st.one_of(
    st.integers(1, 4096).map(str),  # mostly fine values, so the commands get past parsing
    st.integers(1, 64).map(str),
    edge_ints.map(str),
    st.integers(-(2**70), 2**70).map(str),
    st.sampled_from(["1.5", "1e3", "nan", "", " 7", "0x10", "٣", "-0"]),
    text,
)


def _paths(tmp: Path) -> st.SearchStrategy[str]:
    """--out values: fine ones and each kind the issue found failing."""
    (tmp / "file").write_text("x")
    (tmp / "dir").mkdir(exist_ok=True)
    nodes = _nodes(tmp)
    (tmp / "holds").mkdir()
    os.mkfifo(tmp / "holds" / "results.json")
    return st.sampled_from(
        [
            str(tmp / "new" / "run"),
            str(tmp / "dir"),
            str(tmp / "file"),
            str(tmp / "file" / "below"),
            *map(str, nodes.values()),
            str(tmp / "holds"),  # a folder holding a FIFO where results.json goes
            "/proc/headlab-cannot-write-here",
            "/sys/headlab-cannot-write-here",
            str(tmp / ("n" * 300)),
            str(tmp / ("n" * 255)),
            "",
            " ",
        ]
    )


def options(pairs: dict[str, st.SearchStrategy], most: int = 99) -> st.SearchStrategy[list[str]]:
    """Up to ``most`` of the options, each once, in any order, sometimes with a stray token."""
    chosen = st.lists(st.sampled_from(sorted(pairs)), unique=True, max_size=min(most, len(pairs)))

    def build(names: list[str]) -> st.SearchStrategy[list[str]]:
        flat = [
            st.tuples(st.just(n), v) if v is not None else st.tuples(st.just(n))
            for n, v in ((n, pairs[n]) for n in names)
        ]
        stray = st.lists(st.sampled_from(["--nope", "extra", "-x", "--", "--seed"]), max_size=1)
        return st.tuples(st.tuples(*flat), stray).map(
            lambda t: [tok for group in t[0] for tok in group] + list(t[1])
        )

    return chosen.flatmap(build)


# --- commands that run for real ---------------------------------------------------------------


@fuzz(80)
@given(
    args=options(
        {
            "--d-model": int_like,
            "--heads": int_like,
            "--kv-heads": int_like,
            "--seq": int_like,
            "--batch": int_like,
            "--cache-len": int_like,
            "--dtype": st.one_of(st.sampled_from(["bf16", "float64", "int8", ""]), text),
            "--preset": st.one_of(st.sampled_from(["gpt2-small", "gpt3-175b", "nope"]), text),
            "--bias": None,
            "--no-bias": None,
            "--json": None,
        }
    )
)
def test_shapes_never_shows_a_traceback(args: list[str]) -> None:
    run("shapes", *args)


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, str]:
    """Paths for --text-file and --prompts: fine ones, and each kind of wrong one."""
    tmp = tmp_path_factory.mktemp("inputs")
    (tmp / "text.txt").write_text("The cat sat on the mat. The cat sat on the mat.\n")
    (tmp / "prompts.txt").write_text("the cat sat\nthe dog ran\n\n")
    (tmp / "prompts.jsonl").write_text('{"text": "a b"}\n{"nope": 1}\n[1]\n')
    (tmp / "binary.bin").write_bytes(bytes(range(256)))
    (tmp / "empty.txt").write_text("")
    (tmp / "deep.jsonl").write_text("[" * 100_000 + "\n")
    with open(tmp / "huge.txt", "wb") as f:
        f.truncate(2**26)  # sparse 64 MiB, no line end (a broken bound: no OOM)
    names = (
        "text.txt",
        "prompts.txt",
        "prompts.jsonl",
        "binary.bin",
        "empty.txt",
        "deep.jsonl",
        "huge.txt",
    )
    paths = {name: str(tmp / name) for name in names}
    special = {kind: str(path) for kind, path in _nodes(tmp / "nodes").items()}
    proc = {"proc": "/proc/self/mem"} if Path("/proc/self/mem").exists() else {}
    return {**paths, **special, **proc, "missing": str(tmp / "missing.txt"), "dir": str(tmp)}


def _targets(tmp: Path) -> list[str]:
    """Where a file writer (--html, heads --out) may be pointed: fine files, and every kind the
    issues found failing."""
    nodes = _nodes(tmp, ".json")
    (tmp / "old.json").write_text("{}")
    return [
        str(tmp / "fine.json"),
        str(tmp / "old.json"),
        *map(str, nodes.values()),
        str(tmp / "none" / "x.json"),
        "/proc/headlab-x.json",
        "/sys/headlab-x.json",
        str(tmp / ("n" * 300 + ".json")),
    ]


# --device-map, --max-memory and --offload-folder are left out: they convert the model into a
# cache on disk (main's own tests cover them); so is `models --fetch`, which downloads.
@fuzz(40)
@given(data=st.data())
def test_heads_never_shows_a_traceback(files, targets, data) -> None:
    paths = st.one_of(st.sampled_from(sorted(files.values())), text)
    writes = st.one_of(st.sampled_from(targets), paths)
    args = data.draw(
        options(
            {
                "--model": st.one_of(
                    st.just("default"), st.sampled_from(["nope", "../x", ""]), text
                ),
                "--text": st.one_of(text, st.just(" "), st.just("the cat sat. the cat sat." * 40)),
                "--text-file": paths,
                "--prompts": paths,
                "--out": st.one_of(st.sampled_from(["x.json", "x.csv", "x.txt"]), writes),
                "--html": writes,
                "--probe": st.one_of(st.sampled_from(["repeat", "random-repeat", "text"]), text),
                "--show": st.one_of(
                    st.sampled_from(["0.0", "1.avg", "9.9", "0.-2", "0.-1", "x"]), text
                ),
                "--seed": int_like,
                "--device": st.one_of(st.sampled_from(["cpu", "cuda", "mps", "cuda:7"]), text),
                "--dist-timeout": st.one_of(int_like, st.sampled_from(["nan", "inf", "0.5"])),
                "--no-content": None,
                "--no-floors": None,
                "--json": None,
                "--off": st.one_of(
                    st.sampled_from(["0.0", "1.3,0.0", "2.0", "0.-1", "x", "", "0.0,"]), text
                ),
                "--ablation": st.sampled_from(["mean", "zero", "half"]),
            },
            most=4,  # more, and nearly every run is two inputs at once
        ),
        "args",
    )
    with _in(files["dir"]):  # --out files land in a scratch folder
        run("heads", *args)


@pytest.fixture(scope="module")
def targets(tmp_path_factory) -> list[str]:
    return _targets(tmp_path_factory.mktemp("targets"))


# every kind of file input, each refused by every option that reads a file (issue 24)
BAD_INPUTS = ("fifo", "socket", "dir", "device", "proc", "huge.txt", "binary.bin", "missing")
READERS = (("heads", "--text-file"), ("heads", "--prompts"), ("syntax", "--text-file"))


def test_every_file_input_of_every_kind_is_refused_in_one_line(files) -> None:
    for kind in BAD_INPUTS:
        if kind not in files:  # no device without root, no /proc elsewhere
            continue
        for command, option in READERS:
            said = refused(command, option, files[kind])
            if kind in ("fifo", "socket", "dir", "device"):  # refused as such, never opened
                assert "not a regular file" in said, said
    refused("heads", "--prompts", files["deep.jsonl"])  # JSON-ish, too long for the model
    refused("heads", "--text-file", files["deep.jsonl"])  # 100,001 characters


def test_every_file_writer_refuses_every_bad_target_before_any_work(files, targets) -> None:
    """--html and heads --out, each pointed at each target that cannot take the file."""
    with _in(files["dir"]):
        for target in targets:
            if Path(target).name in ("fine.json", "old.json"):
                continue
            refused("heads", "--html", target, "--probe", "nope")  # the probe would fail later
            refused("heads", "--prompts", files["prompts.txt"], "--out", target, "--model", "nope")
            assert "unknown model" not in refused(
                "heads", "--prompts", files["prompts.txt"], "--out", target
            )


@fuzz(20)
@given(data=st.data())
def test_syntax_never_shows_a_traceback(files, data) -> None:
    path = data.draw(st.one_of(st.sampled_from(sorted(files.values())), text), "path")
    extra = data.draw(st.lists(st.sampled_from(["--json", "--model", "nope"]), max_size=2))
    run("syntax", "--text-file", path, *extra)


@fuzz(30)
@given(
    prompt=st.one_of(st.just("The cat sat on the"), st.just(" "), text),
    args=options(
        {
            "--model": st.one_of(st.just("default"), st.sampled_from(["nope", ""]), text),
            "--max-new-tokens": st.one_of(st.integers(1, 8).map(str), int_like),
            "--temperature": st.one_of(st.sampled_from(["0", "0.7", "-1", "nan", "inf"]), int_like),
            "--top-k": int_like,
            "--seed": int_like,
            "--heads": None,
            "--json": None,
        },
        most=4,
    ),
)
def test_generate_never_shows_a_traceback(prompt: str, args: list[str]) -> None:
    run("generate", "--prompt", prompt, *args)


@fuzz(30)
@given(
    args=st.one_of(
        st.lists(
            st.sampled_from(["--version", "--help", "info", "models", "nope", "-h"]),
            min_size=1,
            max_size=2,
        ),
        st.lists(text, max_size=2),
    )
)
def test_the_top_level_never_shows_a_traceback(args: list[str]) -> None:
    run(*args)


# --- commands whose work is replaced by a recorder -----------------------------------------------


@pytest.fixture
def recorded(monkeypatch: pytest.MonkeyPatch) -> list[tuple]:
    """Stand-ins for the work: each records what reached it, and does nothing else."""
    import torch

    import headlab.experiments
    from headlab.experiments import registry
    from headlab.server import cli as server_cli

    calls: list[tuple] = []

    def recipe(name):
        def train(out, *, quick, seed, resume, reporter) -> TrainResult:
            calls.append(("train", name, seed, str(out)))
            return TrainResult(step=0, interrupted=False)

        return train

    def experiment(e):
        def run_experiment(*, quick, seeds, seed, out, threads=1):  # no reporter/listener
            calls.append(("experiment", e.name, seed, seeds, threads, str(out)))
            return {"recorded": 1.0}

        return registry.Experiment(e.name, e.summary, run_experiment, e.options & {"threads"})

    recipes = {n: recipe(n) for n in registry.recipes()}
    experiments = {n: experiment(e) for n, e in registry.experiments().items()}
    monkeypatch.setattr(registry, "recipes", lambda: recipes)
    monkeypatch.setattr(registry, "experiments", lambda: experiments)
    monkeypatch.setattr(headlab.experiments, "ship_results", lambda name, r: Path("(not shipped)"))
    monkeypatch.setattr(server_cli, "serve_forever", lambda app, sock: calls.append(("serve",)))
    monkeypatch.setattr(torch, "set_num_threads", lambda n: None)  # serve's, not this process's
    return calls


def _check_reached(calls: list[tuple], before: int) -> None:
    """Only valid input may reach the work."""
    for call in calls[before:]:
        if call[0] in ("train", "experiment"):
            seed, out = call[2], call[-1]
            assert 0 <= seed <= SEED_MAX and out_dir_problem(out) is None, call
        if call[0] == "experiment":
            assert 1 <= call[3] <= SEEDS_MAX and call[2] + call[3] - 1 <= SEED_MAX, call
            assert 1 <= call[4] <= 256 and (call[4] == 1 or call[1] == "induction"), call


@fuzz(60)
@given(data=st.data())
def test_train_validates_before_any_work(recorded, tmp_path_factory, data) -> None:
    paths = _paths(tmp_path_factory.mktemp("out"))
    recipe = data.draw(st.one_of(st.sampled_from(["induction", "default"]), text), label="recipe")
    args = data.draw(
        options({"--out": paths, "--seed": int_like, "--quick": None, "--resume": None}), "args"
    )
    before = len(recorded)
    run("train", recipe, *args)
    _check_reached(recorded, before)


@fuzz(60)
@given(data=st.data())
def test_experiment_validates_before_any_work(recorded, tmp_path_factory, data) -> None:
    paths = _paths(tmp_path_factory.mktemp("out"))
    name = data.draw(st.one_of(st.sampled_from(["induction", "prune", "list"]), text), "name")
    args = data.draw(
        options(
            {
                "--out": paths,
                "--seed": int_like,
                "--seeds": int_like,
                "--quick": None,
                "--ship": None,
                "--threads": int_like,
            }
        ),
        "args",
    )
    before = len(recorded)
    run("experiment", name, *args)
    _check_reached(recorded, before)


hosts = st.one_of(
    st.sampled_from(
        [
            "127.0.0.1",
            "127.0.0.2",
            "::1",
            "[::1]",
            "[::1",
            "::1]",
            "0.0.0.0",
            "192.0.2.1",
            "localhost",
            "[127.0.0.1]",
            "999.1.1.1",
            "",
        ]
    ),
    # random text, but never a host name that would need a DNS lookup
    text.map(lambda t: t if not re.fullmatch(r"[A-Za-z0-9.\-]+", t) else "localhost"),
)


@fuzz(40)
@given(args=options({"--host": hosts, "--port": st.one_of(st.just("0"), int_like)}))
def test_serve_validates_before_serving(recorded, args: list[str]) -> None:
    run("serve", *args)


# --- issue 43: full disks, closed pipes, over-long names, malformed models, every output target -


def one_line_refusal(result: subprocess.CompletedProcess[str], args: list[str]) -> str:
    """A run that stopped as it should: exit 1 or 2, one line on stderr that starts with
    error:, no traceback."""
    said = result.stderr.strip()
    shown = f"headlab {' '.join(map(repr, args))} -> exit {result.returncode}\n{said}"
    assert "Traceback" not in said, shown
    assert result.returncode in (1, 2), shown
    assert said.startswith("error:") and "\n" not in said, shown
    return said


def headlab(args: list[str], stdout: object) -> subprocess.CompletedProcess[str]:
    """`headlab ARGS` in its own process (its stdout a device or a pipe no typer runner has),
    running the headlab this test imported."""
    import headlab

    command = [sys.executable, "-m", "headlab.cli", *args]
    env = {**os.environ, "PYTHONPATH": str(Path(headlab.__file__).parents[1])}
    return subprocess.run(
        command, stdout=stdout, stderr=subprocess.PIPE, text=True, timeout=600, env=env
    )


# a run of every command that writes to stdout; train, experiment runs, serve and static work
# for minutes or for ever, so their --help stands for them (written by the same app, the same way)
STDOUT_RUNS = (
    ["--version"],
    ["--help"],
    ["info"],
    ["models"],
    ["shapes"],
    ["shapes", "--json"],
    ["heads"],
    ["heads", "--json"],
    ["syntax"],
    ["circuit"],
    ["compare", "--model", "default", "--model", "default"],
    ["generate", "--prompt", "The cat sat on the", "--max-new-tokens", "2"],
    ["experiment", "list"],
    ["experiment", "--help"],
    ["train", "--help"],
    ["serve", "--help"],
    ["static", "--help"],
)


def test_the_full_disk_runs_cover_every_command() -> None:
    from typer.main import get_command

    commands = set(get_command(app).commands)  # type: ignore[attr-defined]
    assert commands == {run[0] for run in STDOUT_RUNS if not run[0].startswith("-")}
    assert commands == set(COMMANDS)


@pytest.mark.slow
@pytest.mark.parametrize("args", STDOUT_RUNS, ids=" ".join)
def test_every_command_on_a_full_disk_says_so_in_one_line(args: list[str]) -> None:
    """`headlab shapes --json > /dev/full` was a traceback (OSError: No space left on device)."""
    if not os.path.exists("/dev/full"):
        pytest.skip("this system has no /dev/full")
    with open("/dev/full", "w") as full:
        result = headlab(args, full)
    said = one_line_refusal(result, args)
    assert result.returncode == 1 and "could not write the output" in said, said
    assert "No space left on device" in said, said


@pytest.mark.parametrize("args", [["info"], ["shapes", "--json"], ["models"]], ids=" ".join)
def test_a_closed_pipe_ends_the_run_quietly(args: list[str]) -> None:
    """`headlab ... | head` when head has gone: exit 1, nothing said, no traceback."""
    read, write = os.pipe()
    os.close(read)
    try:
        result = headlab(args, write)
    finally:
        os.close(write)
    assert result.returncode == 1 and result.stderr == "", result.stderr


# every option that names a model, with the arguments that let the name reach the zoo
MODEL_OPTIONS = (
    ("heads", "--model", "{}"),
    ("syntax", "--model", "{}"),
    ("circuit", "--model", "{}"),
    ("generate", "--prompt", "the cat", "--model", "{}"),
    ("compare", "--model", "{}", "--model", "default"),
    ("compare", "--model", "default", "--model", "default", "--tokenizer", "{}"),
    ("experiment", "retrieval", "--quick", "--model", "{}"),
)


def test_a_model_name_longer_than_a_file_name_is_unknown_in_one_line(recorded) -> None:
    """A name of 256 characters or more was `OSError: File name too long` in five commands."""
    names = ["m" * 256, "m" * 300, "x/" * 200 + "m", "é" * 200, "m" * 5000]
    for name in names:
        for options in MODEL_OPTIONS:
            said = refused(*(name if a == "{}" else a for a in options))
            assert "model" in said and name not in said, said  # named, shortened
    assert not [call for call in recorded if call[0] == "experiment"]


@pytest.fixture(scope="module")
def broken_models(tmp_path_factory) -> dict[str, tuple[str, str]]:
    """Model folders each broken one way: name → (folder, what the refusal must name)."""
    from headlab import zoo

    root = tmp_path_factory.mktemp("models")
    good = json.loads((zoo.WEIGHTS_DIR / "config.json").read_text())
    weights = (zoo.WEIGHTS_DIR / "model.safetensors").read_bytes()
    hf = {"model_type": "gpt2", "n_embd": "x", "n_layer": 1, "n_head": 2, "vocab_size": 300}
    without_d_model = {k: v for k, v in good.items() if k != "d_model"}
    cases = {  # name: (config.json text or None, weights or None, what the message names)
        "bad-json": ('{"d_model": 128,', weights, "config.json is not valid JSON"),
        "wrong-type": (json.dumps({**good, "d_model": "x"}), weights, "d_model must be"),
        "no-field": (json.dumps(without_d_model), weights, "has no d_model"),
        "a-list": ("[1, 2, 3]", weights, "not an object"),
        "not-utf8": (b"\xff\xfe{}", weights, "not UTF-8"),
        "misfit": (json.dumps({**good, "d_model": 64}), weights, "does not fit"),
        "no-weights": (json.dumps(good), None, "model.safetensors is missing"),
        "truncated": (json.dumps(good), weights[:5000], "cannot be read as safetensors"),
        "empty-weights": (json.dumps(good), b"", "cannot be read as safetensors"),
        "no-config": (None, weights, "unknown model"),
        "hf-wrong-type": (json.dumps(hf), None, "n_embd"),
    }
    out = {}
    for name, (config, blob, said) in cases.items():
        folder = root / name
        folder.mkdir()
        shutil.copy(zoo.WEIGHTS_DIR / "tokenizer.json", folder / "tokenizer.json")
        if config is not None:
            raw = config if isinstance(config, bytes) else config.encode()
            (folder / "config.json").write_bytes(raw)
        if blob is not None:
            (folder / "model.safetensors").write_bytes(blob)
        out[name] = (str(folder), said)
    return out


def test_every_malformed_model_folder_is_refused_in_one_line(broken_models) -> None:
    """A config.json that is no JSON or has "d_model": "x" was a TypeError or OSError
    traceback in compare, circuit and syntax; the refusal names the file and the field."""
    for name, (folder, said) in broken_models.items():
        for options in MODEL_OPTIONS[:5]:
            message = refused(*(folder if a == "{}" else a for a in options))
            assert said in message, (name, options, message)
            if name != "no-config":
                assert folder in message, message  # which folder's file


@pytest.fixture
def writable_targets(tmp_path: Path) -> dict[str, str]:
    """Where a writer may be pointed that it cannot write: name → path."""
    (tmp_path / "file").write_text("keep")
    (tmp_path / "folder").mkdir()
    (tmp_path / "folder" / "mine.txt").write_text("keep")
    (tmp_path / "locked").mkdir()
    (tmp_path / "locked").chmod(0o555)
    targets = {
        "under a file": str(tmp_path / "file" / "x.json"),
        "a folder": str(tmp_path / "folder"),
        "a file": str(tmp_path / "file"),
        "read-only": str(tmp_path / "locked" / "x.json"),
        "empty": "",
    }
    if os.geteuid() == 0:  # root writes in a folder of mode 0555: it is no refusal to test
        del targets["read-only"]
    return targets


# each option that writes: (arguments before the target, after it, what kind of target it takes)
WRITERS = (
    (["heads", "--html"], ["--probe", "nope"], "file"),  # the probe would fail later
    (["heads", "--prompts", "{prompts}", "--out"], [], "file"),
    (["heads", "--offload-folder"], [], "folder"),
    (["compare", "--model", "nope", "--model", "nope", "--png"], [], "file"),
    (["train", "induction", "--quick", "--out"], [], "folder"),
    (["experiment", "induction", "--quick", "--out"], [], "folder"),
    (["static"], ["--web", "{web}"], "site"),
)


def test_every_writer_refuses_every_target_it_cannot_write(
    files, writable_targets, recorded, tmp_path, monkeypatch
) -> None:
    """Each option that writes, pointed at each target it cannot take: one line, exit 2, and
    the target as it was (a folder of the user's is no site to replace). The current folder is
    a scratch one: '' was once the current folder to `headlab static`, which emptied it."""
    from headlab.site import ORT_FILES

    dist = tmp_path / "web" / "node_modules" / "onnxruntime-web" / "dist"
    dist.mkdir(parents=True)
    for name in ORT_FILES:  # static finds its runtime, so only the target can stop it
        (dist / name).write_text("// stand-in\n")
    (tmp_path / "scratch").mkdir()
    monkeypatch.chdir(tmp_path / "scratch")
    fill = {"{prompts}": files["prompts.txt"], "{web}": str(tmp_path / "web")}
    for before, after, kind in WRITERS:
        for what, target in writable_targets.items():
            if kind == "file" and what == "a file":
                continue  # a file is replaced by a file writer: that is its job
            if kind == "folder" and what == "a folder":
                continue  # a folder takes a run's files beside the user's
            args = [fill.get(a, a) for a in before] + [target] + [fill.get(a, a) for a in after]
            refused(*args)
    folder = Path(writable_targets["a folder"])
    assert sorted(p.name for p in folder.iterdir()) == ["mine.txt"]
    assert Path(writable_targets["a file"]).read_text() == "keep"
    assert not [call for call in recorded if call[0] in ("train", "experiment")]
