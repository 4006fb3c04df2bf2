"""The static site's switch-off graph (:func:`headlab.site.export_switch`, the module
:class:`headlab.heads.switch.SwitchGraph` exported with torch.onnx.export(dynamo=True)) run by
onnxruntime, the outside runtime, against :func:`headlab.heads.switch.switch_off` in PyTorch:
random sets of heads, both modes, texts of 2 to 64 tokens."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
import torch

from headlab import site, zoo
from headlab.heads.evidence import loss_rows
from headlab.heads.switch import switch_off
from headlab.measure import build_probe, make_probe, text_probe

onnxruntime = pytest.importorskip("onnxruntime", reason="headlab[static] installs onnxruntime")


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> tuple[object, object, object]:
    """The default model, its tokenizer and an onnxruntime session of its switch-off graph."""
    pytest.importorskip("onnxscript", reason="headlab[static] exports with torch.onnx (dynamo)")
    model, tokenizer = zoo.load("default")
    path = site.export_switch(model, tmp_path_factory.mktemp("onnx") / site.SWITCH_FILE)
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    assert [i.name for i in session.get_inputs()] == list(site.SWITCH_INPUTS)
    assert [o.name for o in session.get_outputs()] == list(site.SWITCH_OUTPUTS)
    return model, tokenizer, session


def run_graph(session, tokens: torch.Tensor, heads, mode: str, L: int, h: int) -> dict:
    off = np.zeros((L, h), dtype=np.float32)
    for layer, head in heads:
        off[layer, head] = 1.0
    mean = np.array(1.0 if mode == "mean" else 0.0, dtype=np.float32)
    out = session.run(None, {"tokens": tokens.numpy(), "off": off, "mean": mean})
    return dict(zip(site.SWITCH_OUTPUTS, out, strict=True))


def close(got: np.ndarray, want: torch.Tensor) -> float:
    return float(np.abs(got - want.numpy()).max()) if got.size else 0.0


# texts nobody else uses, of every kind: a repeat, punctuation, digits, one word
TEXTS = [
    "The blue heron fished at noon; the blue heron fished at dusk.",
    "x",
    "Seven ships sailed, 7 ships sank, and seven ships sailed again.",
    "Ana paints boats. Ana paints boats. Ana paints boats.",
]


def probe_of(case: int, model, tokenizer):
    """The case's probe: a text, the built-in repeat, or random ids of 2, 17 or 64 tokens."""
    c = model.config
    if case < len(TEXTS):
        return text_probe(tokenizer, TEXTS[case], c.max_len)
    if case == len(TEXTS):
        return build_probe("repeat", tokenizer, c.max_len, c.vocab_size)
    n = [2, 17, c.max_len][case - len(TEXTS) - 1]
    ids = torch.randint(1, c.vocab_size, (1, n), generator=torch.Generator().manual_seed(case))
    ids[0, n // 2 :] = ids[0, : n - n // 2].clone()  # a repeat: its second half copies the first
    return make_probe("ids", ids, tokenizer)


@pytest.mark.parametrize("case", range(len(TEXTS) + 4))
def test_graph_equals_switch_off_for_random_heads(exported, case: int) -> None:
    """Each output of the graph equals switch_off's for a random set of heads (1 to all 16,
    seeded), both modes, on a text, the built-in repeat or random ids of 2 to 64 tokens: the
    predictions (the same ids, probabilities within 1e-5), every loss and its means over the
    repeat's rows and every row, every pattern and every induction score; the rows of the
    repeat are the evidence's (loss_rows)."""
    model, tokenizer, session = exported
    c = model.config
    L, h = c.n_layers, c.n_heads
    rng = random.Random(case)
    every = [(l, i) for l in range(L) for i in range(h)]
    heads = sorted(rng.sample(every, rng.randint(1, len(every))))
    probe = probe_of(case, model, tokenizer)
    for mode in ("mean", "zero"):
        got = run_graph(session, probe.tokens, heads, mode, L, h)
        want = switch_off(model, probe, heads, mode)
        assert np.array_equal(got["repeat_rows"], loss_rows(probe, causal=True)["induction"])
        assert np.array_equal(got["repeat_rows"], want.repeat_rows)
        for r, run in enumerate((want.intact, want.off)):
            where = (case, mode, r)
            assert np.array_equal(got["top_ids"][r], run.top_ids), where
            assert close(got["top_probs"][r], run.top_probs) < 1e-5, where
            assert close(got["losses"][r], run.losses) < 1e-4, where
            assert close(got["weights"][r], run.weights) < 1e-5, where
            assert close(got["induction"][r], run.induction) < 1e-5, where
            for k, key in enumerate(("repeat", "all")):
                means = want.losses()[key]
                shown = float(got["loss"][r, k])
                if means is None:  # no row of the repeat: NaN, as Run.loss gives
                    assert math.isnan(shown), where
                else:
                    assert shown == pytest.approx(means["intact" if r == 0 else "off"], abs=1e-4)


def test_the_mode_and_the_mask_change_the_answer(exported) -> None:
    """The inputs are live in the graph (not folded into constants at export): no head off
    gives the intact run twice (to float rounding), and the mean and zero modes give different
    runs for a head."""
    model, tokenizer, session = exported
    c = model.config
    tokens = text_probe(tokenizer, TEXTS[0], c.max_len).tokens
    none = run_graph(session, tokens, [], "mean", c.n_layers, c.n_heads)
    assert np.allclose(none["losses"][0], none["losses"][1], atol=1e-5)
    assert np.allclose(none["weights"][0], none["weights"][1], atol=1e-6)
    mean = run_graph(session, tokens, [(0, 2)], "mean", c.n_layers, c.n_heads)
    zero = run_graph(session, tokens, [(0, 2)], "zero", c.n_layers, c.n_heads)
    assert np.abs(mean["losses"][1] - zero["losses"][1]).max() > 1e-2
    assert np.abs(mean["losses"][1] - mean["losses"][0]).max() > 1e-2
