"""Synthetic training data: each task is a seeded batch generator for ``headlab.training.train``.

Shape legend
    B   batch
    n   tokens fed to the model (the context length)

Every generator takes a ``torch.Generator`` and draws all of its randomness from it, so a batch
stream is fixed by the seed and a run resumed from a checkpoint (which saves the generator's
state) sees exactly the batches an uninterrupted run would have seen.

Sections: repeated random sequences (issue 5); agreement grammar (issue 6); corpus text (issue 7).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from headlab.measure import next_token_pair

# ---------------------------------------------------------------------------------------------
# Repeated random sequences (Olsson et al. 2022, "In-context Learning and Induction Heads")
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RepeatTask:
    """Uniform random tokens in which one segment is copied later in the same sequence.

    The copy's length and both of its positions are drawn afresh for every sequence, so the
    distance between a token and its earlier copy is not fixed: a head that attends to a fixed
    relative position cannot predict the copy, only an induction circuit can (a fixed repeat
    period is the known shortcut in small reproductions).
    """

    vocab_size: int = 64  # token ids are drawn uniformly from [0, vocab_size)
    seq_len: int = 32  # n, the tokens the model sees (each sequence holds n + 1 for the targets)
    min_span: int = 4  # shortest repeated segment
    max_span: int = 16  # longest repeated segment (at most (n + 1) // 2)

    def __post_init__(self) -> None:
        problems = []
        if self.vocab_size < 2:
            problems.append(f"vocab_size must be at least 2, got {self.vocab_size}")
        if self.seq_len < 3:
            problems.append(f"seq_len must be at least 3, got {self.seq_len}")
        if not 1 <= self.min_span <= self.max_span <= (self.seq_len + 1) // 2:
            problems.append(
                f"need 1 <= min_span <= max_span <= (seq_len + 1) // 2 = {(self.seq_len + 1) // 2}"
                f", got min_span={self.min_span}, max_span={self.max_span}"
            )
        if problems:
            raise ValueError("; ".join(problems))

    def sample(self, batch: int, generator: torch.Generator) -> tuple[Tensor, Tensor, Tensor]:
        """Draw ``batch`` sequences of n + 1 tokens.

        Returns ``(tokens, source, is_copy)``, each (B, n + 1): the token ids; for each position
        the position it was copied from (itself where it is not a copy); and whether it is a copy.
        """
        total = self.seq_len + 1
        span = torch.randint(self.min_span, self.max_span + 1, (batch,), generator=generator)
        # first copy starts at a, second at b >= a + span; both fit inside the sequence
        a = (torch.rand(batch, generator=generator) * (total - 2 * span + 1)).long()  # (B,)
        room = total - (a + 2 * span) + 1  # choices for the gap between the copies
        b = a + span + (torch.rand(batch, generator=generator) * room).long()  # (B,)
        tokens = torch.randint(0, self.vocab_size, (batch, total), generator=generator)
        pos = torch.arange(total).expand(batch, total)  # (B, n + 1)
        is_copy = (pos >= b[:, None]) & (pos < (b + span)[:, None])  # (B, n + 1)
        source = torch.where(is_copy, pos - (b - a)[:, None], pos)  # (B, n + 1)
        return tokens.gather(1, source), source, is_copy

    def batch(self, batch: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        """A next-token batch ``(inputs, targets)``, each (B, n); targets are inputs shifted."""
        tokens, _, _ = self.sample(batch, generator)
        return next_token_pair(tokens)


# ---------------------------------------------------------------------------------------------
# Agreement with attractors (issue 6): one verb needs a distant noun and the previous token
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AgreementTask:
    """A toy grammar in which the verb needs two things at once: a distant noun and its neighbour.

    A sentence reads::

        BOS [filler …] the NOUN [near the NOUN' | that the NOUN' VERB'] ADVERB <v> VERB .
        BOS [filler …] near the NOUN' , the NOUN ADVERB <v> VERB .

    The main VERB is predicted at the placeholder ``<v>``; its form is the pair (stem, number):
    the number agrees with the subject NOUN, several tokens back, and the stem is set by the
    ADVERB, the token right before ``<v>``. An optional prepositional phrase or relative clause
    after the subject, or a prepositional phrase placed before it, holds an *attractor* NOUN' of
    the other number (in the relative clause its own verb VERB' agrees with it), the classic trap
    of agreement studies. Because the attractor may come first, "the earliest noun" does not find
    the subject; only the structure around a noun does. A random-length filler before the
    sentence moves every position, so no fixed offset finds the subject either.

    Vocabulary: 0 PAD, 1 BOS, 2 "the", 3 "near", 4 "that", 5 "<v>", 6 ".", 7 filler, 8 ",", then
    singular nouns, plural nouns, adverbs, main verbs (stem-major: stem·2 + number), clause verbs.
    """

    n_nouns: int = 8  # nouns per number (singular ids, then the same count of plural ids)
    n_stems: int = 4  # adverbs, each fixing one verb stem
    max_filler: int = 4  # filler tokens before the subject: 0 … max_filler
    p_attractor: float = 0.5  # chance a sentence holds a phrase or clause with an attractor

    def __post_init__(self) -> None:
        problems = []
        for name in ("n_nouns", "n_stems"):
            if getattr(self, name) < 1:
                problems.append(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.max_filler < 0:
            problems.append(f"max_filler must be 0 or more, got {self.max_filler}")
        if not 0.0 <= self.p_attractor <= 1.0:
            problems.append(f"p_attractor must be in [0, 1], got {self.p_attractor}")
        if problems:
            raise ValueError("; ".join(problems))

    # token ids ---------------------------------------------------------------------------
    PAD, BOS, THE, NEAR, THAT, SLOT, STOP, FILL, COMMA = range(9)
    KINDS = ("none", "phrase", "clause", "preposed")  # where the attractor sits, if anywhere

    def noun(self, index: Tensor, plural: Tensor) -> Tensor:
        return 9 + plural.long() * self.n_nouns + index

    def adverb(self, stem: Tensor) -> Tensor:
        return 9 + 2 * self.n_nouns + stem

    def verb(self, stem: Tensor, plural: Tensor) -> Tensor:
        return 9 + 2 * self.n_nouns + self.n_stems + 2 * stem + plural.long()

    def clause_verb(self, plural: Tensor) -> Tensor:
        return 9 + 2 * self.n_nouns + 3 * self.n_stems + plural.long()

    @property
    def vocab_size(self) -> int:
        return 9 + 2 * self.n_nouns + 3 * self.n_stems + 2

    def token_names(self) -> list[str]:
        """A display name for every id: nouns "N3" / "N3:pl", "ADV1", verbs "V1" / "V1:pl"."""
        names = ["PAD", "BOS", "the", "near", "that", "<v>", ".", "…", ","]
        names += [f"N{i}" for i in range(self.n_nouns)] + [f"N{i}:pl" for i in range(self.n_nouns)]
        names += [f"ADV{i}" for i in range(self.n_stems)]
        names += [f"V{i}{s}" for i in range(self.n_stems) for s in ("", ":pl")]
        return [*names, "rc", "rc:pl"]

    @property
    def seq_len(self) -> int:
        """n: the longest sentence (BOS, filler, clause, subject, adverb, slot, verb, stop) − 1."""
        return 1 + self.max_filler + 4 + 2 + 4 - 1

    def held_out(self, noun: Tensor, plural: Tensor, stem: Tensor) -> Tensor:
        """Bool: whether a (subject noun, number, stem) triple is kept out of training (1 in 5).

        Every sentence with such a triple is a test sentence, whatever its filler or clause, so a
        test sentence is never seen in training (its verb form is, with other subjects).
        """
        return ((noun * 2 + plural.long()) * self.n_stems + stem) % 5 == 0

    def sample(
        self, batch: int, generator: torch.Generator, split: str = "train"
    ) -> dict[str, Tensor]:
        """Draw ``batch`` sentences, right-padded with PAD to ``seq_len + 1`` tokens.

        ``split`` is "train" (sentences outside :meth:`held_out`), "test" (only held-out ones)
        or "all".

        Returns a dict of (B,)-shaped fields and ``tokens`` (B, n + 1): ``slot`` (the position of
        ``<v>``), ``subject`` (the subject noun's position), ``plural`` (subject number),
        ``stem``, ``kind`` (index into ``KINDS``), ``attractor`` (bool, kind > 0), ``target``
        (the verb id).
        """
        if split not in ("train", "test", "all"):
            raise ValueError(f"split must be 'train', 'test' or 'all', got {split!r}")
        g = generator
        filler = torch.randint(0, self.max_filler + 1, (batch,), generator=g)
        plural = torch.rand(batch, generator=g) < 0.5
        attractor = torch.rand(batch, generator=g) < self.p_attractor
        kind = torch.where(attractor, torch.randint(1, 4, (batch,), generator=g), 0)
        stem = torch.randint(0, self.n_stems, (batch,), generator=g)
        subj_noun = torch.randint(0, self.n_nouns, (batch,), generator=g)
        while split != "all":  # redraw the nouns of rows on the wrong side of the split
            wrong = self.held_out(subj_noun, plural, stem) != (split == "test")
            if not wrong.any():
                break
            subj_noun[wrong] = torch.randint(0, self.n_nouns, (int(wrong.sum()),), generator=g)
        attr_noun = torch.randint(0, self.n_nouns, (batch,), generator=g)
        rows = [
            self._sentence(
                int(filler[b]),
                int(kind[b]),
                self.noun(subj_noun[b], plural[b]),
                self.noun(attr_noun[b], ~plural[b]),
                self.clause_verb(~plural[b]),
                self.adverb(stem[b]),
                self.verb(stem[b], plural[b]),
            )
            for b in range(batch)
        ]
        tokens = torch.full((batch, self.seq_len + 1), self.PAD, dtype=torch.long)
        for b, row in enumerate(rows):
            tokens[b, : len(row)] = torch.tensor(row)
        slot = torch.tensor([len(row) - 3 for row in rows])
        target = self.verb(stem, plural)
        return {
            "tokens": tokens,
            "slot": slot,
            "subject": 2 + filler + 4 * (kind == 3),
            "plural": plural,
            "stem": stem,
            "kind": kind,
            "attractor": attractor,
            "target": target,
        }

    def _sentence(
        self,
        filler: int,
        kind: int,
        subj: Tensor,
        attr: Tensor,
        clause_verb: Tensor,
        adverb: Tensor,
        verb: Tensor,
    ) -> list[int]:
        row = [self.BOS] + [self.FILL] * filler
        if kind == 3:
            row += [self.NEAR, self.THE, int(attr), self.COMMA]
        row += [self.THE, int(subj)]
        if kind == 2:
            row += [self.THAT, self.THE, int(attr), int(clause_verb)]
        elif kind == 1:
            row += [self.NEAR, self.THE, int(attr)]
        return [*row, int(adverb), self.SLOT, int(verb), self.STOP]

    def batch(self, batch: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        """Training ``(inputs, targets)``, each (B, n): one target, the verb at ``<v>``."""
        s = self.sample(batch, generator, "train")
        return agreement_pair(s)


def agreement_pair(sample: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
    """A sample → ``(inputs, targets)``, each (B, n); the only target is the verb, at ``<v>``."""
    inputs = sample["tokens"][:, :-1]
    targets = torch.full_like(inputs, -100)
    targets[torch.arange(len(inputs)), sample["slot"]] = sample["target"]
    return inputs, targets


def sentence_pair(sample: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
    """A sample → next-token ``(inputs, targets)``, each (B, n), over whole sentences.

    Language modelling of the grammar: every next token is a target except padding, so the loss
    is the grammar's own uncertainty (which noun, which adverb, …) plus what attention resolves
    (the verb's agreement and stem, the clause verb, where the sentence ends).
    """
    tokens = sample["tokens"]
    targets = tokens[:, 1:].masked_fill(tokens[:, 1:] == AgreementTask.PAD, -100)
    return tokens[:, :-1], targets


# ---------------------------------------------------------------------------------------------
# Corpus text (issue 7): tokenised text (see headlab.corpus) with repeated passages mixed in
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CorpusTask:
    """Windows of tokenised text, some rewritten so that a span repeats later in the window.

    Each sequence starts with ``bos_id`` and holds n + 1 tokens. With probability ``p_random`` its
    body is uniform random token ids in which a random run repeats with a random period (so only
    an induction circuit, not a fixed offset, predicts the repeat); with probability ``p_span`` a
    span of its own text is copied further on (a repeated passage); otherwise it is plain text.
    Both repeats teach in-context copying early (Olsson et al. 2022).
    """

    ids: Tensor  # (N,) int64: the tokenised corpus split this task draws from
    seq_len: int  # n, tokens fed to the model per sequence (BOS included)
    bos_id: int  # the start token at position 0 of every sequence
    random_ids: Tensor  # (k,) ids the random runs are drawn from
    pool_ids: Tensor | None = None  # (m,) a small pool some random runs draw from instead
    p_random: float = 0.5  # share of sequences of repeated random tokens
    p_pool: float = 0.0  # share of those whose ids come from pool_ids (few ids: copying is
    # learned in a fraction of the steps, then carries over to every id)
    p_span: float = 0.2  # share of text sequences with a copied span
    min_span: int = 4  # shortest repeated run or span

    def __post_init__(self) -> None:
        problems = []
        if self.seq_len < 2 * self.min_span + 2:
            problems.append(f"seq_len must be at least {2 * self.min_span + 2}, got {self.seq_len}")
        if self.ids.numel() <= self.seq_len + 1:
            problems.append(f"the corpus has {self.ids.numel()} tokens, fewer than seq_len + 2")
        if min(self.p_random, self.p_span, self.p_pool) < 0 or self.p_random + self.p_span > 1:
            problems.append(
                f"need p_random, p_span, p_pool >= 0 and p_random + p_span <= 1, got "
                f"{self.p_random}, {self.p_span}, {self.p_pool}"
            )
        if problems:
            raise ValueError("; ".join(problems))

    def sample(self, batch: int, generator: torch.Generator) -> Tensor:
        """(B, n + 1) ids: BOS, then plain text, text with a copied span, or a random run."""
        n1 = self.seq_len + 1
        start = torch.randint(0, self.ids.numel() - n1, (batch,), generator=generator)
        body = self.ids[start[:, None] + torch.arange(n1 - 1)]  # (B, n)
        kind = torch.rand(batch, generator=generator)
        for b in range(batch):
            if kind[b] < self.p_random:
                pooled = self.pool_ids is not None and kind[b] < self.p_random * self.p_pool
                ids = self.pool_ids if pooled and self.pool_ids is not None else self.random_ids
                body[b] = self._random_run(ids, n1 - 1, generator)
            elif kind[b] < self.p_random + self.p_span:
                body[b] = self._copy_span(body[b], generator)
        bos = torch.full((batch, 1), self.bos_id, dtype=body.dtype)
        return torch.cat([bos, body], dim=1)  # (B, n + 1)

    def batch(self, batch: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        """A next-token batch ``(inputs, targets)``, each (B, n)."""
        return next_token_pair(self.sample(batch, generator))

    def _random_run(self, ids: Tensor, length: int, generator: torch.Generator) -> Tensor:
        """(length,) ids: random ids, then a random run repeated with period p from offset a."""
        p = _randint(self.min_span, length // 2, generator)
        a = _randint(0, length - 2 * p, generator)
        pick = torch.randint(0, ids.numel(), (length + p,), generator=generator)
        out = ids[pick[:length]].clone()
        run = ids[pick[length:]]
        reps = (length - a + p - 1) // p
        out[a:] = run.repeat(reps)[: length - a]
        return out

    def _copy_span(self, body: Tensor, generator: torch.Generator) -> Tensor:
        """The window with ``body[a : a + k]`` copied to ``[c, c + k)``, c >= a + k, k random."""
        length = body.numel()
        k = _randint(self.min_span, length // 2, generator)
        a = _randint(0, length - 2 * k, generator)
        c = _randint(a + k, length - k, generator)
        out = body.clone()
        out[c : c + k] = body[a : a + k]
        return out


def _randint(low: int, high: int, generator: torch.Generator) -> int:
    """One integer uniform in [low, high] (both ends included)."""
    return int(torch.randint(low, high + 1, (1,), generator=generator))
