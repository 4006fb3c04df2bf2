"""Many prompts: prompt files, the mean of every head's scores over them (one process and two
torchrun ranks), bad input, devices, and the server's limits as settings."""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from headlab import scaling, zoo
from headlab.cli import app
from headlab.heads import analyse, label_head
from headlab.measure import text_probe

runner = CliRunner()
SRC = str(Path(__file__).resolve().parents[2] / "src")
PROMPTS = [
    "The cat sat on the mat. The cat sat.",
    "A dog ran, and a dog ran again.",
    "Rain fell on the roof all night.",
    "One two three, one two three.",
    "She read the letter twice.",
]


def run(*args: str):
    return runner.invoke(app, list(args))


def write_prompts(path: Path, lines: list[str], jsonl: bool = False) -> Path:
    rows = [json.dumps({"text": t, "id": i}) if jsonl else t for i, t in enumerate(lines)]
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")
    return path


# --- reading prompt files -------------------------------------------------------------------------


def test_prompts_one_per_line_or_jsonl_with_line_numbers(tmp_path):
    plain = tmp_path / "p.txt"
    plain.write_text("first\n\n  \nsecond, with a comma\r\n", encoding="utf-8")
    assert scaling.read_prompts(plain) == [(1, "first"), (4, "second, with a comma")]
    jsonl = write_prompts(tmp_path / "p.jsonl", ["a {brace}", "b"], jsonl=True)
    assert scaling.read_prompts(jsonl) == [(1, "a {brace}"), (2, "b")]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "does not exist"),
        (b"\n  \n", "has no prompts"),
        (b"fine\nbad \xff byte\n", "line 2 of .* is not UTF-8"),
        (
            b"short\n" + b"x" * 50 + b"\n",
            "line 2 of .* is 50 characters; a prompt may have at most 40",
        ),
        (b'{"text": "ok"}\n{"txt": "no"}\n', 'line 2 of .* is not a JSON object with a "text"'),
    ],
)
def test_bad_prompt_files_say_what_is_wrong(tmp_path, content, message):
    path = tmp_path / "prompts.txt"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(ValueError, match=message):
        scaling.read_prompts(path, max_chars=40)


