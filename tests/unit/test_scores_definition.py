"""The scores' PyTorch definition and its compiled accelerator: one set of numbers.

The content score, each row's argmax and entropy are written once as PyTorch operations
(headlab.heads.content.content_parts, scores._row_stats) and, on the CPU in float32, computed by
compiled loops (headlab.heads.kernels) where headlab.heads.fast allows. Held here: the
definition to the plain-Python loop of the content score's formulas, the loops to the
definition on random patterns and on every head of real models, and headlab heads with Numba
unavailable to headlab heads with it."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from test_content_score import loop_content, random_patterns

from conftest import require
from headlab import zoo
from headlab.heads import analyse, fast
from headlab.heads.content import _content_masks, content_parts, content_score
from headlab.heads.scores import _row_stats
from headlab.measure import build_probe, text_probe


@pytest.fixture
def definition(monkeypatch: pytest.MonkeyPatch):
    """``definition(True)``: the PyTorch definition runs where the compiled loops would;
    ``definition(False)``: the loops again."""
    loops = fast.usable

    def use(on: bool) -> None:
        monkeypatch.setattr(fast, "usable", (lambda weights: False) if on else loops)

    return use


@pytest.mark.parametrize("causal", [True, False])
def test_the_definition_equals_the_loop_of_its_formulas(causal: bool) -> None:
    """float64 weights: the PyTorch operations give the loop's numbers to 1e-12; float32 to
    1e-6, on one sequence and several, with fixed keys and a row of no weight."""
    g = torch.Generator().manual_seed(11)
    for B, h, n in [(1, 3, 2), (1, 5, 9), (3, 4, 7), (2, 3, 25)]:
        A = random_patterns(B, h, n, causal, g)
        fixed = torch.rand(B, n, generator=g) < 0.25
        sees, size, every = _content_masks(B, n, causal, fixed)
        want = loop_content(A, causal, fixed)
        got = (content_parts(A, sees, size) / every).amin(1).clamp(0, 1)
        assert got.tolist() == pytest.approx(want, abs=1e-12), (B, h, n)
        got32 = (content_parts(A.float(), sees, size) / every).amin(1).clamp(0, 1)
        assert got32.tolist() == pytest.approx(want, abs=1e-6), (B, h, n)


@pytest.mark.parametrize("causal", [True, False])
def test_the_compiled_loops_equal_the_definition(causal: bool, definition) -> None:
    """content, argmax and Σ A log A: the loops (float32, CPU) against the definition."""
    g = torch.Generator().manual_seed(12)
    for B, h, n in [(1, 5, 9), (2, 12, 64), (1, 4, 200)]:
        A = random_patterns(B, h, n, causal, g).float()
        A[0, 1, 3] = 0.0  # exact zeros: 0 · log 0 = 0 in both
        A[0, 1, 3, 2] = 1.0
        A[0, 2, 4] = 0.0  # a tie: the first of two equal maxima is the argmax in both
        A[0, 2, 4, 1] = A[0, 2, 4, 3] = 0.5
        fixed = torch.rand(B, n, generator=g) < 0.2
        assert fast.usable(A)
        compiled = content_score(A, causal, fixed), *_row_stats(A)
        definition(True)
        assert not fast.usable(A)
        plain = content_score(A, causal, fixed), *_row_stats(A)
        definition(False)
        assert compiled[0].tolist() == pytest.approx(plain[0].tolist(), abs=1e-7)
        assert torch.equal(compiled[1], plain[1])
        assert compiled[2].flatten().tolist() == pytest.approx(
            plain[2].flatten().tolist(), abs=1e-5, rel=1e-5
        )


@pytest.mark.parametrize("causal", [True, False])
def test_the_loops_equal_the_definition_on_very_sharp_heads(causal: bool, definition) -> None:
    """Logits of sd 100: cells that one row holds nearly alone (the other rows' share below
    2⁻¹⁶ of it), where subtracting the row's own share from the float32 pairs alone left a
    content score 5.9e-4 off (seed 7, bidirectional); the loops work such a row again from
    the float64 sums. Within 5e-7: float32 rounding of the score."""
    B, h, n = 1, 12, 48
    for seed in range(12):
        logits = torch.randn(B, h, n, n, generator=torch.Generator().manual_seed(seed)) * 100
        if causal:
            logits = logits.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), -torch.inf)
        A = logits.softmax(-1).contiguous()
        compiled = content_score(A, causal)
        definition(True)
        plain = content_score(A, causal)
        definition(False)
        assert compiled.tolist() == pytest.approx(plain.tolist(), abs=5e-7), seed


def scores_of(report) -> list[tuple[str, dict[str, float]]]:
    return [(s.label, s.scores) for s in report.heads + report.averaged]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["default", "minilm", "smollm2"])
@pytest.mark.parametrize("probe", ["repeat", "random-repeat", "text"])
def test_every_score_of_a_real_model_is_the_same_either_way(name, probe, definition) -> None:
    """Every head's every score within 1e-6 and every label equal, the compiled loops or the
    definition, on the probes the tests use."""
    if name == "minilm":
        pytest.importorskip("transformers")
    if name == "smollm2":
        info = next(i for i in zoo.list_models() if i.name == "smollm2")
        require(info.available, "SmolLM2 is not fetched: headlab models --fetch smollm2")
    model, tokenizer = zoo.load(name)
    # SmolLM2's context is 8k tokens: its probes are held to 128, as the page's are
    length = 128 if name == "smollm2" else model.config.max_len
    if probe == "text":
        p = text_probe(tokenizer, "The keeper counted the sheep, and the keeper slept.", 64)
    else:
        p = build_probe(probe, tokenizer, length, model.config.vocab_size, seed=3)
    compiled = scores_of(analyse(model, p))
    definition(True)
    plain = scores_of(analyse(model, p))
    assert [label for label, _ in compiled] == [label for label, _ in plain]
    for (_, a), (_, b) in zip(compiled, plain, strict=True):
        assert a.keys() == b.keys()
        assert [a[k] for k in a] == pytest.approx([b[k] for k in a], abs=1e-6)


REFUSE_NUMBA = """
import sys
class Refuse:
    def find_spec(self, name, path=None, target=None):
        if name == "numba" or name.startswith("numba.") or name == "llvmlite":
            raise ImportError(f"{name} is blocked by the test")
