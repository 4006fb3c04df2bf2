"""Synthetic training data: each task is a seeded batch generator for ``headlab.train``.

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


def next_token_pair(tokens: Tensor) -> tuple[Tensor, Tensor]:
    """(B, n + 1) token ids → ``(inputs, targets)``, each (B, n), for next-token prediction."""
    return tokens[:, :-1], tokens[:, 1:]


def repeated_halves(
    vocab_size: int, seq_len: int, batch: int, generator: torch.Generator
) -> Tensor:
    """(B, seq_len) ids: a random first half, then the same tokens again (the standard probe).

    The first half is ``seq_len // 2`` uniform random tokens; an odd ``seq_len`` gets one more
    random token at the end. Used to measure loss on the first vs the repeated half and the
    induction score of each head (Olsson et al. 2022).
    """
    half = seq_len // 2
    first = torch.randint(0, vocab_size, (batch, half), generator=generator)
    extra = torch.randint(0, vocab_size, (batch, seq_len - 2 * half), generator=generator)
    return torch.cat([first, first, extra], dim=1)  # (B, seq_len)

