"""``induction_active`` against TransformerLens's head detector (Nanda and Bloom 2022,
``transformer_lens/head_detector.py``), on the shipped default model and on random weights of
its shape.

TransformerLens is not a dependency of headlab, so its pieces are written out below from its
source, each with the function it stands for:

    get_duplicate_token_head_detection_pattern(tokens)   D[i, j] = 1 when j < i and t_j = t_i
    get_induction_head_detection_pattern(tokens)         D moved one key to the right, key 0
                                                         emptied, the lower triangle kept:
                                                         P[i, j] = 1 when 1 ≤ j ≤ i and
                                                         t_{j−1} = t_i
    compute_head_attention_similarity_score(A, P, exclude_bos=True,
        exclude_current_token=False, error_measure="mul")
                                                         A square; A[:, 0] = 0; Σ(A ⊙ P) / ΣA

The correspondence, per sequence b and head. headlab's target is the ``induction`` score's
(docs/heads.md): P without the keys that are themselves copies of the query's token, that is
T = P ⊙ (1 − D) ⊙ (1 − I) (D marks the earlier copies, I the query itself); R = the rows i
with a 1 in T. headlab defines

    share_b = Σ_{i∈R} Σ_j A_ij T_ij / Σ_{i∈R} Σ_{j≥1} A_ij,     induction_active = mean_b share_b

over the sequences with R non-empty. TransformerLens's "mul" score with ``exclude_bos=True`` on
A_R (A with every row outside R set to 0) and detection pattern T is Σ_ij A_R,ij T_ij /
Σ_i Σ_{j≥1} A_R,ij, which is share_b term by term: a zeroed row adds 0 to both sums, the zeroed
column 0 is the Σ_{j≥1}, and T holds no key 0. Three things TransformerLens cannot do as
headlab does, and how the oracle gets round them:

1. Its similarity score asserts a square pattern, so the query rows cannot be sliced; the rows
   outside R are zeroed instead (the same sums, above).
2. Its own induction pattern also marks keys that are copies of the query's token (in a run
   "x x", the key after an earlier x is an x); headlab leaves them out. With TransformerLens's
   pattern alone the two differ exactly on such keys, and agree on every sequence that has
   none (``test_transformer_lens_pattern_alone_differs_only_at_keys_in_a_run``).
3. ``detect_head(model, [seq, …], "induction_head", exclude_bos=True)`` recurses over the list
   without passing ``exclude_bos`` on, so it cannot average the BOS-free score over sequences;
   the oracle calls the similarity score once per sequence and takes the plain mean, as
   ``detect_head`` does for a list. Where a sequence's rows put nothing off key 0 its score
   is 0/0 (NaN); headlab says 0. The oracle asserts that no such sequence occurs here.

The attention weights come from headlab's own forward (tests/interop/test_attention.py holds
its attention to PyTorch's); this file holds the score computed from them. Both of headlab's
paths are checked: the public :func:`headlab.heads.induction_active_score` and the report
:func:`headlab.heads.analyse` labels by (every head and each layer's averaged head), to 5e-5.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

import numpy as np
import pytest
import torch

from headlab.heads import analyse, scores
from headlab.heads.baselines import random_model
from headlab.measure import build_probe, run_patterns

TOL = 5e-5
# Each typed twice, as the page's text box gets it. The first has a run (" very very"), where
# TransformerLens's induction pattern and headlab's target differ (point 2 above).
SENTENCES = [
    "He was very very tired, so he slept early.",
    "The red kite rose above the hill until the wind carried it away.",
    "Maria bought fresh bread and cheese at the corner market.",
    "The old clock in the hall stopped at seven.",
]
RANDOM_SEEDS = (0, 1)


# --- TransformerLens's pieces, written out -----------------------------------------------------


def tl_duplicate_pattern(t: list[int]) -> np.ndarray:
    """get_duplicate_token_head_detection_pattern: (n, n), 1 where an earlier key holds the
    query's token (the diagonal emptied, the lower triangle kept)."""
    n = len(t)
    return np.array([[float(j < i and t[j] == t[i]) for j in range(n)] for i in range(n)])


