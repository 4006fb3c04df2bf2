"""Models larger than memory: a random Llama whose weights exceed a max_memory budget, offloaded
to disk by accelerate, gives the scores, patterns and logits of the same model in memory."""

from __future__ import annotations

import json

import pytest
import torch

from headlab import zoo
from headlab.convert import CheckpointState, convert_checkpoint
from headlab.heads import analyse
from headlab.measure import random_repeat_probe

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")


def random_llama(directory, tie: bool):
    """A 4-layer GQA Llama with random weights, saved with safetensors and a word tokenizer."""
    import tokenizers

    config = transformers.LlamaConfig(
        vocab_size=64,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=tie,
    )
    torch.manual_seed(1)
    hf = transformers.LlamaForCausalLM(config).eval()
    with torch.no_grad():  # norm gains away from 1, so a misplaced norm weight shows
        for name, p in hf.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
    hf.save_pretrained(directory)
    vocab = {f"w{i}": i for i in range(64)}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="w0"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tok.save(str(directory / "tokenizer.json"))
    return hf


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HEADLAB_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return tmp_path


def assert_same_scores(want, got) -> None:
    for a, b in zip(want.heads + want.averaged, got.heads + got.averaged, strict=True):
        assert (a.layer, a.head, a.label, a.offset) == (b.layer, b.head, b.label, b.offset)
        assert b.scores == pytest.approx(a.scores, abs=1e-6)


def weight_bytes(model) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


