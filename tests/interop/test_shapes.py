"""The shape calculator against real forward passes, PyTorch's FLOP counter and HF modules."""

from __future__ import annotations

import importlib.util
import json
import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch.utils.flop_counter import FlopCounterMode
from typer.testing import CliRunner

from conftest import require
from headlab.attention import MultiHeadAttention, valid_head_counts
from headlab.cli import app
from headlab.shapes import (
    DTYPES,
    MAX_ELEMENTS,
    PRESETS,
    ShapeReport,
    format_bytes,
    nearest_divisors,
    table_shapes,
    trace_shapes,
)
from headlab.trace import Trace

runner = CliRunner()


@pytest.fixture(autouse=True)
def _one_thread():
    """Tiny CPU passes: a second intra-op thread only adds synchronisation on a busy machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@st.composite
def configs(draw: st.DrawFn) -> dict:
    """Small valid layers: h_kv divides h, h divides d_model; with or without a cache."""
    h = draw(st.integers(1, 6))
    h_kv = draw(st.sampled_from(valid_head_counts(h)))
    d_k = draw(st.integers(1, 6))
    return {
        "d_model": h * d_k,
        "n_heads": h,
        "n_kv_heads": draw(st.sampled_from([h_kv, None])) if h_kv == h else h_kv,
        "seq_len": draw(st.integers(1, 6)),
        "batch": draw(st.integers(1, 3)),
        "bias": draw(st.booleans()),
        "dtype": draw(st.sampled_from(["float32", "float64", "bf16"])),
        "cache_len": draw(st.sampled_from([0, 0, 1, 3])),
    }


@st.composite
def head_width_configs(draw: st.DrawFn) -> dict:
    """Small valid layers with a given head width d_k, which need not be d_model / h (Gemma 3:
    256 at 640 / 4): d_model any width, h any count, h_kv dividing h."""
    h = draw(st.integers(1, 6))
    return {
        "d_model": draw(st.integers(1, 12)),
        "n_heads": h,
        "n_kv_heads": draw(st.sampled_from([None, *valid_head_counts(h)])),
        "seq_len": draw(st.integers(1, 5)),
        "batch": draw(st.integers(1, 2)),
        "bias": draw(st.booleans()),
        "dtype": draw(st.sampled_from(["float32", "float64"])),
        "cache_len": draw(st.sampled_from([0, 0, 2])),
        "d_k": draw(st.integers(1, 9)),
    }


def real_forward(cfg: dict, flops: bool = False) -> tuple[Trace, MultiHeadAttention, int]:
    """Run the layer on CPU with real data and a really filled cache: (trace, module, FLOPs)."""
    dtype = DTYPES[cfg["dtype"]]
    m = MultiHeadAttention(
        cfg["d_model"], cfg["n_heads"], cfg["n_kv_heads"], bias=cfg["bias"], d_k=cfg.get("d_k")
    )
    m = m.to(dtype)
    B, n, d = cfg["batch"], cfg["seq_len"], cfg["d_model"]
    cache = None
    if cfg["cache_len"]:
        cache = m.new_cache(B, cfg["cache_len"] + n)
        m(torch.randn(B, cfg["cache_len"], d, dtype=dtype), cache=cache)
    trace = Trace()
    m(torch.randn(B, n, d, dtype=dtype), cache=cache, causal=True, trace=trace)
    counted = 0
    if flops:  # counted on an untraced explicit pass: the trace computes the scores twice
        if cache is not None:
            cache.length = cfg["cache_len"]
        with FlopCounterMode(display=False) as counter:
            m(torch.randn(B, n, d, dtype=dtype), cache=cache, impl="explicit")
        counted = counter.get_total_flops()
    return trace, m, counted


def evaluate(symbolic: str, sizes: dict[str, int]) -> tuple[int, ...]:
    """'B×h×n×d_k' → (B, h, n, d_k) with the sizes substituted; '·' multiplies."""
    return tuple(math.prod(sizes[f] for f in dim.split("·")) for dim in symbolic.split("×"))


@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(configs())
@pytest.mark.slow
def test_report_matches_a_real_forward_pass(cfg):
    report = trace_shapes(**cfg)
    trace, module, _ = real_forward(cfg)
    assert report.valid and report.problems == ()
    # every stage, in order, with the shape and dtype the real CPU pass recorded
    assert [s.name for s in report.stages] == list(trace)
    for stage in report.stages:
        real = trace[stage.name]
        assert stage.shape == tuple(real.shape), stage.name
        assert stage.dtype == str(real.dtype).removeprefix("torch.")
        assert stage.elements == real.numel()
        assert stage.bytes == real.numel() * real.element_size()
    # parameters: the real module's numel, and the closed form
    assert report.params["total"] == sum(p.numel() for p in module.parameters())
    for pt in report.param_tensors:
        assert pt.count == dict(module.named_parameters())[pt.name].numel()
    assert report.shape_preserving
    assert report.stage("out").shape == report.stage("x").shape
    # the closed form the command line answers with gives every figure of this report
    assert table_shapes(**cfg).differences(report) == []


# 500 draws: the path through trace_shapes and the formulas is fixed by whether h_kv = h, the
# bias, the dtype and whether there is a cache (under 50 combinations); the sizes only scale the
# numbers, so each combination is still drawn about ten times, at sizes from 1 up
@settings(max_examples=500, deadline=None)
@given(configs())
@pytest.mark.slow
def test_closed_form_formulas_agree_with_the_trace(cfg):
    report = trace_shapes(**cfg)
    sizes = report.config.sizes()
    B, n, s, d, h, h_kv, d_k = (sizes[k] for k in ("B", "n", "s", "d_model", "h", "h_kv", "d_k"))
    for stage in report.stages:
        assert evaluate(stage.symbolic, sizes) == stage.shape, stage.name
    for pt in report.param_tensors:
        assert evaluate(pt.symbolic, sizes) == pt.shape, pt.name
    kv_width = h_kv * d_k
    expected = 2 * d * d + 2 * d * kv_width + cfg["bias"] * (2 * d + 2 * kv_width)
    assert report.params["total"] == expected
    assert report.params["W_K"] == report.params["W_V"] == d * kv_width + cfg["bias"] * kv_width
    if h_kv == h and cfg["bias"]:
        assert report.params["total"] == 4 * d * d + 4 * d
    item = torch.tensor([], dtype=DTYPES[cfg["dtype"]]).element_size()
    assert report.memory["n2_bytes"] == 2 * B * h * n * s * item
    assert report.kv_cache["bytes"] == 2 * B * s * h_kv * d_k * item
    assert report.kv_cache["mha_bytes"] == 2 * B * s * h * d_k * item
    assert report.kv_cache["ratio_vs_mha"] == h / h_kv
    n2 = 4 * B * h * n * s * d_k
    assert report.flops["n2"] == n2
    assert report.flops["total"] == 2 * B * n * (2 * d * d + 2 * d * kv_width) + n2
    assert ("h_kv" in "".join(s.symbolic for s in report.stages)) == (h_kv != h)
    assert ("s" in "".join(s.symbolic for s in report.stages)) == (cfg["cache_len"] > 0)


@st.composite
def any_sizes(draw: st.DrawFn) -> dict:
    """Sizes valid or not: widths that heads do not split, K/V heads that do not divide h,
    given head widths, every dtype name, caches; now and then a size past the limits."""
    big = draw(st.sampled_from([1, 1, 1, 1, 2**20]))
    return {
        "d_model": draw(st.integers(1, 40)) * big,
        "n_heads": draw(st.integers(1, 9)),
        "n_kv_heads": draw(st.sampled_from([None, 1, 2, 3, 4])),
        "seq_len": draw(st.integers(1, 7)) * draw(st.sampled_from([1, 1, 2**24])),
        "batch": draw(st.integers(1, 3)),
        "bias": draw(st.booleans()),
        "dtype": draw(st.sampled_from(sorted(DTYPES))),
        "cache_len": draw(st.sampled_from([0, 0, 1, 5])),
        "d_k": draw(st.sampled_from([None, None, 1, 3, 16])),
    }


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(configs(), head_width_configs(), any_sizes()))
@pytest.mark.slow
def test_the_table_gives_the_traced_report_field_for_field(cfg):
    """`headlab shapes` answers from table_shapes (no torch); trace_shapes reads the same report
    off the real layer on meta. Every key of to_dict but ``source`` must be equal, for valid and
    refused sizes alike."""
    table, traced = table_shapes(**cfg), trace_shapes(**cfg)
    assert (table.source, traced.source) == ("table", "trace")
    assert table.differences(traced) == []
    assert {**table.to_dict(), "source": "trace"} == traced.to_dict()


def test_itemsizes_are_torchs():
    from headlab.shapes.config import ITEMSIZE

    torch_sizes = {name: torch.empty(0, dtype=DTYPES[name]).element_size() for name in ITEMSIZE}
    assert torch_sizes == ITEMSIZE
    assert set(ITEMSIZE) == {str(d).removeprefix("torch.") for d in DTYPES.values()}


@settings(max_examples=150, deadline=None)
@given(configs())
@pytest.mark.slow
def test_flops_equal_pytorchs_flop_counter_and_cache_bytes_the_real_cache(cfg):
    report = trace_shapes(**cfg)
    _, module, counted = real_forward(cfg, flops=True)
    assert report.flops["total"] == counted
    s = cfg["cache_len"] + cfg["seq_len"]
    assert report.kv_cache["bytes"] == module.new_cache(cfg["batch"], s).nbytes


@settings(max_examples=200, deadline=None)
@given(head_width_configs())
@pytest.mark.slow
def test_a_given_head_width_matches_the_real_module_and_pytorchs_flop_counter(cfg):
    report = trace_shapes(**cfg)
    trace, module, counted = real_forward(cfg, flops=True)
    assert report.valid and report.problems == (), report.problems
    assert module.d_k == cfg["d_k"] == report.config.sizes()["d_k"]
    assert [s.name for s in report.stages] == list(trace)
    for stage in report.stages:
        assert stage.shape == tuple(trace[stage.name].shape), stage.name
        assert evaluate(stage.symbolic, report.config.sizes()) == stage.shape, stage.name
    assert report.params["total"] == sum(p.numel() for p in module.parameters())
    assert report.flops["total"] == counted
    s = cfg["cache_len"] + cfg["seq_len"]
    assert report.kv_cache["bytes"] == module.new_cache(cfg["batch"], s).nbytes
    assert report.shape_preserving and report.stage("out").shape == report.stage("x").shape


@settings(max_examples=100, deadline=None)
@given(configs())
def test_a_head_width_of_d_model_over_h_changes_nothing_but_the_config(cfg):
    plain = trace_shapes(**cfg).to_dict()
    given_width = trace_shapes(**cfg, d_k=cfg["d_model"] // cfg["n_heads"]).to_dict()
    assert plain["config"].pop("d_k") is None
    assert given_width["config"].pop("d_k") == cfg["d_model"] // cfg["n_heads"]
    assert plain == given_width


def test_gemma3_head_width_is_accepted_and_said_in_the_verdict():
    report = trace_shapes(640, 4, 8, 1, n_kv_heads=1, bias=False, d_k=256)
    assert report.valid and report.stage("q_proj").shape == (1, 8, 1024)
    assert "h·d_k = 1,024 back to d_model = 640" in report.verdict
    assert "4·d_model²" not in report.summary()[0]  # that closed form needs h·d_k = d_model
    # without d_k the same sizes are fine too (640 / 4 = 160), and with an indivisible h only
    # a given head width makes the layer valid
    assert not trace_shapes(640, 3, 8, 1).valid and trace_shapes(640, 3, 8, 1, d_k=256).valid
    bad = trace_shapes(640, 4, 8, 1, n_kv_heads=3, d_k=256)
    assert "n_heads=4 is not divisible by n_kv_heads=3" in bad.problems[0]
    assert trace_shapes(640, 4, 8, 1, d_k=0).problems == (
        "d_k must be a positive integer or None (then d_model // n_heads), got 0",
    )


@pytest.mark.parametrize(("h_kv", "d_k"), [(1, 256), (3, None), (None, 8)])
def test_kv_figures_numbers_are_real_caches_mha_mqa_and_streaming(h_kv, d_k):
    """MHA and MQA at the same size, and a StreamingLLM cache of sinks + window positions."""
    from headlab.model.streaming import SinkCache

    B, n, cached = 2, 5, 7
    report = trace_shapes(
        576 if h_kv == 3 else 640,
        9 if h_kv == 3 else 4,
        n,
        B,
        n_kv_heads=h_kv,
        cache_len=cached,
        d_k=d_k,
        dtype="bf16",
    )
    kv = report.kv_cache
    c = report.config
    width = c.sizes()["d_k"]
    for heads, key in ((c.n_heads, "mha_bytes"), (1, "mqa_bytes"), (c.h_kv, "bytes")):
        layer = MultiHeadAttention(c.d_model, c.n_heads, heads, d_k=d_k).to(torch.bfloat16)
        assert kv[key] == layer.new_cache(B, cached + n).nbytes, key
    assert kv["mqa_bytes_per_token"] * c.h_kv == kv["bytes_per_token"]
    for sinks, window in ((0, 3), (4, 16)):
        real = SinkCache(B, c.h_kv, width, sinks, window, torch.bfloat16)
        assert kv["sink_bytes_per_token"] * B * (sinks + window) == real.nbytes


def test_huge_config_is_answered_without_allocating_and_counts_like_pytorch():
    report = trace_shapes(12288, 96, 131072, 64)
    assert report.valid
    assert report.stage("scores").shape == (64, 96, 131072, 131072)
    assert report.stage("scores").bytes == 64 * 96 * 131072**2 * 4
    assert any("2**40" in w and "scores" in w for w in report.warnings)
    with torch.device("meta"):
        m = MultiHeadAttention(12288, 96)
        with FlopCounterMode(display=False) as counter:
            m(torch.empty(64, 131072, 12288), impl="explicit")
    assert report.flops["total"] == counter.get_total_flops()
    assert report.flops["n2_share"] > 0.8  # at n = 131072 the n² products dominate


def test_to_dict_is_json_and_has_the_documented_keys():
    for report in (trace_shapes(64, 4, 5, 2, n_kv_heads=2, cache_len=3), trace_shapes(64, 5, 5, 2)):
        data = json.loads(json.dumps(report.to_dict()))
        for key in ("valid", "problems", "stages", "params", "flops", "kv_cache_bytes", "memory"):
            assert key in data
        assert set(data["params"]) >= {"W_Q", "W_K", "W_V", "W_O", "total"}
    good = trace_shapes(64, 4, 5, 2, n_kv_heads=2, cache_len=3).to_dict()
    assert good["stages"][0] == {**good["stages"][0], "name": "x", "shape": [2, 5, 64]}
    assert [s["symbolic"] for s in good["stages"] if s["name"] == "scores"] == ["B×h×n×s"]
    assert good["config"]["kind"] == "GQA" and good["config"]["dtype"] == "float32"
    assert good["kv_cache_bytes"] == 2 * 2 * 8 * 2 * 16 * 4


def test_report_is_frozen_and_dtype_aliases_are_normalised():
    report = trace_shapes(32, 4, 3, 1, dtype="bf16")
    assert isinstance(report, ShapeReport)
    assert report.config.dtype == "bfloat16" and report.stage("q").bytes == 3 * 32 * 2
    with pytest.raises(AttributeError):
        report.valid = False  # type: ignore[misc]


# ---- presets: published attention parameter counts ---------------------------------------

# per-layer attention parameters from the published shapes: 4·d² + 4·d with biases (GPT-2,
# BERT, GPT-3), 4·d² without (Transformer base, Llama-2), and GQA's 2·d² + 2·d·(8·128).
PUBLISHED_PER_LAYER = {
    "transformer-base": 4 * 512**2,
    "bert-base": 2_362_368,
    "gpt2-small": 2_362_368,
    "gpt2-medium": 4 * 1024**2 + 4 * 1024,
    "gpt2-large": 4 * 1280**2 + 4 * 1280,
    "gpt2-xl": 4 * 1600**2 + 4 * 1600,
    "llama-2-7b": 67_108_864,
    "llama-3-8b": 41_943_040,
    "mistral-7b": 41_943_040,
    "gpt3-175b": 604_028_928,
    # GQA: 2·576² + 2·576·(3·64); Gemma 3: 2·640·(4·256) + 2·640·(1·256), no biases
    "smollm2-135m": 2 * 576**2 + 2 * 576 * 192,
    "gemma-3-270m": 2 * 640 * 1024 + 2 * 640 * 256,
}


@pytest.mark.parametrize("name", list(PRESETS))
def test_presets_reproduce_published_attention_parameters(name):
    preset = PRESETS[name]
    report = preset.report(seq_len=16)
    assert report.valid, report.problems
    assert report.params["total"] == PUBLISHED_PER_LAYER[name]
    assert report.stage("x").shape == (1, 16, preset.d_model)


def test_preset_defaults_to_its_context_and_llama3_has_small_kv():
    report = PRESETS["llama-3-8b"].report()
    assert report.stage("x").shape == (1, 8192, 4096)
    assert report.config.kind == "GQA"
    assert report.stage("k_proj").shape == (1, 8192, 1024)
    assert report.kv_cache["ratio_vs_mha"] == 4
    # GPT-3: 96 layers of attention are about a third of the 175 B parameters
    gpt3 = PRESETS["gpt3-175b"]
    assert gpt3.report(seq_len=1).params["total"] * gpt3.n_layers == 57_986_777_088


def hf_attention_params(name: str) -> int:
    """Attention parameters of one layer of the Hugging Face (or torch) implementation."""
    from transformers import BertConfig, GPT2Config, LlamaConfig, MistralConfig
    from transformers.models.bert.modeling_bert import BertSelfAttention, BertSelfOutput
    from transformers.models.gpt2.modeling_gpt2 import GPT2Attention
    from transformers.models.llama.modeling_llama import LlamaAttention
    from transformers.models.mistral.modeling_mistral import MistralAttention

    p = PRESETS[name]
    if name == "transformer-base":
        modules = [torch.nn.MultiheadAttention(p.d_model, p.n_heads, bias=False)]
    elif name == "bert-base":
        cfg = BertConfig(hidden_size=p.d_model, num_attention_heads=p.n_heads)
        modules = [BertSelfAttention(cfg), BertSelfOutput(cfg).dense]
    elif name.startswith(("gpt2", "gpt3")):
        modules = [GPT2Attention(GPT2Config(n_embd=p.d_model, n_head=p.n_heads), layer_idx=0)]
    elif name == "gemma-3-270m":  # the four projections (its q_norm/k_norm are not in W_*)
        from transformers import Gemma3TextConfig
        from transformers.models.gemma3.modeling_gemma3 import Gemma3Attention

        cfg = Gemma3TextConfig(
            hidden_size=p.d_model,
            num_attention_heads=p.n_heads,
            num_key_value_heads=p.n_kv_heads,
            head_dim=p.d_k,
        )
        a = Gemma3Attention(cfg, layer_idx=0)
        modules = [a.q_proj, a.k_proj, a.v_proj, a.o_proj]
    else:
        kind = LlamaConfig if name.startswith(("llama", "smollm2")) else MistralConfig
        cls = LlamaAttention if name.startswith(("llama", "smollm2")) else MistralAttention
        cfg = kind(
            hidden_size=p.d_model,
            num_attention_heads=p.n_heads,
            num_key_value_heads=p.n_kv_heads or p.n_heads,
        )
        modules = [cls(cfg, layer_idx=0)]
    return sum(t.numel() for m in modules for t in m.parameters())


@pytest.mark.slow
def test_presets_match_the_hugging_face_implementations():
    require(importlib.util.find_spec("transformers") is not None, "transformers not installed")
    with torch.device("meta"):
        for name in PRESETS:
            report = PRESETS[name].report(seq_len=4)
            assert report.params["total"] == hf_attention_params(name), name


# ---- invalid configurations: answered, with what would be valid --------------------------


@pytest.mark.parametrize(
    ("kwargs", "needles"),
    [
        ({"n_heads": 7}, ["d_model=512 is not divisible by n_heads=7", "4 or 8", "1, 2, 4, 8"]),
        ({"n_heads": 600}, ["n_heads=600", "nearest valid head counts: 512"]),
        ({"n_kv_heads": 3}, ["n_heads=8 is not divisible by n_kv_heads=3", "2 or 4"]),
        ({"n_kv_heads": 16}, ["n_kv_heads=16", "nearest valid K/V head counts: 8"]),
        ({"d_model": 0}, ["d_model must be a positive integer, got 0"]),
        ({"n_heads": -2}, ["n_heads must be a positive integer, got -2"]),
        ({"seq_len": 0}, ["seq_len must be a positive integer"]),
        ({"batch": -1}, ["batch must be a positive integer, got -1"]),
        ({"n_kv_heads": 0}, ["n_kv_heads must be a positive integer or None"]),
        ({"cache_len": -5}, ["cache_len must be an integer >= 0, got -5"]),
        ({"dtype": "int8"}, ["unknown dtype 'int8'", "bfloat16"]),
        ({"dtype": None}, ["unknown dtype None"]),
        ({"bias": "yes"}, ["bias must be True or False, got 'yes'"]),
        ({"seq_len": 2.5}, ["seq_len must be a positive integer, got 2.5"]),
        ({"batch": True}, ["batch must be a positive integer, got True"]),
        ({"seq_len": 2**26, "batch": 64}, ["over the limit of 2**50"]),
        ({"d_model": 2**26, "n_heads": 1}, ["over the limit of 2**50"]),
    ],
)
def test_invalid_configs_are_reported_with_what_is_valid(kwargs, needles):
    args = {"d_model": 512, "n_heads": 8, "seq_len": 10, "batch": 2, **kwargs}
    report = trace_shapes(**args)
    assert not report.valid
    text = " ".join(report.problems)
    for needle in needles:
        assert needle in text
    data = report.to_dict()
    assert data["valid"] is False and data["stages"] == [] and data["params"]["total"] == 0


def test_both_divisibility_problems_at_once_and_huge_d_model_answers_quickly():
    report = trace_shapes(12, 5, 4, 1, n_kv_heads=2)
    assert len(report.problems) == 2
    report = trace_shapes(2**25 - 1, 2, 1, 1)  # 31·601·1801: odd, 2 heads do not fit
    assert "nearest valid head counts: 1 or 31" in report.problems[0]
    assert MAX_ELEMENTS == 2**50


def test_divisors_and_nearest_match_brute_force():
    for d in range(1, 400):
        assert valid_head_counts(d) == [h for h in range(1, d + 1) if d % h == 0]
    assert nearest_divisors(7, 512) == [4, 8]
    assert nearest_divisors(1000, 512) == [512]
    assert nearest_divisors(3, 12) == [2, 4]
    assert format_bytes(40960) == "40.0 KiB" and format_bytes(12) == "12 B"


# ---- command line ------------------------------------------------------------------------


def test_cli_prints_table_parameters_flops_cache_and_verdict():
    result = runner.invoke(
        app,
        [
            "shapes",
            "--d-model",
            "512",
            "--heads",
            "8",
            "--seq",
            "10",
            "--batch",
            "2",
            "--kv-heads",
            "2",
            "--dtype",
            "bf16",
            "--cache-len",
            "5",
        ],
    )
    assert result.exit_code == 0, result.output
    out = result.output
    for needle in ("B×h_kv×s×d_k", "2×8×10×15", "W_K.weight", "128×512", "total 656,640"):
        assert needle in out
    assert "KV cache" in out and "4× as much" in out and "shape-preserving" in out


def test_cli_json_matches_the_library():
    result = runner.invoke(app, ["shapes", "--preset", "gpt2-small", "--seq", "8", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data == json.loads(json.dumps(table_shapes(768, 12, 8, 1).to_dict()))
    assert data["params"]["total"] == 2_362_368 and data["source"] == "table"
    traced = runner.invoke(
        app, ["shapes", "--preset", "gpt2-small", "--seq", "8", "--json", "--trace"]
    )
    assert traced.exit_code == 0, traced.output
    want = json.loads(json.dumps(trace_shapes(768, 12, 8, 1).to_dict()))
    assert json.loads(traced.stdout) == want and want["source"] == "trace"
    assert {**want, "source": "table"} == data


def test_cli_says_where_the_report_comes_from():
    args = ["shapes", "--d-model", "64", "--heads", "4", "--kv-heads", "2", "--cache-len", "2"]
    table = runner.invoke(app, args)
    traced = runner.invoke(app, [*args, "--trace"])
    assert table.exit_code == traced.exit_code == 0, table.output + traced.output
    assert "from the shape table" in " ".join(table.output.split())
    assert "read off the real layer run on the meta device" in " ".join(traced.output.split())
    # apart from that line, the two print the same report
    assert table.output.split("source:")[0] == traced.output.split("source:")[0]


def test_cli_trace_refuses_a_table_that_disagrees_with_the_layer(monkeypatch):
    """If the closed form ever drifts from the layer, --trace says so and exits 1."""
    import dataclasses

    import headlab.shapes as shapes

    real = shapes.trace_shapes

    def wider(*args, **kwargs):
        report = real(*args, **kwargs)
        stages = list(report.stages)
        stages[-1] = dataclasses.replace(stages[-1], shape=(1, 10, 65))
        return dataclasses.replace(report, stages=tuple(stages))

    monkeypatch.setattr(shapes, "trace_shapes", wider)
    result = runner.invoke(app, ["shapes", "--d-model", "64", "--heads", "4", "--trace"])
    assert result.exit_code == 1
    assert "disagree on stages" in " ".join(result.output.split())
    assert "Traceback" not in result.output


def test_cli_preset_defaults_and_overrides():
    result = runner.invoke(app, ["shapes", "--preset", "llama-3-8b", "--kv-heads", "1", "--json"])
    data = json.loads(result.stdout)
    assert data["config"]["kind"] == "MQA" and data["config"]["seq_len"] == 8192
    assert data["config"]["bias"] is False
    result = runner.invoke(app, ["shapes", "--preset", "gpt2-small", "--no-bias", "--json"])
    assert json.loads(result.stdout)["params"]["total"] == 4 * 768**2


def test_cli_head_width_and_the_gemma3_preset():
    gemma = runner.invoke(app, ["shapes", "--preset", "gemma-3-270m", "--seq", "8", "--json"])
    assert gemma.exit_code == 0, gemma.output
    want = table_shapes(640, 4, 8, 1, n_kv_heads=1, bias=False, d_k=256).to_dict()
    assert json.loads(gemma.stdout) == json.loads(json.dumps(want))
    for flag in ("--d-k", "--head-dim"):
        args = ["shapes", "--d-model", "640", "--heads", "4", "--kv-heads", "1", flag, "256"]
        same = runner.invoke(app, [*args, "--no-bias", "--seq", "8", "--json"])
        assert json.loads(same.stdout) == json.loads(gemma.stdout)
    # the preset's d_k gives way to one asked for; without it the sizes keep d_model // h
    wide = json.loads(
        runner.invoke(
            app, ["shapes", "--preset", "gemma-3-270m", "--d-k", "64", "--seq", "8", "--json"]
        ).stdout
    )
    assert wide["config"]["sizes"]["d_k"] == 64
    plain = json.loads(runner.invoke(app, ["shapes", "--json"]).stdout)
    assert plain["config"]["d_k"] is None and plain["config"]["sizes"]["d_k"] == 64


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--heads", "7"], "nearest valid head counts: 4 or 8"),
        (["--kv-heads", "3"], "n_heads=8 is not divisible by n_kv_heads=3"),
        # sizes out of the options' ranges (the API schema's) are refused before any tracing
        (["--d-model", "0"], "'--d-model': Input should be greater than or equal to 1"),
        (["--seq", "-3"], "'--seq': Input should be greater than or equal to 1"),
        (["--batch", "0"], "'--batch': Input should be greater than or equal to 1"),
        (["--cache-len", "-1"], "'--cache-len': Input should be greater than or equal to 0"),
        (["--seq", "100000000"], "'--seq': Input should be less than or equal to 16777216"),
        (["--dtype", "int4"], "unknown dtype 'int4'"),
        (["--seq", "16777216", "--batch", "65536"], "over the limit of 2**50"),
        (
            ["--d-model", "1048576", "--heads", "1", "--seq", "2048", "--batch", "2048"],
            "over the limit of 2**62",
        ),
        (["--preset", "gpt5"], "unknown preset 'gpt5'; valid presets: transformer-base"),
        (["--d-k", "0"], "'--d-k' / '--head-dim'"),
        (["--heads", "3", "--kv-heads", "2", "--d-k", "8"], "n_heads=3 is not divisible by n_k"),
        (["--heads", "many"], "Invalid value"),
    ],
)
def test_cli_invalid_input_exits_2_with_the_message(args, needle):
    result = runner.invoke(app, ["shapes", *args])
    assert result.exit_code == 2
    assert needle in result.output.replace("\n", " ") or needle in result.stderr.replace("\n", " ")
    assert "Traceback" not in result.output and not isinstance(result.exception, ValueError)


def test_cli_invalid_json_still_prints_the_report():
    result = runner.invoke(app, ["shapes", "--heads", "7", "--json"])
    assert result.exit_code == 2
    data = json.loads(result.stdout)
    assert data["valid"] is False and "not divisible" in data["problems"][0]
