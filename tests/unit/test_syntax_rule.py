"""Syntactic heads follow Clark et al. 2019's released code: both directions, the possessive
marker, the offsets of the baseline, and words with no token of their own left out."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from headlab.heads import syntax
from headlab.heads.syntax import Sentence, both_predictions, score_arcs
from headlab.model import ModelConfig, Transformer


def clark_predict(attn: np.ndarray, mode: str) -> np.ndarray:
    """Clark et al.'s attn_head_predictor on one word-level map (W, W), no [CLS]/[SEP]:
    "transpose" reads columns; self is ignored; each word's argmax."""
    a = attn.T.copy() if mode == "transpose" else attn.copy()
    a[range(a.shape[0]), range(a.shape[0])] = 0
    return a.argmax(-1)


def clark_accuracy(maps: list[np.ndarray], sentences: list[Sentence], mode: str) -> dict:
    """Their evaluate_predictor: per relation the share of arcs whose prediction is the head,
    a possessive followed by "'s" judged by the prediction of its "'s"."""
    hit: dict[str, int] = {}
    count: dict[str, int] = {}
    for attn, s in zip(maps, sentences, strict=True):
        pred = clark_predict(attn, mode)
        for d, g, r in s.arcs():
            at = d + 1 if r == "poss" and d + 1 < len(s.words) and s.words[d + 1] == "'s" else d
            hit[r] = hit.get(r, 0) + int(pred[at] == g)
            count[r] = count.get(r, 0) + 1
    return {r: hit[r] / count[r] for r in count}


def random_sentences(seed: int) -> list[Sentence]:
    g = np.random.default_rng(seed)
    out = []
    for _ in range(12):
        W = int(g.integers(4, 9))
        words = [f"w{i}" for i in range(W)]
        if g.random() < 0.5:
            words[1] = "'s"
        heads = [int(g.choice([j for j in range(W) if j != i])) for i in range(W)]
        heads[int(g.integers(W))] = -1
        rels = [str(g.choice(["det", "poss", "dobj"])) if h >= 0 else "ROOT" for h in heads]
        out.append(Sentence(" ".join(words), words, [], heads, rels))
    return out


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_both_directions_equal_clarks_predictor(seed):
    """On dense random word attention (every word sees every other), each head's accuracy in
    each direction equals Clark et al.'s code ported literally."""
    sents = random_sentences(seed)
    gen = torch.Generator().manual_seed(seed)
    maps = [torch.rand(1, 3, len(s.words), len(s.words), generator=gen).softmax(-1) for s in sents]
    accuracy, _, _ = score_arcs([both_predictions(m) for m in maps], sents)
    for head in range(3):
        for direction, mode in enumerate(("normal", "transpose")):
            want = clark_accuracy([m[0, head].numpy() for m in maps], sents, mode)
            got = {r: float(a[direction, 0, head]) for r, a in accuracy.items()}
            assert got == pytest.approx(want, abs=1e-6), (head, mode)


def test_head_to_dependent_asks_who_attends_to_the_dependent_most():
    """'x y z', arc y → x. x looks at y most (0.6), but z looks at y more (0.9): under Clark's
    rule the word attending most to y is z, a miss; "x's most attended word is y" would hit."""
    s = Sentence("x y z", ["x", "y", "z"], [], [-1, 0, 0], ["ROOT", "dobj", "det"])
    A = torch.tensor([[0.0, 0.6, 0.4], [0.5, 0.0, 0.5], [0.1, 0.9, 0.0]])[None, None]
    accuracy, _, _ = score_arcs([both_predictions(A)], [s])
    assert float(accuracy["dobj"][1, 0, 0]) == 0.0
    assert int(syntax.predictions(A)[0, 0, 0]) == 1  # the other rule's prediction: a hit


def test_the_baseline_tries_offsets_minus_3_to_plus_2():
    """Three arcs at offset −4 and one at +1: −4 lies outside Clark et al.'s range(−3, 3), so
    the baseline is +1 on one arc of four."""
    words = [f"w{i}" for i in range(8)]
    heads = [-1, 2, -1, 0, 0, 1, 2, 3]  # w1 → w2 (+1); w5, w6, w7 → 4 back (−4)
    rels = ["ROOT", "det", "ROOT", "ROOT", "ROOT", "det", "det", "det"]
    s = Sentence("", words, [], heads, rels)
    _, counts, baselines = score_arcs([torch.zeros(2, 1, 1, 8, dtype=torch.long)], [s])
    assert counts == {"det": 4}
    assert baselines["det"] == (1, 0.25)


class WordTokenizer:
    """One token per listed piece of text, with character offsets: "cannot" stays whole."""

    def __init__(self, pieces: list[str]) -> None:
        self.pieces = pieces

    def encode(self, text: str) -> list[int]:
        return list(range(1, len(self.offsets(text)) + 1))

    def offsets(self, text: str) -> list[tuple[int, int]]:
        spans, start = [], 0
        for piece in self.pieces:
            a = text.index(piece, start)
            spans.append((a, a + len(piece)))
            start = a + len(piece)
        return spans


def test_words_without_a_token_of_their_own_are_left_out():
    """spaCy's "can" + "not" from one token "cannot": "not" gets no attention of its own, so
    its arc (neg) is not counted at all, rather than counted as a miss."""
    text = "I cannot go home."
    words = ["I", "can", "not", "go", "home", "."]
    spans = [(0, 1), (2, 5), (5, 8), (9, 11), (12, 16), (16, 17)]
    s = Sentence(
        text, words, spans, [3, 3, 3, -1, 3, 3], ["nsubj", "aux", "neg", "ROOT", "advmod", "punct"]
    )
    model = Transformer(ModelConfig(vocab_size=8, d_model=16, n_layers=1, n_heads=2, max_len=8))
    report = syntax.analyse_syntax(model, WordTokenizer(["I", "cannot", "go", "home", "."]), [s])
    assert report.counts == {"nsubj": 1, "aux": 1, "advmod": 1}
