"""SmolLM2's composition scores (grouped-query: 9 query heads share 3 K/V heads per layer)
against TransformerLens's formula on explicit matrices built from transformers' own weights
(q_proj, k_proj, v_proj, o_proj and input_layernorm of LlamaForCausalLM, read from the GGUF)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from conftest import require
from headlab import smollm2, zoo
from headlab.heads.composition import composition_scores
from headlab.model import Transformer

LAYERS = 3  # the first layers only: the formula's d × d products are slow in a loop

transformers = pytest.importorskip("transformers")


def tl_score(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(torch.linalg.norm(a @ b) / (torch.linalg.norm(a) * torch.linalg.norm(b)))


@pytest.mark.slow
def test_smollm2_composition_equals_the_formula_on_transformers_weights():
    missing = smollm2.missing_dependencies()
    require(not missing, f"smollm2 needs {missing}: pip install 'headlab[smollm2]'")
    require(zoo.is_fetched("smollm2"), "smollm2 is not fetched: headlab models --fetch smollm2")
    ours, _ = zoo.load("smollm2")
    config = dataclasses.replace(ours.config, n_layers=LAYERS)
    short = Transformer(config)
    short.load_state_dict(ours.state_dict(), strict=False)
    got = composition_scores(short).scores
    hf, _ = smollm2.load_transformers(smollm2.fetch())
    c = hf.config
    h, h_kv, dk = c.num_attention_heads, c.num_key_value_heads, c.head_dim
    OV, QK = [], []
    for layer in hf.model.layers[:LAYERS]:
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
                    want = (tl_score(OV[a][i], QK[b][j]), tl_score(OV[a][i], QK[b][j].T),
                            tl_score(OV[a][i], OV[b][j]))  # fmt: skip
                    have = [float(got[m][a, i, b, j]) for m in ("q", "k", "v")]
                    assert have == pytest.approx(list(want), abs=1e-5), (a, i, b, j)