def tl_induction_pattern(t: list[int]) -> np.ndarray:
    """get_induction_head_detection_pattern: the duplicate pattern moved one key to the right,
    column 0 emptied (the roll brings the last column round to it), the lower triangle kept."""
    D = tl_duplicate_pattern(t)
    P = np.zeros_like(D)
    P[:, 1:] = D[:, :-1]
    return np.tril(P)


def tl_mul_without_bos(A: np.ndarray, P: np.ndarray) -> float:
    """compute_head_attention_similarity_score(A, P, exclude_bos=True,
    exclude_current_token=False, error_measure="mul")."""
    assert A.ndim == 2 and A.shape[0] == A.shape[1] == P.shape[0] == P.shape[1], A.shape
    A = A.copy()  # TransformerLens zeroes the column in place
    A[:, 0] = 0.0
    with np.errstate(invalid="ignore", divide="ignore"):
        return float((A * P).sum() / A.sum())


# --- the correspondence of the module docstring ------------------------------------------------


def headlab_target(t: list[int]) -> np.ndarray:
    """T = P ⊙ (1 − D) ⊙ (1 − I): TransformerLens's induction pattern without the keys that are
    copies of the query's token."""
    return tl_induction_pattern(t) * (1 - tl_duplicate_pattern(t)) * (1 - np.eye(len(t)))


Target = Callable[[list[int]], np.ndarray]


def oracle(A: np.ndarray, tokens: torch.Tensor, target: Target = headlab_target) -> np.ndarray:
    """A (B, h, n, n), tokens (B, n) → (h,): per sequence TransformerLens's BOS-free "mul" score
    on the rows that have a target (the others zeroed), then the mean over those sequences."""
    B, h = A.shape[:2]
    per_seq = []
    for b in range(B):
        T = target(tokens[b].tolist())
        rows = T.sum(-1) > 0  # R
        if not rows.any():
            continue
        share = [tl_mul_without_bos(np.where(rows[:, None], A[b, k], 0.0), T) for k in range(h)]
        assert np.isfinite(share).all(), (b, share)  # 0/0: headlab would say 0 (point 3)
        per_seq.append(share)
    return np.mean(per_seq, axis=0) if per_seq else np.zeros(h)


def deviations(model, probe) -> dict[str, float]:
    """The largest |headlab − oracle| over every head and each layer's averaged head, for the
    public score function and for the report. The functions are looked up on the module at
    call time, so a monkeypatched copy is what is measured."""
    A = run_patterns(model, probe.tokens)  # (L, B, h, n, n)
    report = analyse(model, probe, content=False, keep=())
    direct, reported = 0.0, 0.0
    for layer in range(A.shape[0]):
        weights = A[layer]  # (B, h, n, n)
        want = oracle(weights.double().numpy(), probe.tokens)
        got = scores.induction_active_score(weights, probe.tokens).double().numpy()
        direct = max(direct, float(np.abs(got - want).max()))
        heads = [s for s in report.heads if s.layer == layer]
        assert [s.head for s in heads] == list(range(weights.shape[1]))
        got = np.array([s.scores["induction_active"] for s in heads])
        reported = max(reported, float(np.abs(got - want).max()))
        averaged = weights.mean(dim=1, keepdim=True).double().numpy()  # (B, 1, n, n)
        got_avg = report.averaged[layer].scores["induction_active"]
        reported = max(reported, abs(got_avg - float(oracle(averaged, probe.tokens)[0])))
    return {"induction_active_score": direct, "analyse": reported}


# --- the models and probes --------------------------------------------------------------------


@pytest.fixture(scope="module")
def probes(default) -> dict[str, object]:
    model, tokenizer = default
    c = model.config

    def probe(name: str, text: str | None = None):
        return build_probe(name, tokenizer, c.max_len, c.vocab_size, text)

    out = {f"text {i}": probe("text", f"{s} {s}") for i, s in enumerate(SENTENCES)}
    out["repeat"] = probe("repeat")
    out["random-repeat"] = probe("random-repeat")  # 4 sequences: the mean over them counts
    assert out["random-repeat"].tokens.shape[0] > 1
    return out


@pytest.fixture(scope="module")
def models(default) -> dict[str, object]:
    model, _ = default
    return {"default": model, **{f"random {s}": random_model(model, s) for s in RANDOM_SEEDS}}


