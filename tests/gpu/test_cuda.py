"""The scores' PyTorch definition on a CUDA GPU: the same numbers as on the CPU.

Run where torch sees a GPU: ``make test-gpu`` (``pytest -m gpu tests/gpu``). ``make test``
leaves these out (deselected by their ``gpu`` mark): the machines it runs on have no GPU.

Each layer's weights are computed once on the CPU, then scored on the GPU by the definition
and on the CPU by the compiled loops (and by the definition): the module's every score within
1e-6, every label equal. Then whole analyses run on the GPU, the model and its forward there
too: their labels equal the CPU's wherever the deciding score is more than 1e-3 from its
threshold (a GPU's matrix products round differently).
"""

from __future__ import annotations

import pytest
import torch

from headlab import zoo
from headlab.heads import analyse, fast
from headlab.heads.scores import pattern_scores
from headlab.heads.targets import build_targets
from headlab.measure import build_probe, random_repeat_probe, reduce_patterns, text_probe

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="torch sees no CUDA GPU"),
]
CUDA = torch.device("cuda")


def probes(model, tokenizer):
    cfg = model.config
    yield build_probe("repeat", tokenizer, cfg.max_len, cfg.vocab_size)
    yield build_probe("random-repeat", tokenizer, cfg.max_len, cfg.vocab_size, seed=5)
    yield text_probe(tokenizer, "Bells rang in the tower, and the bells rang again at noon.", 64)


def layer_weights(model, probe) -> list[torch.Tensor]:
    out: list[torch.Tensor] = []
    reduce_patterns(model, probe.tokens, lambda layer, w: out.append(w.float().clone()), None)
    return out


@pytest.mark.parametrize("name", ["default"])
def test_every_score_on_the_gpu_equals_the_cpus(name: str) -> None:
    model, tokenizer = zoo.load(name)
    for probe in probes(model, tokenizer):
        targets = build_targets(probe, causal=bool(model.config.causal))
        for layer, w in enumerate(layer_weights(model, probe)):
            assert fast.usable(w)  # the CPU side runs the compiled loops where they load
            cpu, cpu_offsets, cpu_rests = pattern_scores(w, targets)
            gpu, gpu_offsets, gpu_rests = pattern_scores(w.to(CUDA), targets)
            assert cpu.keys() == gpu.keys()
            for kind in cpu:
                torch.testing.assert_close(
                    gpu[kind].cpu(), cpu[kind], atol=1e-6, rtol=0, msg=f"{layer} {kind}"
                )
            assert torch.equal(gpu_offsets.cpu(), cpu_offsets)
            for kind in cpu_rests:
                torch.testing.assert_close(
                    gpu_rests[kind].cpu(), cpu_rests[kind], atol=1e-6, rtol=0
                )


def close_to_a_line(score) -> bool:
    from headlab.heads.labels import THRESHOLDS

    return any(abs(v - THRESHOLDS[k]) < 1e-3 for k, v in score.scores.items() if k in THRESHOLDS)


@pytest.mark.parametrize("name", ["default"])
def test_a_whole_analysis_on_the_gpu_labels_as_on_the_cpu(name: str) -> None:
    model, tokenizer = zoo.load(name)
    gpu_model, _ = zoo.load(name)
    gpu_model.to(CUDA)
    for probe in probes(model, tokenizer):
        cpu = analyse(model, probe)
        gpu = analyse(gpu_model, probe)
        for a, b in zip(cpu.heads + cpu.averaged, gpu.heads + gpu.averaged, strict=True):
            assert a.scores == pytest.approx(b.scores, abs=1e-4), (a.layer, a.head)
            if not close_to_a_line(a):
                assert a.label == b.label, (a.layer, a.head)


def test_a_random_llama_with_grouped_queries_scores_alike_on_both() -> None:
    """A random SmolLM2-shaped model (30 layers, 9 query heads on 3 K/V heads; transformers
    builds it, no download) converted to headlab: the definition on the GPU equals the CPU."""
    transformers = pytest.importorskip("transformers")
    from headlab.convert import from_hf

    config = transformers.LlamaConfig(
        vocab_size=512,
        hidden_size=576,
        num_hidden_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
        intermediate_size=1536,
        max_position_embeddings=256,
    )
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    model = from_hf(transformers.LlamaForCausalLM(config).eval())
    probe = random_repeat_probe(None, 512, 128, length=30, batch=2, seed=1)
    targets = build_targets(probe, causal=True, rare_words=False)
    for layer, w in enumerate(layer_weights(model, probe)):
        cpu = pattern_scores(w, targets)[0]
        gpu = pattern_scores(w.to(CUDA), targets)[0]
        for kind in cpu:
            torch.testing.assert_close(
                gpu[kind].cpu(), cpu[kind], atol=1e-6, rtol=0, msg=f"{layer} {kind}"
            )
