"""A sink on position 0 is no rare-word head: without a start token the first word sits where
sinks rest, and the rare-word score leaves that position out (Voita et al. 2019; Gu et al.
2024)."""

from __future__ import annotations

import pytest
import torch

from headlab.heads import rare_word_score, rare_word_targets


def test_a_sink_on_a_rare_first_word_is_no_rare_word_head():
    """Words: Obsidian(0: pieces 0, 1) blades(1) were(2) traded(3); no start token. A head
    resting on position 0 hits no rare key; a head looking at the word's second piece does."""
    word_index = torch.tensor([[0, 0, 1, 2, 3]])
    zipf = [[1.0, 3.0, 6.0, 4.0]]
    rare, rows = rare_word_targets(word_index, zipf, causal=True)
    assert rare.tolist() == [[False, True, False, False, False]]
    assert rows.tolist() == [[False, False, True, True, True]]
    sink = torch.zeros(1, 1, 5, 5)
    sink[..., 0] = 1.0
    assert rare_word_score(sink, rare, rows).item() == 0.0
    second = torch.zeros(1, 1, 5, 5)
    second[0, 0, 0, 0] = 1.0
    second[0, 0, 1:, 1] = 1.0
    assert rare_word_score(second, rare, rows).item() == pytest.approx(1.0)


def test_a_rare_word_wholly_on_position_0_leaves_its_sequence_unjudged():
    word_index = torch.tensor([[0, 1, 2], [0, 1, 2]])
    zipf = [[1.0, 5.0, 6.0], [5.0, 1.0, 6.0]]
    rare, rows = rare_word_targets(word_index, zipf, causal=True)
    assert not rows[0].any() and rows[1].tolist() == [False, False, True]
    sink = torch.zeros(2, 1, 3, 3)
    sink[..., 0] = 1.0
    assert rare_word_score(sink, rare, rows).item() == 0.0  # judged on sequence 1 only