@pytest.mark.slow
def test_induction_active_equals_transformer_lens_bos_free_mul_score(models, probes):
    for model_name, model in models.items():
        for probe_name, probe in probes.items():
            worst = deviations(model, probe)
            assert max(worst.values()) <= TOL, (model_name, probe_name, worst)


@pytest.mark.slow
def test_transformer_lens_pattern_alone_differs_only_at_keys_in_a_run(models, probes):
    """Point 2 of the module docstring: TransformerLens's induction pattern less headlab's
    target is exactly the keys j with t_{j−1} = t_j = t_i; where a probe has none, the
    unmodified pattern gives headlab's score too. The run sentence has such keys."""
    for probe_name, probe in probes.items():
        for t in probe.tokens.tolist():
            extra = np.argwhere(tl_induction_pattern(t) - headlab_target(t))
            in_run = [
                (i, j) for i in range(len(t)) for j in range(1, i + 1) if t[j - 1] == t[j] == t[i]
            ]
            assert [tuple(x) for x in extra.tolist()] == in_run, probe_name
    run = probes["text 0"].tokens[0].tolist()
    assert np.any(tl_induction_pattern(run) != headlab_target(run))
    for probe_name, probe in probes.items():
        if probe_name == "text 0":
            continue
        for t in probe.tokens.tolist():
            assert np.array_equal(tl_induction_pattern(t), headlab_target(t)), probe_name
        for model in models.values():
            A = run_patterns(model, probe.tokens)
            for weights in A:
                got = scores.induction_active_score(weights, probe.tokens).double().numpy()
                plain = oracle(weights.double().numpy(), probe.tokens, tl_induction_pattern)
                assert np.abs(got - plain).max() <= TOL, probe_name


# --- the oracle catches a wrong formula -----------------------------------------------------


def scratch_copy(function: Callable, old: str, new: str) -> Callable:
    """``function`` recompiled from its source with ``old`` replaced by ``new`` (each must
    occur), in a copy of its module's namespace: a wrong variant, the source untouched."""
    source = inspect.getsource(function)
    assert old in source, (function.__name__, old)
    namespace = dict(function.__globals__)
    exec(compile(source.replace(old, new), f"<scratch {function.__name__}>", "exec"), namespace)
    return namespace[function.__name__]


def pooled_mean(hit: torch.Tensor, active: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """The wrong mean: one ratio of the sums pooled over the sequences."""
    keep = valid[:, None].to(hit.dtype)
    return ((hit * keep).sum(0) / (active * keep).sum(0).clamp_min(1e-30)).float()


@pytest.mark.slow
def test_the_oracle_tells_a_wrong_formula(models, probes, monkeypatch):
    """Each wrong variant, put in place by monkeypatch on a scratch copy, moves the score of
    some head on the default model past the tolerance, on the path it changes."""
    model, unchanged = models["default"], deviations(models["default"], probes["random-repeat"])
    assert max(unchanged.values()) <= TOL
    wrong = {
        # key 0 kept in the denominator: the plain share of all attention
        "with key 0": [
            ("induction_active_score", "A.sum(-1) - A[..., 0]", "A.sum(-1)"),
            (
                "stacked_masses",
                "induction_mass.sum(-1) - induction_mass[..., 0]",
                "induction_mass.sum(-1)",
            ),
        ],
        # the rows TransformerLens's induction pattern has, keys in a run counted
        "copies counted": [
            (
                "induction_active_score",
                "token_rule_targets(toks, causal=True)[0]",
                "induction_pattern(toks)",
            ),
        ],
    }
    for name, edits in wrong.items():
        with monkeypatch.context() as m:
            for function, old, new in edits:
                m.setattr(scores, function, scratch_copy(getattr(scores, function), old, new))
            probe = probes["text 0"] if name == "copies counted" else probes["random-repeat"]
            worst = deviations(model, probe)
        paths = ["induction_active_score"] if name == "copies counted" else list(worst)
        for path in paths:
            assert worst[path] > TOL, (name, path, worst)
    with monkeypatch.context() as m:  # pooled over the sequences instead of their mean
        m.setattr(scores, "_active_mean", pooled_mean)
        worst = deviations(model, probes["random-repeat"])
    assert min(worst.values()) > TOL, worst
