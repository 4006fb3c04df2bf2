"""SmolLM2 has no start token: a sink rests on the first word, and the rare-word score must not
mistake it for attention to a rare word (Voita et al. 2019's rare-word head; Gu et al. 2024)."""

from __future__ import annotations

import pytest
import torch

from conftest import require, shared_model
from headlab import smollm2, zoo
from headlab.heads import analyse
from headlab.measure import build_probe, word_zipf

pytest.importorskip("wordfreq")
FIRST = "Obsidian blades were traded across the ancient world."
MOVED = "Blades of obsidian were traded across the ancient world."
HANDFUL = 5


@pytest.fixture(scope="module")
def smol():
    missing = smollm2.missing_dependencies()
    require(not missing, f"smollm2 needs {missing}: pip install 'headlab[smollm2]'")
    require(zoo.is_fetched("smollm2"), "smollm2 is not fetched: headlab models --fetch smollm2")
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield shared_model("smollm2")
    torch.set_num_threads(before)


def analysed(smol, text):
    model, tokenizer = smol
    probe = build_probe("text", tokenizer, model.config.max_len, model.config.vocab_size, text)
    return probe, analyse(model, probe, content=False)


def loop_rare_word(patterns: torch.Tensor, probe) -> list[float]:
    """Each head's rare-word score by a plain loop: the rarest word's tokens off position 0 are
    the targets; the rows are the other words' tokens that see one of them (causal); the score
    is the share of rows whose most-attended key is a target."""
    words = probe.words[0]
    zipf = word_zipf(words)
    lowest = min(z for z in zipf if z == z)
    index = probe.word_index[0].tolist()
    rare_word = [w >= 0 and zipf[w] == lowest for w in index]
    targets = [j for j, r in enumerate(rare_word) if r and j > 0]
    rows = [
        i
        for i, w in enumerate(index)
        if w >= 0 and not rare_word[i] and any(j <= i for j in targets)
    ]
    out = []
    for A in patterns.flatten(0, 1):  # (n, n) per head, layer-major
        hits = [int(A[i].argmax()) in targets for i in rows]
        out.append(sum(hits) / len(rows) if rows else 0.0)
    return out


@pytest.mark.slow
def test_rarest_first_word_labels_only_a_handful_of_heads_rare_word(smol):
    probe, report = analysed(smol, FIRST)
    assert probe.words[0][0] == "Obsidian"
    labelled = [s for s in report.heads if s.label == "rare-word"]
    assert len(labelled) <= HANDFUL, [(s.layer, s.head) for s in labelled]
    assert not report.start_token
    assert report.to_dict()["sinks"]["rests_on"]["token"] == report.tokens[0]
    assert report.patterns is not None
    want = loop_rare_word(report.patterns, probe)
    got = [s.scores["rare_word"] for s in report.heads]
    assert got == pytest.approx(want, abs=1e-6)


@pytest.mark.slow
def test_rare_word_in_the_middle_is_scored_as_before(smol):
    """Off the first position nothing changes: every head's score equals the plain loop, and
    the heads that rest on the first word are sinks, not rare-word heads."""
    probe, report = analysed(smol, MOVED)
    assert report.patterns is not None
    want = loop_rare_word(report.patterns, probe)
    assert [s.scores["rare_word"] for s in report.heads] == pytest.approx(want, abs=1e-6)
    sinks = sum(s.label == "sink" for s in report.heads)
    assert sinks > len(report.heads) // 2
    assert sum(s.label == "rare-word" for s in report.heads) <= HANDFUL