def test_read_text_refuses_missing_empty_and_binary(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        scaling.read_text(tmp_path / "none.txt")
    (tmp_path / "empty.txt").write_text("  \n")
    with pytest.raises(ValueError, match="is empty"):
        scaling.read_text(tmp_path / "empty.txt")
    (tmp_path / "bin.txt").write_bytes(b"ab\xfe\xff")
    with pytest.raises(ValueError, match=r"not UTF-8 \(byte 2\)"):
        scaling.read_text(tmp_path / "bin.txt")


def _no_hang(seconds: int = 10):
    """An alarm that turns a blocked open (a FIFO with no writer) into a failure, not a hang."""
    import signal

    def ring(signum, frame):
        raise TimeoutError("the read blocked: a FIFO was opened")

    signal.signal(signal.SIGALRM, ring)
    signal.alarm(seconds)


def _special_inputs(tmp_path: Path) -> dict[str, Path]:
    """A FIFO, a folder and (as root) a device, made here: never the machine's own nodes."""
    made = {"a FIFO": tmp_path / "fifo", "a folder": tmp_path / "folder"}
    os.mkfifo(made["a FIFO"])
    made["a folder"].mkdir()
    if os.geteuid() == 0:
        made["a device"] = tmp_path / "null"
        os.mknod(made["a device"], 0o666 | stat.S_IFCHR, os.makedev(1, 3))  # as /dev/null
    return made


def test_prompt_and_text_files_must_be_regular_files(tmp_path):
    import signal

    _no_hang()
    try:
        for kind, path in _special_inputs(tmp_path).items():
            with pytest.raises(ValueError, match=f"is {kind}, not a regular file"):
                scaling.read_prompts(path)
            with pytest.raises(ValueError, match=f"is {kind}, not a regular file"):
                scaling.read_text(path)
    finally:
        signal.alarm(0)


def test_a_prompt_line_is_read_with_a_bound(tmp_path, monkeypatch):
    """A line with no end (64 MiB of zeros, sparse) is refused after max_chars * 4 bytes: the
    line is never held whole in memory."""
    import tracemalloc

    sparse = tmp_path / "sparse.txt"
    with open(sparse, "wb") as f:
        f.write(b"fine\n")
        f.truncate(2**26)
    tracemalloc.start()
    try:
        with pytest.raises(ValueError, match=r"line 2 of .* a prompt may have at most 40 char"):
            scaling.read_prompts(sparse, max_chars=40)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 2**22, f"{peak:,} bytes held to read a 40-character line"
    monkeypatch.setattr(scaling, "MAX_PROMPTS_BYTES", 100)
    many = write_prompts(tmp_path / "many.txt", ["a prompt"] * 20)
    with pytest.raises(ValueError, match="the most headlab reads is 100 bytes"):
        scaling.read_prompts(many)


def test_a_jsonl_line_nested_too_deeply_names_its_line(tmp_path):
    """A line 100,000 brackets deep gave a RecursionError traceback (issue 24)."""
    deep = tmp_path / "d.jsonl"
    deep.write_text('{"text": "fine"}\n' + "[" * 100_000 + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"line 2 of .* nested too deeply"):
        scaling.read_prompts(deep)
    deep.write_text('{"text": ' + "[" * 100_000 + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"line 1 of .* nested too deeply"):
        scaling.read_prompts(deep)


# --- the mean over prompts ------------------------------------------------------------------------


def plain_mean(prompts: list[str]) -> list[dict]:
    """The oracle: analyse each prompt on its own, average in a plain loop."""
    model, tok = zoo.load("default")
    reports = [analyse(model, text_probe(tok, t, model.config.max_len)) for t in prompts]
    rows = []
    for r in range(len(reports[0].heads)):
        heads = [rep.heads[r] for rep in reports]
        mean = {k: sum(h.scores[k] for h in heads) / len(heads) for k in heads[0].scores}
        offsets = [h.offset for h in heads]
        offset = max(sorted(set(offsets)), key=offsets.count)
        rows.append(
            {
                "layer": heads[0].layer,
                "head": heads[0].head,
                "scores": mean,
                "offset": offset,
                "label": label_head(mean, offset),
            }
        )
    return rows


def assert_same_table(got: list[dict], want: list[dict], tol: float) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert (g["layer"], g["head"], g["label"], g["offset"]) == (
            w["layer"],
            w["head"],
            w["label"],
            w["offset"],
        )
        assert g["scores"] == pytest.approx(w["scores"], abs=tol)


@pytest.mark.slow
def test_prompts_mean_equals_a_plain_loop_and_writes_json_and_csv(tmp_path):
    """--no-floors: the plain loop's means, labelled by thresholds alone."""
    prompts = write_prompts(tmp_path / "p.jsonl", PROMPTS, jsonl=True)
    result = run(
        "heads", "--prompts", str(prompts), "--out", str(tmp_path / "t.json"), "--no-floors"
    )
    assert result.exit_code == 0, result.output
    data = json.loads((tmp_path / "t.json").read_text())
    assert data["prompts"] == 5 and data["model"] == "default"
    assert_same_table(data["heads"], plain_mean(PROMPTS), tol=1e-9)
    result = run(
        "heads", "--prompts", str(prompts), "--out", str(tmp_path / "t.csv"), "--no-floors"
    )
    assert result.exit_code == 0, result.output
    lines = (tmp_path / "t.csv").read_text().splitlines()
    assert lines[0].startswith("layer,head,label,offset,previous")
    first = dict(zip(lines[0].split(","), lines[1].split(","), strict=True))
    assert float(first["previous"]) == data["heads"][0]["scores"]["previous"]
    assert len(lines) == 1 + 2 * 8 + 2  # 16 heads, 2 averaged heads
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


@pytest.mark.slow
def test_the_library_call_returns_the_table_and_reports_progress(tmp_path):
    """`headlab heads --prompts` is one call of scaling.heads_over_prompts: in one process it
    returns the plain loop's table and rank 0 of 1, and reports every prompt done: once
    without floors, four times (the model's, then 3 random models') with them."""
    prompts = write_prompts(tmp_path / "p.txt", PROMPTS[:3])
    seen: list[tuple[int, int, int]] = []
    table, ranks = scaling.heads_over_prompts(
        "default",
        prompts,
        progress=lambda done, total, r: seen.append((done, total, r.world)),
        floors=False,
    )
    assert (ranks.rank, ranks.world) == (0, 1)
    assert seen == [(0, 3, 1), (1, 3, 1), (2, 3, 1), (3, 3, 1)]
    assert table.prompts == 3
    assert_same_table(table.to_dict()["heads"], plain_mean(PROMPTS[:3]), tol=1e-9)
    seen.clear()
    gated, _ = scaling.heads_over_prompts(
        "default", prompts, progress=lambda done, total, r: seen.append((done, total))
    )
    assert seen == [(i, 12) for i in range(13)]
    assert [s.scores for s in gated.heads] == [s.scores for s in table.heads]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cli_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env.update(PYTHONPATH=SRC, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", GLOO_SOCKET_IFNAME="lo")
    env.update(extra)
    return env


@pytest.mark.slow
def test_two_torchrun_ranks_give_the_one_process_table(tmp_path):
    prompts = write_prompts(tmp_path / "p.txt", PROMPTS)
    one = tmp_path / "one.json"
    single = [sys.executable, "-m", "headlab.cli", "heads", "--prompts", str(prompts)]
    subprocess.run(
        [*single, "--out", str(one)], env=cli_env(), check=True, timeout=300, capture_output=True
    )
    two = tmp_path / "two.json"
    torchrun = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes",
        "1",
        "--nproc-per-node",
        "2",
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(free_port()),
        "-m",
        "headlab.cli",
        "heads",
        "--prompts",
        str(prompts),
        "--out",
        str(two),
        "--dist-timeout",
        "60",
    ]
    done = subprocess.run(torchrun, env=cli_env(), timeout=300, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    a, b = json.loads(one.read_text()), json.loads(two.read_text())
    assert a["prompts"] == b["prompts"] == 5 and a["tokens"] == b["tokens"]
    assert_same_table(b["heads"], a["heads"], tol=1e-6)
    assert_same_table(b["averaged"], a["averaged"], tol=1e-6)
    assert a["floors"] is not None  # the random models' passes were shared out too
    for x, y in zip(a["heads"] + a["averaged"], b["heads"] + b["averaged"], strict=True):
        assert (x["floor"], x["below_floor"]) == pytest.approx((y["floor"], y["below_floor"]))


@pytest.mark.slow
def test_ranks_that_cannot_reach_each_other_exit_2_and_write_nothing(tmp_path):
    prompts = write_prompts(tmp_path / "p.txt", PROMPTS[:2])
    out = tmp_path / "t.json"
    env = cli_env(
        RANK="1",
        LOCAL_RANK="1",
        WORLD_SIZE="2",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(free_port()),
    )  # nobody listens there
    cmd = [
        sys.executable,
        "-m",
        "headlab.cli",
        "heads",
        "--prompts",
        str(prompts),
        "--out",
        str(out),
        "--dist-timeout",
        "2",
    ]
    done = subprocess.run(cmd, env=env, timeout=120, capture_output=True, text=True)
    assert done.returncode == 2, done.stderr
    assert "rank 1 of 2 could not reach the other ranks at 127.0.0.1" in done.stderr
    assert "Traceback" not in done.stderr and not out.exists()


def test_each_rank_spreads_its_copy_over_its_own_gpus():
    budget = {0: 80, 1: 80, 2: 80, 3: 80, 4: 80, 5: 80, 6: 80, 7: 80, "cpu": 500, "disk": 9}
    cpu = torch.device("cpu")
    shares = [
        scaling.rank_max_memory(budget, scaling.Ranks(r, 2, cpu, None, r, 2), gpus=8)
        for r in range(2)
    ]
    assert shares[0] == {0: 80, 1: 80, 2: 80, 3: 80, "cpu": 500, "disk": 9}
    assert shares[1] == {4: 80, 5: 80, 6: 80, 7: 80, "cpu": 500, "disk": 9}
    one = scaling.rank_max_memory(budget, scaling.Ranks(0, 1, cpu), gpus=8)
    assert one == budget
    with pytest.raises(ValueError, match="3 ranks on this machine but 2 GPUs"):
        scaling.rank_max_memory(budget, scaling.Ranks(2, 3, cpu, None, 2, 3), gpus=2)


def test_a_failing_run_leaves_no_result_file(tmp_path):
    lines = [*PROMPTS[:2], "word " * 200]  # the last prompt is longer than the model takes
    prompts = write_prompts(tmp_path / "p.txt", lines)
    out = tmp_path / "t.json"
    result = run("heads", "--prompts", str(prompts), "--out", str(out))
    assert result.exit_code == 2
    said = " ".join(result.stderr.split())
    assert "prompt on line 3" in said and "at most 64" in said
    assert list(tmp_path.iterdir()) == [prompts]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--prompts", "missing.txt"], "prompts file missing.txt does not exist"),
        (["--prompts", "p.txt", "--out", "t.xlsx"], "must end in .json or .csv"),
        (["--prompts", "p.txt", "--out", "nodir/t.json"], "directory nodir does not exist"),
        (["--text", "hi", "--prompts", "p.txt"], "give one of --text, --text-file and --prompts"),
        (["--out", "t.json"], "--out writes the table of --prompts"),
        (["--text-file", "none.txt"], "text file none.txt does not exist"),
        (["--device", "tpu"], "unknown device 'tpu'; valid devices: cpu, cuda, mps"),
        (["--max-memory", "lots"], "--max-memory takes DEVICE=SIZE pairs"),
        (["--dtype", "int8"], "valid dtypes are float32, bfloat16, float16"),
        (["--max-memory", "cpu=1KB"], "too small for even one layer"),
    ],
)
def test_cli_bad_input_exits_2_with_one_sentence(tmp_path, monkeypatch, args, message):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HEADLAB_CACHE", str(tmp_path / "cache"))
    write_prompts(tmp_path / "p.txt", PROMPTS[:1])
    result = run("heads", *args)
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.stderr.split())
    assert "Traceback" not in result.output
    assert not list(tmp_path.glob("t.*"))