sys.meta_path.insert(0, Refuse())
"""
BLOCK_NUMBA = (
    REFUSE_NUMBA
    + """
from headlab.cli import app
sys.argv = ["headlab", *sys.argv[1:]]
app()
"""
)
SERVE_WITHOUT_NUMBA = (
    REFUSE_NUMBA
    + """
import json, sys
from fastapi.testclient import TestClient
from headlab.server.app import create_app
with TestClient(create_app()) as client:
    answer = client.post("/api/heads", json={"model": "default", "probe": "repeat"})
    print(json.dumps({"status": answer.status_code, "numba": "numba" in sys.modules,
                      "labels": [h["label"] for h in answer.json()["heads"]]}))
"""
)


@pytest.mark.slow
def test_headlab_heads_without_numba_gives_the_same_labels(tmp_path) -> None:
    """Numba's import refused: `headlab heads --json` runs on the definition and gives the same
    labels, and scores within 1e-6, as with the compiled loops."""
    args = ["heads", "--model", "default", "--json"]
    env = {**os.environ, "HEADLAB_CACHE": str(tmp_path)}
    normal = subprocess.run(
        [sys.executable, "-m", "headlab.cli", *args], capture_output=True, text=True, env=env
    )
    blocked = subprocess.run(
        [sys.executable, "-c", BLOCK_NUMBA, *args], capture_output=True, text=True, env=env
    )
    assert normal.returncode == 0, normal.stderr
    assert blocked.returncode == 0, blocked.stderr
    a, b = json.loads(normal.stdout), json.loads(blocked.stdout)
    assert [h["label"] for h in a["heads"]] == [h["label"] for h in b["heads"]]
    for x, y in zip(a["heads"], b["heads"], strict=True):
        assert x["scores"] == pytest.approx(y["scores"], abs=2e-4)  # the JSON's 4 decimals


@pytest.mark.slow
def test_the_server_starts_and_answers_without_numba(tmp_path) -> None:
    """The page's server loads the compiled loops at startup where it can; with Numba's import
    refused it starts all the same and /api/heads gives the labels it gives with them."""
    env = {**os.environ, "HEADLAB_CACHE": str(tmp_path)}
    out = {}
    for name, code in (
        ("blocked", SERVE_WITHOUT_NUMBA),
        ("normal", SERVE_WITHOUT_NUMBA[len(REFUSE_NUMBA) :]),
    ):
        run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
        assert run.returncode == 0, run.stderr
        out[name] = json.loads(run.stdout.splitlines()[-1])
    assert out["blocked"]["status"] == out["normal"]["status"] == 200
    assert not out["blocked"]["numba"] and out["normal"]["numba"]
    assert out["blocked"]["labels"] == out["normal"]["labels"]


def test_a_nans_sign_decides_where_the_compiled_argmax_puts_it() -> None:
    """What kernels.row_stats' docstring says: a NaN with the sign bit clear (torch's nan) is
    the argmax, as torch.argmax gives; the one x86 arithmetic makes (0/0, sign bit set) falls
    below every weight, where torch.argmax takes it."""
    from headlab.heads.kernels import row_stats_parallel

    made = torch.full((3,), float("-inf")).softmax(-1)  # a row of no allowed key, unmasked
    signed = torch.tensor([-0x400000], dtype=torch.int32).view(torch.float32)  # 0xFFC00000
    assert made.isnan().all() and signed.isnan().all()
    assert torch.equal(made[:1].view(torch.int32), signed.view(torch.int32))
    rows = torch.tensor([[0.1, 0.5, 0.2, 0.2], [0.1, 0.5, 0.2, 0.2]])
    rows[0, 2] = float("nan")
    rows[1, 0] = signed[0]
    argmax, _ = row_stats_parallel(rows.numpy())
    assert argmax.tolist()[0] == int(rows[0].argmax()) == 2
    assert argmax.tolist()[1] == 1 and int(rows[1].argmax()) == 0
