"""Every score beside its chance level: random weights (several seeds) and shuffled tokens,
checked against loops over the raw attention weights; no label that random weights earn."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from headlab.heads import analyse
from headlab.heads.baselines import (
    BASELINE_SEEDS,
    K_SD,
    baselines,
    random_model,
    shuffled_probe,
)
from headlab.measure import build_probe, run_patterns

PROBES = ("repeat", "random-repeat")


@pytest.fixture(scope="module")
def probes(default):
    model, tokenizer = default
    c = model.config
    return {name: build_probe(name, tokenizer, c.max_len, c.vocab_size) for name in PROBES}


@pytest.fixture(scope="module")
def base(default, probes):
    return {name: baselines(default[0], p) for name, p in probes.items()}


def loop_scores(A: np.ndarray) -> dict[str, float]:
    """One head's previous-token and first-token scores from its causal weights (B, n, n), by
    their definitions: previous, A[i, i − 1] over queries i ≥ 1 (which see ≥ 2 keys); first
    token, the weight on key 0 over every query; both averaged over the sequences."""
    prev = [np.mean([a[i, i - 1] for i in range(1, a.shape[0])]) for a in A]
    first = [np.mean([a[i, 0] for i in range(a.shape[0])]) for a in A]
    return {"previous": float(np.mean(prev)), "first_token": float(np.mean(first))}


def pooled(values: list[float]) -> tuple[float, float]:
    return float(np.mean(values)), float(np.std(values, ddof=1))


@pytest.mark.parametrize("name", PROBES)
def test_random_weight_baseline_equals_loops_over_raw_weights(default, probes, base, name):
    """Per layer, the mean and sample sd over its heads and the seeds of each random model's
    scores, recomputed from the weights of freshly drawn models."""
    model, _ = default
    probe = probes[name]
    L, h = model.config.n_layers, model.config.n_heads
    per_layer: dict[str, list[list[float]]] = {
        k: [[] for _ in range(L)] for k in ("previous", "first_token")
    }
    for seed in BASELINE_SEEDS:
        weights = run_patterns(random_model(model, seed), probe.tokens)  # (L, B, h, n, n)
        for layer in range(L):
            for head in range(h):
                for k, v in loop_scores(weights[layer, :, head].numpy()).items():
                    per_layer[k][layer].append(v)
    for k, layers in per_layer.items():
        for layer, values in enumerate(layers):
            mean, sd = pooled(values)
            got = base[name].random[k][:, layer].tolist()
            assert got == pytest.approx([mean, sd], abs=1e-5), (k, layer)
            floor = base[name].floors()[layer][k]
            assert floor == pytest.approx(mean + K_SD * sd, abs=1e-5)


def test_shuffled_baseline_equals_loops_on_the_shuffled_tokens(default, probes, base):
    """The shuffled probe keeps every token (a permutation of the movable ones, specials in
    place); each head's shuffled mean and sd are the loop's over the shuffle orders."""
    model, _ = default
    probe = probes["random-repeat"]
    runs = []
    for seed in BASELINE_SEEDS:
        shuffled = shuffled_probe(probe, seed)
        for b in range(probe.tokens.shape[0]):
            before, after = probe.tokens[b], shuffled.tokens[b]
            fixed = ~probe.movable[b]
            assert torch.equal(before[fixed], after[fixed])
            assert sorted(before.tolist()) == sorted(after.tolist())
        assert not torch.equal(shuffled.tokens, probe.tokens)
        runs.append(run_patterns(model, shuffled.tokens))  # (L, B, h, n, n)
    for layer in range(model.config.n_layers):
        for head in range(model.config.n_heads):
            values = [loop_scores(w[layer, :, head].numpy())["previous"] for w in runs]
            got = base["random-repeat"].shuffled["previous"][:, layer, head].tolist()
            assert got == pytest.approx(list(pooled(values)), abs=1e-5)


@pytest.mark.parametrize("name", PROBES)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_randomly_initialised_model_gets_no_type_labels(default, probes, base, name, seed):
    """The default model's architecture drawn at random (seeds 0–2, none of them a baseline
    seed) on each probe the labeller uses: every head "mixed"."""
    model, _ = default
    assert seed not in BASELINE_SEEDS
    report = analyse(random_model(model, seed), probes[name], floors=base[name].floors())
    assert {s.label for s in report.heads} == {"mixed"}


def test_trained_labels_stand_above_their_baselines(default, probes, base):
    """The trained model's previous-token and induction heads keep their labels with the
    margin, each score more than K_SD random-weight sds above the random mean."""
    model, _ = default
    b = base["random-repeat"]
    report = analyse(model, probes["random-repeat"], floors=b.floors())
    labels = {(s.layer, s.head): s.label for s in report.heads}
    assert labels[(0, 0)] == "previous-token"
    induction = [s for s in report.heads if s.label == "induction"]
    assert len(induction) >= 3
    for s in induction:
        mean, sd = b.random["induction"][:, s.layer].tolist()
        assert s.scores["induction"] > mean + K_SD * sd


@pytest.mark.parametrize("n_kv_heads", [None, 2])
def test_random_models_are_torchs_seeded_init_whatever_else_draws(n_kv_heads, monkeypatch) -> None:
    """random_model(seed) equals Transformer(config) built after torch.manual_seed(seed), also
    when something else reseeds and draws from torch's global generator between its draws (a
    live run does so from another thread in the server; the floors cached from it were wrong
    when random_model used that generator). The meddling runs inside every layer's
    initialisation, so it lands between random_model's draws on every run, not only when two
    threads happen to interleave; and random_model leaves the global generator as it found it."""
    from torch import nn

    from headlab.heads.baselines import random_model
    from headlab.model import ModelConfig, Transformer

    config = ModelConfig(
        vocab_size=50, d_model=32, n_heads=4, n_kv_heads=n_kv_heads, n_layers=2, max_len=16
    )
    model = Transformer(config)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(1000)
        want = Transformer(config).state_dict()
    torch.manual_seed(3)
    before = torch.random.get_rng_state()
    assert all(torch.equal(random_model(model, 1000).state_dict()[k], want[k]) for k in want)
    assert torch.equal(torch.random.get_rng_state(), before)

    meddled = []
    reset = nn.Linear.reset_parameters

    def meddling(self: nn.Linear) -> None:
        torch.manual_seed(7)  # another user of the global generator, mid-build
        torch.rand(64)
        meddled.append(1)
        reset(self)

    monkeypatch.setattr(nn.Linear, "reset_parameters", meddling)
    got = random_model(model, 1000).state_dict()
    assert len(meddled) >= 2 * 4  # every projection of both layers
    assert all(torch.equal(got[k], want[k]) for k in want)


def test_floors_that_would_not_fit_in_memory_are_refused_in_one_sentence(
    default, repeat, tmp_path, monkeypatch
):
    """The floors build the architecture with random weights in memory; where that copy is
    larger than the memory available (a model dispatched because it does not fit), labelling
    stops with a ValueError naming both sizes and --no-floors, and the command line prints it
    as one line, exit 2, instead of running out of memory. Without floors, and where the
    memory available cannot be read, it runs."""
    import copy

    from typer.testing import CliRunner

    from headlab.cli import app
    from headlab.heads import baselines

    monkeypatch.setenv("HEADLAB_CACHE", str(tmp_path))  # no floors kept from earlier runs,
    monkeypatch.setattr(baselines, "_MEMORY", {})  # nor from earlier tests
    model, _ = default
    need = sum(p.numel() for p in model.parameters()) * 4
    monkeypatch.setattr(baselines, "available_memory", lambda: need - 1)
    mib = rf"{need / 2**20:,.1f} MiB"
    with pytest.raises(ValueError, match=rf"in memory \({mib}\), more than .*\(--no-floors"):
        baselines.label_heads(model, repeat, keep=())
    assert baselines.label_heads(model, repeat, keep=(), floors=False).floors is None
    result = CliRunner().invoke(app, ["heads", "--model", "default"])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "--no-floors" in " ".join(result.stderr.split())
    monkeypatch.setattr(baselines, "available_memory", lambda: need)
    assert baselines.label_heads(model, repeat, keep=()).floors is not None
    monkeypatch.setattr(baselines, "available_memory", lambda: None)
    monkeypatch.setattr(baselines, "_MEMORY", {})  # built again, not read from the call above
    monkeypatch.setenv("HEADLAB_CACHE", str(tmp_path / "again"))
    assert baselines.label_heads(model, repeat, keep=()).floors is not None
    # a bfloat16 model's copy is built in float32, then cast: both at once, 4 + 2 bytes a weight
    half = copy.deepcopy(model).to(torch.bfloat16)
    monkeypatch.setattr(baselines, "available_memory", lambda: need // 4 * 6 - 1)
    with pytest.raises(ValueError, match="--no-floors"):
        baselines.random_model(half, 0)
    monkeypatch.setattr(baselines, "available_memory", lambda: need // 4 * 6)
    assert baselines.random_model(half, 0).embed.weight.dtype == torch.bfloat16