def _no_work(monkeypatch: pytest.MonkeyPatch) -> None:
    """Loading a model fails the test: a bad output must be refused before any work."""

    def load(*args, **kwargs):
        raise AssertionError("the analysis started before the output was checked")

    monkeypatch.setattr(zoo, "load", load)


@pytest.mark.parametrize(
    ("out", "message"),
    [
        ("/proc/headlab-x.json", "cannot write in /proc"),
        ("/sys/headlab-x.json", "cannot write in /sys"),
        ("a" * 300 + ".json", "the file name is 305 bytes long"),
        ("fifo.json", "not a regular file"),
        ("folder.json", "not a regular file"),
    ],
)
def test_cli_prompts_out_is_refused_before_any_work(tmp_path, monkeypatch, out, message):
    """`heads --prompts p.txt --out /proc/x.json` ran the analysis, then gave a traceback."""
    monkeypatch.chdir(tmp_path)
    os.mkfifo(tmp_path / "fifo.json")
    (tmp_path / "folder.json").mkdir()
    write_prompts(tmp_path / "p.txt", PROMPTS[:1])
    _no_work(monkeypatch)
    result = run("heads", "--prompts", "p.txt", "--out", out)
    assert result.exit_code == 2, result.output
    said = result.stderr.strip()
    assert message in said and "\n" not in said, said
    assert "Traceback" not in result.output
    assert stat.S_ISFIFO((tmp_path / "fifo.json").lstat().st_mode)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_an_unavailable_device_is_refused():
    result = run("heads", "--device", "cuda")
    assert result.exit_code == 2
    said = " ".join(result.stderr.split())
    assert "device 'cuda' is not available here" in said and "valid here: cpu" in said


