"""The head grid's layout (headlab.shapes.layout): which layers are local or global and which K/V
head each query head reads, against the model built from the config and ``repeat_kv``."""

from __future__ import annotations

import pytest
import torch

from headlab.attention import repeat_kv
from headlab.model import ModelConfig, Transformer
from headlab.shapes.layout import attention_layout, layout_lines


def config(**kw) -> ModelConfig:
    base = dict(
        vocab_size=32,
        d_model=24,
        n_layers=4,
        n_heads=6,
        max_len=16,
        norm="none",
        attn_only=True,
        positional="rotary",
    )
    return ModelConfig(**{**base, **kw})


@pytest.mark.parametrize("h_kv", [1, 2, 3, 6, None])
def test_each_query_head_reads_the_kv_head_repeat_kv_gives_it(h_kv):
    layout = attention_layout(config(n_kv_heads=h_kv))
    kv = h_kv or 6
    # K/V heads told apart by their value; repeat_kv expands them to the h query heads
    k = torch.arange(kv, dtype=torch.float32).view(1, kv, 1, 1)  # (B, h_kv, s, d_k)
    expanded = repeat_kv(k, 6 // kv)  # (B, h, s, d_k)
    assert layout["kv_group"] == [int(v) for v in expanded[0, :, 0, 0]]
    assert layout["n_kv_heads"] == kv


def test_local_and_global_layers_are_the_models_own_windows():
    c = config(n_kv_heads=2, sliding_window=5, local_layers=(0, 1, 3))
    layout = attention_layout(c)
    model = Transformer(c)
    built = [block.attn.window for block in model.blocks]
    assert layout["window"] == 5
    assert layout["layer_kinds"] == ["global" if w is None else "local" for w in built]
    assert layout["layer_kinds"] == ["local", "local", "global", "local"]


def test_without_a_window_every_layer_is_global_and_mha_says_nothing():
    layout = attention_layout(config())
    assert layout["window"] is None and set(layout["layer_kinds"]) == {"global"}
    assert layout_lines(layout) == []


def test_the_lines_say_the_sharing_and_the_layers():
    gemma_like = config(
        d_model=32,
        n_heads=4,
        n_kv_heads=1,
        n_layers=6,
        sliding_window=512,
        max_len=1024,
        local_layers=(0, 1, 2, 3, 4),
    )
    lines = layout_lines(attention_layout(gemma_like))
    assert lines[0] == (
        "multi-query attention: 4 query heads per K/V head (K/V head 0 ← query heads 0, 1, 2, 3)"
    )
    assert lines[1] == (
        "local layers (a sliding window of 512 keys): 0, 1, 2, 3, 4; global layers (every key): 5"
    )
    smol_like = layout_lines(attention_layout(config(d_model=18, n_heads=9, n_kv_heads=3)))
    assert smol_like[0].startswith("grouped-query attention: 3 query heads per K/V head")
    assert "K/V head 2 ← query heads 6, 7, 8" in smol_like[0]


def tiny_folder(tmp_path) -> str:
    """A GQA model with local and global layers saved as a model folder (``--model PATH``), with
    a word-level tokenizer."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = ["[UNK]", "a", "b", "c", "d", "e"]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    c = config(n_kv_heads=2, n_layers=3, sliding_window=3, local_layers=(0, 2))
    Transformer(c).save(tmp_path)
    tok.save(str(tmp_path / "tokenizer.json"))
    return str(tmp_path)


def test_heads_cli_says_the_layout_and_json_carries_it(tmp_path):
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    folder = tiny_folder(tmp_path)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "src")}
    base = [
        sys.executable,
        "-m",
        "headlab.cli",
        "heads",
        "--model",
        folder,
        "--text",
        "a b c d e a b c",
    ]
    done = subprocess.run(base, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    out = " ".join(done.stdout.split())
    assert "grouped-query attention: 3 query heads per K/V head" in out
    assert "local layers (a sliding window of 3 keys): 0, 2; global layers (every key): 1" in out
    done = subprocess.run([*base, "--json"], env=env, capture_output=True, text=True, timeout=300)
    body = json.loads(done.stdout)
    assert body["layer_kinds"] == ["local", "global", "local"]
    assert (body["window"], body["kv_group"]) == (3, [0, 0, 0, 1, 1, 1])
    # the offline file carries the same layout for its grid
    page = tmp_path / "heads.html"
    done = subprocess.run(
        [*base, "--html", str(page)], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert '"layer_kinds":["local","global","local"]' in page.read_text()  # compact JSON


def test_notebook_grid_carries_the_layout():
    from headlab import heads
    from headlab.measure import build_probe
    from headlab.show import head_grid

    c = config(n_kv_heads=3, sliding_window=4, local_layers=(1,))
    model = Transformer(c).eval()
    probe = build_probe("random-repeat", None, 12, c.vocab_size, seed=0)
    report = heads.analyse(model, probe)
    part = head_grid(report, "tiny", config=c).parts[0]["report"]
    assert part["layer_kinds"] == ["global", "local", "global", "global"]
    assert (part["window"], part["kv_group"]) == (4, [0, 0, 1, 1, 2, 2])
    assert "layer_kinds" not in head_grid(report, "tiny").parts[0]["report"]