@pytest.mark.slow
@pytest.mark.parametrize("tie", [False, True])
def test_offloaded_llama_scores_equal_the_in_memory_run(cache, tie):
    hf = random_llama(cache / "llama", tie)
    in_memory, _ = zoo.load_hf_dir(cache / "llama", "llama")
    total = weight_bytes(in_memory)
    budget = total * 2 // 3  # less than the weights: some blocks must go to disk
    big, _ = zoo.load_dispatched(cache / "llama", "llama", "auto", {"cpu": budget}, cache / "off")
    placed = big.hf_device_map
    assert "disk" in placed.values() and any(v == "cpu" for k, v in placed.items() if k != "rotary")
    assert any(f.suffix == ".dat" for f in (cache / "off").iterdir())  # weights really on disk
    probe = random_repeat_probe(None, 64, 48, batch=2)
    want, got = analyse(in_memory, probe), analyse(big, probe)
    assert_same_scores(want, got)
    assert want.patterns is not None and got.patterns is not None
    torch.testing.assert_close(got.patterns, want.patterns, atol=1e-6, rtol=0)
    mask = torch.ones(4, 4)
    mask[1, 2] = mask[3, 0] = 0.0  # head masks reach the offloaded blocks too
    with torch.no_grad():
        ref = hf(probe.tokens).logits
        torch.testing.assert_close(big(probe.tokens), ref, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(
            big(probe.tokens, head_mask=mask), in_memory(probe.tokens, head_mask=mask)
        )


@pytest.mark.slow
def test_everything_on_disk_runs_one_layer_at_a_time(cache):
    random_llama(cache / "llama", tie=False)
    in_memory, _ = zoo.load_hf_dir(cache / "llama", "llama")
    largest = max(weight_bytes(b) for b in in_memory.blocks)
    big, _ = zoo.load_dispatched(
        cache / "llama", "llama", "auto", {"cpu": largest + 1000}, cache / "off"
    )
    assert {v for k, v in big.hf_device_map.items() if k != "rotary"} == {"disk"}
    probe = random_repeat_probe(None, 64, 24, batch=1)
    assert_same_scores(analyse(in_memory, probe), analyse(big, probe))


@pytest.mark.slow
@pytest.mark.parametrize("budget", ["two thirds", "one block"])
@pytest.mark.parametrize("exact", [True, [(1, 0)]], ids=["exact", "estimate"])
def test_offloaded_evidence_equals_the_in_memory_evidence(cache, exact, budget):
    """The evidence reads weights outside a forward (the composition scores read every block's
    projections; mean ablation W_O; the random-weights floors copy the embedding's dtype and
    device): on a model whose blocks (with one block's budget, the embedding too) wait on disk
    it loads each block for that read and builds the random models on the CPU, and every card,
    ablation effect and composition equals the in-memory model's, by exact ablation and by the
    estimate; the blocks stay offloaded afterwards."""
    from headlab.heads.composition import composition_scores
    from headlab.heads.evidence import evidence, loss_rows

    random_llama(cache / "llama", tie=False)
    in_memory, _ = zoo.load_hf_dir(cache / "llama", "llama")
    block = max(weight_bytes(b) for b in in_memory.blocks)
    limit = {"two thirds": weight_bytes(in_memory) * 2 // 3, "one block": block + 1000}[budget]
    big, _ = zoo.load_dispatched(cache / "llama", "llama", "auto", {"cpu": limit}, cache / "off")
    assert big.blocks[3].attn.W_O.weight.is_meta  # on disk until a forward or a read needs it
    assert big.embed.weight.is_meta == (budget == "one block")
    probe = random_repeat_probe(None, 64, 24, batch=1)
    want, got = evidence(in_memory, probe, exact=exact), evidence(big, probe, exact=exact)
    a, b = want.to_dict(), got.to_dict()
    assert [c["evidence"] for c in b["heads"]] == [c["evidence"] for c in a["heads"]]
    assert b["composition"] == a["composition"]
    for rows in loss_rows(probe, True).values():
        torch.testing.assert_close(
            got.loss_effect(rows), want.loss_effect(rows), atol=1e-5, rtol=0, equal_nan=True
        )
    for mode, scores in composition_scores(in_memory).scores.items():
        torch.testing.assert_close(composition_scores(big).scores[mode], scores, atol=1e-6, rtol=0)
    assert big.blocks[3].attn.W_O.weight.is_meta


def test_conversion_writes_one_shard_per_block_with_the_models_weights(cache):
    hf = random_llama(cache / "llama", tie=False)
    out = convert_checkpoint(cache / "llama", cache / "converted")
    index = json.loads((out / "model.safetensors.index.json").read_text())
    files = {f for f in index["weight_map"].values()}
    assert len(files) == 4 + 2  # embeddings, 4 blocks, final norm + unembedding
    for l in range(4):  # a block never spans two files
        assert len({f for k, f in index["weight_map"].items() if k.startswith(f"blocks.{l}.")}) == 1
    state = CheckpointState(out)
    hf_state = hf.state_dict()
    assert torch.equal(
        state["blocks.2.attn.W_K.weight"], hf_state["model.layers.2.self_attn.k_proj.weight"]
    )
    assert torch.equal(
        state["blocks.3.mlp.W_gate.weight"], hf_state["model.layers.3.mlp.gate_proj.weight"]
    )
    assert torch.equal(state["unembed.weight"], hf_state["lm_head.weight"])
    assert json.loads((out / "config.json").read_text())["n_kv_heads"] == 2
    assert not [p for p in cache.iterdir() if p.name.startswith(".converted.")]  # no temp left


def test_a_budget_too_small_for_one_layer_is_refused(cache):
    random_llama(cache / "llama", tie=False)
    with pytest.raises(ValueError, match="too small for even one layer"):
        zoo.load_dispatched(cache / "llama", "llama", "auto", {"cpu": "20KB"}, cache / "off")
    with pytest.raises(ValueError, match="give an offload folder"):
        zoo.load_dispatched(cache / "llama", "llama", "auto", {"cpu": "200KB"}, None)
    with pytest.raises(ValueError, match="give sizes such as"):
        zoo.load_dispatched(cache / "llama", "llama", "auto", {"cpu": "lots"}, cache / "off")
    with pytest.raises(ValueError, match="unknown device_map"):
        zoo.load_dispatched(cache / "llama", "llama", "everywhere", None, cache / "off")


@pytest.mark.slow
def test_zoo_load_by_name_spreads_the_default_model(cache):
    """The shipped model through zoo.load(name, max_memory=…): its own checkpoint is resharded,
    the unembedding stays tied to the embedding, and nothing changes in the scores."""
    in_memory, tok = zoo.load("default")
    big, _ = zoo.load(
        "default", max_memory={"cpu": weight_bytes(in_memory) // 2}, offload_folder=cache / "off"
    )
    assert "disk" in big.hf_device_map.values()
    probe = random_repeat_probe(tok, in_memory.config.vocab_size, 40, batch=1)
    assert_same_scores(analyse(in_memory, probe), analyse(big, probe))


def test_pickle_weights_are_never_read(tmp_path):
    (tmp_path / "pytorch_model.bin").write_bytes(b"not read")
    with pytest.raises(ValueError, match="headlab loads no pickle files"):
        CheckpointState(tmp_path)