def test_text_file_runs_and_shows_only_the_kept_head(tmp_path):
    text = tmp_path / "long.txt"
    text.write_text(" ".join(PROMPTS[:3]), encoding="utf-8")
    result = run("heads", "--text-file", str(text), "--show", "1.3", "--json", "--no-content")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert "content" not in data["heads"][0]["scores"]
    model, tok = zoo.load("default")
    report = analyse(model, text_probe(tok, text.read_text(), 64), content=False)
    assert [h["label"] for h in data["heads"]] == [h.label for h in report.heads]
    assert "layer 1 head 3" in result.stderr


# --- the server's limits as settings ------------------------------------------------------------


def test_server_limits_are_settings_with_safe_bounds(monkeypatch):
    from headlab.server import settings
    from headlab.server.routes.attention import token_limit

    monkeypatch.setenv("HEADLAB_MAX_TOKENS", "1024")
    assert settings.max_tokens() == 1024
    monkeypatch.setenv("HEADLAB_MAX_TEXT_CHARS", "50000")
    assert settings.max_body_bytes() == 4 * 50000 + 4096
    for bad in ("0", "many", "99999"):
        monkeypatch.setenv("HEADLAB_MAX_TOKENS", bad)
        with pytest.raises(ValueError, match=r"HEADLAB_MAX_TOKENS=.* give a whole number from 1"):
            settings.max_tokens()

    class Config:  # SmolLM2's shape: 30 layers × 9 heads; its context is 8,192
        max_len, n_layers, n_heads = 8192, 30, 9

    class Model:
        config = Config()

    # never more than 8 M weights in one answer: 30 · 9 · n² ≤ 8,000,000 → n ≤ 172
    assert token_limit(Model()) <= 172 and 30 * 9 * token_limit(Model()) ** 2 <= 8_000_000


def test_serve_refuses_a_bad_limit():
    result = run("serve", "--max-tokens", "0")
    assert result.exit_code == 2  # the option's own range refuses it before the server starts
    message = " ".join(result.stderr.split())
    assert "--max-tokens" in message and "greater than or equal" in message
    assert "Traceback" not in result.output
