"""Probes: repeated random tokens, delimiters and movable positions, length and emptiness errors."""

from __future__ import annotations

import pytest
import torch

from headlab.measure import (
    is_punctuation,
    make_probe,
    random_repeat_probe,
    repeated_random_tokens,
    text_probe,
)


class CharTokenizer:
    """A hand-built tokenizer: one id per character, with [CLS]=1 and [SEP]=2 around the text."""

    def encode(self, text: str) -> list[int]:
        return [1, *(ord(c) for c in text), 2]

    def token_strings(self, ids: list[int]) -> list[str]:
        return [{1: "[CLS]", 2: "[SEP]"}.get(i, chr(i)) for i in ids]


def test_repeated_random_tokens_repeat_exactly_and_are_seeded():
    cand = torch.arange(100, 200)

    def draw(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(seed)
        return repeated_random_tokens(cand, 25, 2, 3, g, [5], [6])

    t, source = draw(7)
    assert t.shape == (3, 52)
    assert (t[:, 0] == 5).all() and (t[:, -1] == 6).all()
    assert torch.equal(t[:, 1:26], t[:, 26:51])
    for row in t:
        run = row[1:26].tolist()
        assert len(set(run)) == 25 and all(100 <= i < 200 for i in run)
    assert torch.equal(t, draw(7)[0])
    assert not torch.equal(t, draw(8)[0])
    # source names the copied position: every token of the second copy equals its source token
    rows, cols = torch.nonzero(source >= 0, as_tuple=True)
    assert cols.tolist() == list(range(26, 51)) * 3
    assert torch.equal(t[rows, cols], t[rows, source[rows, cols]])
    assert (source[:, :26] == -1).all() and (source[:, 51:] == -1).all()


def test_punctuation():
    assert is_punctuation(".") and is_punctuation(" ,") and is_punctuation("?!")
    assert not is_punctuation("a.") and not is_punctuation("") and not is_punctuation("[SEP]")


def test_text_probe_marks_delimiters_but_not_position_zero():
    probe = text_probe(CharTokenizer(), "a,b.", max_len=10)
    assert probe.labels == ["[CLS]", "a", ",", "b", ".", "[SEP]"]
    # without a tokenizer backend, [CLS]/[SEP] are unknown specials: only punctuation counts
    assert probe.delimiters[0].tolist() == [False, False, True, False, True, False]
    assert probe.movable.all()


def test_text_probe_errors():
    with pytest.raises(ValueError, match="empty"):
        text_probe(CharTokenizer(), "   ", max_len=10)
    with pytest.raises(ValueError, match="at most 10"):
        text_probe(CharTokenizer(), "x" * 9, max_len=10)


def test_random_repeat_probe_without_tokenizer_fits_max_len():
    probe = random_repeat_probe(None, vocab_size=50, max_len=20, length=25, batch=2)
    assert probe.tokens.shape == (2, 20)  # 4 repeats of 5 tokens, as many as fit
    for r in range(1, 4):
        assert torch.equal(probe.tokens[:, :5], probe.tokens[:, 5 * r : 5 * r + 5])
    three = random_repeat_probe(None, vocab_size=50, max_len=7, batch=1)  # 3 copies of 2 fit
    assert three.tokens.shape == (1, 6) and torch.equal(three.tokens[:, :2], three.tokens[:, 4:])
    two = random_repeat_probe(None, vocab_size=50, max_len=5, batch=1)  # only 2 copies of 2
    assert two.tokens.shape == (1, 4) and torch.equal(two.tokens[:, :2], two.tokens[:, 2:])


def test_make_probe_accepts_one_sequence():
    probe = make_probe("text", torch.tensor([3, 4, 5]), None)
    assert probe.tokens.shape == (1, 3) and probe.labels == ["3", "4", "5"]


@pytest.mark.parametrize("name", ["default", "minilm", "smollm2"])
def test_the_repeat_probe_repeats_its_tokens_for_every_tokenizer(name):
    """The built-in "repeat" probe is an induction probe in each shipped model's own tokens:
    past its first token, the second copy of the sentence is the first one's tokens again at a
    fixed period, so every one of those positions has an induction target (the token after
    its earlier copy). A sentence edited into two differing halves, or a tokenizer that split
    the copies apart, fails here."""
    from conftest import require
    from headlab import zoo
    from headlab.heads.targets import build_targets
    from headlab.measure import build_probe

    known = {info.name: info for info in zoo.list_models()}
    require(known[name].available, f"{name} is not here: {known[name].reason}")
    model, tok = zoo.load(name)
    probe = build_probe("repeat", tok, 128, model.config.vocab_size)
    words = probe.movable[0].nonzero()[:, 0]  # the sentence's tokens, [CLS], [SEP], BOS left out
    ids = probe.tokens[0, words]
    # the period: the shortest shift at which the second copy repeats the first
    period = next(
        (m for m in range(2, len(ids)) if torch.equal(ids[-(m - 1) :], ids[-(m - 1) - m : -m])),
        0,
    )
    rows = build_targets(probe, causal=bool(model.config.causal)).induction_rows[0]
    second = words[len(ids) - period + 1 :]  # the second copy, past its first token
    assert period > 10 and rows[second].all(), (name, period)


def test_random_repeat_probe_prepends_a_bos_when_the_tokenizer_adds_none():
    """GPT-2's tokenizer adds no start token; Olsson et al. 2022 prepend one to the probe."""
    tokenizers = pytest.importorskip("tokenizers")
    from headlab.zoo import Tokenizer

    words = ["<|endoftext|>", "the", ".", *[f"w{i}" for i in range(100)]]
    backend = tokenizers.Tokenizer(
        tokenizers.models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="the")
    )
    backend.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    backend.add_special_tokens(["<|endoftext|>"])
    probe = random_repeat_probe(Tokenizer(backend), 103, max_len=64, length=5, batch=2)
    assert probe.tokens.shape == (2, 21)  # the start token, then 4 copies of 5
    assert (probe.tokens[:, 0] == 0).all() and probe.labels[0] == "<|endoftext|>"
    assert torch.equal(probe.tokens[:, 1:6], probe.tokens[:, 16:])
    assert all(label.startswith("w") for label in probe.labels[1:])
    assert not probe.movable[0, 0] and probe.movable[0, 1:].all()
